"""Tensor types and weights shared by every IR level.

Shapes are static tuples of ints: symbolic dimensions are resolved at import (`--shape`), so
every later stage sees concrete numbers. Weights carry their bytes so IR nodes stay hashable
and comparable; `array()` gives a read-only numpy view. A big model's weights are not held in
memory: their `data` is an `aicf_run.weights.Lazy` (a range of the model's external-data file,
or a `Joined` of such weights) that is read when a pass needs the values and streamed into the
bundle otherwise, so a compile never holds two copies of a 4 GB model.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from aicf_run.convert import from_bf16_bytes, to_bf16_bytes
from aicf_run.weights import CHUNK_BYTES, Lazy, data_sha256
from aicfc.ir.shared_weights import remember

# IR dtype name -> numpy dtype. The IR spells dtypes short, as MLIR does. bfloat16 has no
# numpy dtype: it is evaluated as float32 (`np_dtype`) and stored as the top 16 bits of one.
DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(np.float32),
    "i64": np.dtype(np.int64),
    "i32": np.dtype(np.int32),
    "bool": np.dtype(np.bool_),
}
NUMPY_TO_IR: dict[np.dtype, str] = {v: k for k, v in DTYPES.items() if k != "bf16"}
ITEMSIZE: dict[str, int] = {k: v.itemsize for k, v in DTYPES.items()} | {"bf16": 2}
# The dtype names the bundle uses (docs/bundle-format.md).
BUNDLE_NAMES: dict[str, str] = {k: v.name for k, v in DTYPES.items()} | {"bf16": "bfloat16"}


def convert(a: np.ndarray, dtype: str) -> bytes:
    """An array's values as little-endian bytes of IR dtype `dtype`.

    Values beyond the range of a narrower type round to ±inf, as IEEE conversion does; that is
    what a mask constant such as -1e9 means in fp16, so it is not warned about."""
    if dtype == "bf16":
        return to_bf16_bytes(a)
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=DTYPES[dtype].newbyteorder("<")).tobytes()


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def bundle_name(self) -> str:
        return BUNDLE_NAMES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True)
class Value:
    """A named graph input (an activation the user binds at run time)."""

    name: str
    type: TensorType


@dataclass(frozen=True, slots=True)
class Weight:
    """A constant tensor; `data` is its C-order little-endian bytes, in memory or `Lazy`."""

    name: str
    type: TensorType
    data: bytes | Lazy
    # The digest of `data`, computed on first use: every IR printer names a weight by it, so a
    # BERT-sized model would otherwise hash its half gigabyte several times per compile.
    _digest: str | None = field(default=None, init=False, compare=False, repr=False)

    @staticmethod
    def of(name: str, array: np.ndarray) -> Weight:
        array = np.ascontiguousarray(array)
        dtype = NUMPY_TO_IR[array.dtype.newbyteorder("=")]
        return Weight(name, TensorType(dtype, tuple(int(d) for d in array.shape)),
                      array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())

    def buffer(self) -> bytes:
        """The bytes in memory (a Lazy weight is read: the caller holds the only copy)."""
        return self.data.read() if isinstance(self.data, Lazy) else self.data

    def array(self) -> np.ndarray:
        if self.type.dtype == "bf16":
            return from_bf16_bytes(self.buffer(), self.type.shape)
        a = np.frombuffer(self.buffer(), dtype=self.type.np_dtype.newbyteorder("<"))
        return a.reshape(self.type.shape)

    def raw(self) -> np.ndarray:
        """The elements as unsigned ints of their storage size, for moves (bf16 included)."""
        return np.frombuffer(self.buffer(), dtype=f"<u{ITEMSIZE[self.type.dtype]}").reshape(self.type.shape)

    @property
    def lazy(self) -> bool:
        return isinstance(self.data, Lazy)

    @property
    def sha256(self) -> str:
        if self._digest is None:
            object.__setattr__(self, "_digest", remember("sha256", self.data, lambda: data_sha256(self.data)))
        return self._digest


def _pieces(data: bytes | np.ndarray, size: int) -> Iterator[memoryview]:
    """`data`'s bytes in order, in pieces of at most `size` (a computed Lazy weight's chunks)."""
    whole = memoryview(data).cast("B")
    for start in range(0, len(whole), max(1, size)):
        yield whole[start:start + size]


@dataclass(frozen=True, slots=True)
class Joined(Lazy):
    """Weights of one dtype concatenated along `axis`, computed when read (merge_contractions
    joins sibling GEMMs' weights; a big model's stay in its files until then)."""

    parts: tuple[Weight, ...]
    axis: int

    def __len__(self) -> int:
        return sum(len(p.data) for p in self.parts)

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[memoryview]:
        return _pieces(np.concatenate([p.raw() for p in self.parts], axis=self.axis), size)

    def read(self) -> bytes:
        return np.concatenate([p.raw() for p in self.parts], axis=self.axis).tobytes()


@dataclass(frozen=True, slots=True)
class RowScaled(Lazy):
    """A 2-D weight with row k multiplied by `scale`'s element k, computed in float64 and rounded
    to the weight's type when read (passes/fold_column_scale.py; a big model's stays in its files
    until then)."""

    source: Weight
    scale: Weight

    def __len__(self) -> int:
        return len(self.source.data)

    def array(self) -> np.ndarray:
        scaled = self.scale.array().astype(np.float64).reshape(-1, 1) * self.source.array().astype(np.float64)
        return scaled.astype(self.source.type.np_dtype)

    def read(self) -> bytes:
        return np.ascontiguousarray(self.array()).astype(self.source.type.np_dtype.newbyteorder("<"), copy=False).tobytes()

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[memoryview]:
        return _pieces(self.read(), size)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a dense tensor."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))
