"""Initializers written to an ONNX external-data file as a big model's graph is built, so its
weights are never all in memory (benchmarks/big_model.py, benchmarks/generate.py)."""
from __future__ import annotations

from pathlib import Path
from types import TracebackType

import numpy as np
import onnx

INLINE_BYTES = 1024   # smaller initializers (shapes, scalars) stay in the model file


class ExternalData:
    """`with ExternalData(path) as ext:` then `ext.store(array, name)` for each initializer: a
    TensorProto in the model for a small array, else one pointing at the bytes appended to
    `path` (little-endian). `bytes` and `parameters` (float32 elements) count what went out."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.bytes = 0
        self.parameters = 0
        self._file = None

    def __enter__(self) -> ExternalData:
        self._file = open(self.path, "wb")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._file.close()

    def store(self, array: np.ndarray, name: str) -> onnx.TensorProto:
        array = np.ascontiguousarray(array)
        self.parameters += array.size if array.dtype == np.float32 else 0
        if array.nbytes < INLINE_BYTES:
            return onnx.numpy_helper.from_array(array, name)
        tensor = onnx.TensorProto(name=name, dims=array.shape,
                                  data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.bytes)), ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self._file.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
        self.bytes += array.nbytes
        return tensor
