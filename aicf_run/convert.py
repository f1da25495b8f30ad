"""Host-side conversion between an input/output's host dtype and its device storage dtype.

Under `--precision fp16|bf16` the compiler stores float32 tensors as float16/bfloat16 on the
device while the bundle's interface stays float32. A bundle from aicfc records a GPU cast
kernel for each such tensor and aicf-run converts there ([Note: device I/O] in executor.py);
this host path serves bundles written before those kernels, and gives the same bits. numpy has
no bfloat16, so it is handled as the top 16 bits of a float32, rounded to nearest even.
"""
from __future__ import annotations

import numpy as np

# (host dtype, device dtype) pairs an input or output may have.
CONVERSIONS = {("float32", "float16"), ("float32", "bfloat16")}


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values → bfloat16 bit patterns as little-endian uint16, same shape (round to
    nearest even; NaN stays NaN). In uint32: only a NaN's pattern can wrap, and NaNs are
    overwritten."""
    f = np.ascontiguousarray(a, dtype="<f4")
    bits = f.view("<u4")
    rounded = (bits >> 16) & 1
    rounded += bits
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype("<u2")
    out[np.isnan(f)] = 0x7FC0
    return out


def to_bf16_bytes(a: np.ndarray) -> bytes:
    """float32 values → bfloat16 little-endian bytes (see `to_bf16`)."""
    return to_bf16(a).tobytes()


def from_bf16_bytes(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    bits = np.frombuffer(data, dtype="<u2").astype("<u4") << 16
    return bits.view("<f4").reshape(shape)


def to_device(array: np.ndarray, device_dtype: str) -> np.ndarray:
    """The bytes to copy to a device buffer of `device_dtype` (a contiguous array)."""
    if array.dtype.name == device_dtype:
        return array
    if device_dtype == "bfloat16":
        return to_bf16(array)
    return np.ascontiguousarray(array, dtype=device_dtype)


def device_array(shape: tuple[int, ...], device_dtype: str) -> np.ndarray:
    """An empty host array with the device buffer's byte layout, to copy into."""
    return np.empty(shape, dtype="<u2" if device_dtype == "bfloat16" else device_dtype)


def to_host(raw: np.ndarray, host_dtype: str, device_dtype: str) -> np.ndarray:
    if device_dtype == host_dtype:
        return raw
    if device_dtype == "bfloat16":
        return from_bf16_bytes(raw.tobytes(), raw.shape).astype(host_dtype)
    return raw.astype(host_dtype)
