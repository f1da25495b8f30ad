"""Encode TMA tensor maps at load: a compiler record ([Note: TMA record]) -> a 128-byte CUtensorMap.

A kernel that loads tiles with the Tensor Memory Accelerator takes one `CUtensorMap` per
operand by value (`const __grid_constant__`, 128 bytes, 64-byte aligned) before its pointer
arguments. A map holds the operand's device address, which exists only at run time, so the
compiler records everything else (aicfc/codegen/tma.py) and this module has the driver encode
the map once the address is known: `cuTensorMapEncodeTiled`, through ctypes on the library
that aicf_run.graph loads (the one PyCUDA uses, so the same context is current). The blob is
uploaded to global memory (`upload`: a kernel's maps 128 bytes apart, 64-byte aligned) and the
kernel takes a pointer to them as its first argument. Not `__grid_constant__` parameters by
value: PyCUDA launches with a packed parameter buffer, and on an H200 (driver 580) a kernel
with a grid-constant 128-byte parameter read that buffer wrongly (faulting on the pointer
after it), while the same struct without `__grid_constant__` echoed correctly.

A record with the key `im2col` ([Note: TMA im2col record] in aicfc/codegen/tma.py) is encoded
with `cuTensorMapEncodeIm2col` instead: its box is [channelsPerPixel, pixelsPerColumn, 1, ...],
and it carries the pixel box's corners and the element strides (a convolution's stride).

The encoding is fixed: no interleave, L2 promotion of 256 bytes, out-of-bound elements read as
zeros (OOB fill NONE), element strides 1. Records are checked here before any value reaches
ctypes (which would silently truncate an oversized integer), so a bad record is a one-line
RunError, as is the driver refusing one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

from aicf_run import graph as _graph
from aicf_run.errors import RunError

MAP_BYTES = 128
MAP_ALIGN = 64
MAX_RANK = 5
MAX_BOX = 256
MAX_DIM = 2**32                # globalDim[i] <= 2^32 (cuda.h)
MAX_STRIDE = 2**40             # globalStrides[i] < 2^40, a multiple of 16
ADDRESS_ALIGN = 16             # globalAddress: 16-byte aligned without interleave
# The record's element types: CUtensorMapDataType, element size, and the bundle's buffer dtype.
DATA_TYPES: dict[str, tuple[int, int]] = {"f16": (6, 2), "f32": (7, 4), "bf16": (9, 2)}
BUFFER_DTYPES: dict[str, str] = {"f16": "float16", "f32": "float32", "bf16": "bfloat16"}
# CUtensorMapSwizzle by the swizzle pattern's bytes.
SWIZZLES: dict[int, int] = {0: 0, 32: 1, 64: 2, 128: 3}
INTERLEAVE_NONE = 0
L2_PROMOTION_256B = 3
OOB_FILL_NONE = 0
KEYS = ("buffer", "dtype", "offset", "dims", "strides", "box", "swizzle")
IM2COL = "im2col"                                       # the optional key of an im2col map
IM2COL_KEYS = ("lower", "upper", "element_strides")
IM2COL_CORNER = {3: 2**15, 4: 2**7, 5: 2**4}            # corners in [-c, c - 1] at each rank (cuda.h)
IM2COL_MAX_STRIDE = 8

_RECOMPILE = "recompile the model with `aicfc compile`"
_U32, _U64 = ctypes.c_uint32, ctypes.c_uint64
# CUresult cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank,
#   void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
#   const cuuint32_t* boxDim, const cuuint32_t* elementStrides, CUtensorMapInterleave,
#   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill); enums are ints.
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int, _U32, ctypes.c_void_p, ctypes.POINTER(_U64),
             ctypes.POINTER(_U64), ctypes.POINTER(_U32), ctypes.POINTER(_U32), ctypes.c_int,
             ctypes.c_int, ctypes.c_int, ctypes.c_int]
# CUresult cuTensorMapEncodeIm2col(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank,
#   void* globalAddress, const cuuint64_t* globalDim, const cuuint64_t* globalStrides,
#   const int* pixelBoxLowerCorner, const int* pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
#   cuuint32_t pixelsPerColumn, const cuuint32_t* elementStrides, CUtensorMapInterleave,
#   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill)
_IM2COL_ARGTYPES = [ctypes.c_void_p, ctypes.c_int, _U32, ctypes.c_void_p, ctypes.POINTER(_U64),
                    ctypes.POINTER(_U64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                    _U32, _U32, ctypes.POINTER(_U32), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                    ctypes.c_int]
_PROTOTYPES = {"cuTensorMapEncodeTiled": _ARGTYPES, "cuTensorMapEncodeIm2col": _IM2COL_ARGTYPES}


def problem(record: Any) -> str | None:
    """Why `record` is not a map the driver could encode, judged on its own (None when it is).

    The bundle schema checks the same against the record's buffer, field by field; this guards
    the records `aicfc tune` hands over directly, and anything reaching ctypes.
    """
    if not isinstance(record, Mapping):
        return f"a record must be a map, got {type(record).__name__}"
    if set(record) - {IM2COL} != set(KEYS):
        return f"keys are {sorted(map(str, record))}, expected {sorted(KEYS)} (and optionally {IM2COL})"
    if not isinstance(record["dtype"], str) or record["dtype"] not in DATA_TYPES:
        return f"dtype {_short(record['dtype'])} is not one of {', '.join(DATA_TYPES)}"
    esize = DATA_TYPES[record["dtype"]][1]
    if not _is_int(record["buffer"]) or record["buffer"] < 0:
        return f"buffer {_short(record['buffer'])} is not a buffer id"
    if not _is_int(record["offset"]) or not 0 <= record["offset"] < 2**48:
        return f"offset {_short(record['offset'])} is not an element count"
    dims, strides, box = record["dims"], record["strides"], record["box"]
    if not _ints(dims, 1, MAX_DIM) or not 1 <= len(dims) <= MAX_RANK:
        return f"dims {_short(dims)} must be 1..{MAX_RANK} ints in 1..2^32"
    if not _ints(box, 1, MAX_BOX) or len(box) != len(dims):
        return f"box {_short(box)} must be {len(dims)} ints in 1..{MAX_BOX}"
    if (not _ints(strides, 1, MAX_STRIDE - 1) or len(strides) != len(dims) - 1
            or any(s % 16 for s in strides)):
        return (f"strides {_short(strides)} must be {len(dims) - 1} positive multiples of 16 "
                f"below 2^40")
    if not _is_int(record["swizzle"]) or record["swizzle"] not in SWIZZLES:
        return f"swizzle {_short(record['swizzle'])} is not one of {', '.join(map(str, SWIZZLES))}"
    inner = box[0] * esize
    if inner % 16:
        return f"the inner box is {inner} bytes, not a multiple of 16"
    if record["swizzle"] and inner > record["swizzle"]:
        return f"the inner box is {inner} bytes, over the {record['swizzle']}-byte swizzle"
    if IM2COL in record:
        return im2col_problem(record[IM2COL], len(dims), box)
    return None


def im2col_problem(im2col: Any, rank: int, box: Sequence[int]) -> str | None:
    """Why an im2col record's own part is not one the driver could encode (None when it is)."""
    if not isinstance(im2col, Mapping) or set(im2col) != set(IM2COL_KEYS):
        return f"im2col must be a map with keys {', '.join(IM2COL_KEYS)}"
    limit = IM2COL_CORNER.get(rank)
    if limit is None:
        return f"an im2col map has rank 3 to 5, not {rank}"
    for key in ("lower", "upper"):
        if not _ints(im2col[key], -limit, limit - 1) or len(im2col[key]) != rank - 2:
            return f"im2col.{key} {_short(im2col[key])} must be {rank - 2} ints in {-limit}..{limit - 1}"
    if not _ints(im2col["element_strides"], 1, IM2COL_MAX_STRIDE) or len(im2col["element_strides"]) != rank:
        return (f"im2col.element_strides {_short(im2col['element_strides'])} must be {rank} ints "
                f"in 1..{IM2COL_MAX_STRIDE}")
    if any(b != 1 for b in box[2:]):
        return f"an im2col box is [channels, pixels, 1, ...], got {_short(list(box))}"
    return None


def encode(record: Mapping[str, Any], address: int, lib: Any = None,
           name: str = "a tensor map") -> bytes:
    """The 128 bytes of the CUtensorMap for `record` over the buffer whose base is `address`.

    The map starts `record["offset"]` elements past `address`. `lib` is the driver library
    (default aicf_run.graph.libcuda()); `name` says whose map it is in error messages, e.g.
    "kernel 3 (k3) tensor_maps[0]". A context must be current.
    """
    why = problem(record)
    if why is not None:
        raise RunError(f"{name}: bad tensor map record: {why}; {_RECOMPILE}")
    data_type, esize = DATA_TYPES[record["dtype"]]
    start = address + record["offset"] * esize
    if not 0 < start < 2**64 or start % ADDRESS_ALIGN:
        raise RunError(f"{name}: the map starts at address {start:#x}, not a {ADDRESS_ALIGN}-byte "
                       f"aligned device address; {_RECOMPILE}")
    im2col = record.get(IM2COL)
    entry = "cuTensorMapEncodeIm2col" if im2col else "cuTensorMapEncodeTiled"
    lib, function = _entry(lib, name, entry)
    rank = len(record["dims"])
    # CUtensorMap is 64-byte aligned: a 64-byte aligned window of a larger buffer holds it.
    storage = (_U64 * ((MAP_BYTES + MAP_ALIGN) // 8))()
    at = -ctypes.addressof(storage) % MAP_ALIGN + ctypes.addressof(storage)
    tensor_map = (_U64 * (MAP_BYTES // 8)).from_address(at)
    strides = list(record["strides"]) or [0]   # rank 1 has none; the driver reads none
    tail = (ctypes.c_int(INTERLEAVE_NONE), ctypes.c_int(SWIZZLES[record["swizzle"]]),
            ctypes.c_int(L2_PROMOTION_256B), ctypes.c_int(OOB_FILL_NONE))
    try:
        head = (ctypes.c_void_p(at), ctypes.c_int(data_type), _U32(rank), ctypes.c_void_p(start),
                (_U64 * rank)(*record["dims"]), (_U64 * len(strides))(*strides))
        if im2col:
            corners = rank - 2
            result = function(*head, (ctypes.c_int * corners)(*im2col["lower"]),
                              (ctypes.c_int * corners)(*im2col["upper"]), _U32(record["box"][0]),
                              _U32(record["box"][1]), (_U32 * rank)(*im2col["element_strides"]), *tail)
        else:
            result = function(*head, (_U32 * rank)(*record["box"]), (_U32 * rank)(*[1] * rank), *tail)
    except (ctypes.ArgumentError, TypeError, OverflowError) as err:
        raise RunError(f"{name}: {entry} could not be called "
                       f"({_one_line(err)}); {_RECOMPILE}") from None
    if result != 0:
        raise RunError(f"{name}: {entry} refused {describe(record)}: "
                       f"{_graph.error_name(lib, result)} ({result}); "
                       f"{_RECOMPILE} for this GPU")
    return ctypes.string_at(ctypes.addressof(tensor_map), MAP_BYTES)


def describe(record: Mapping[str, Any]) -> str:
    """One line for messages: "f16 dims [64, 32] strides [128] box [64, 32] swizzle 128"."""
    return (f"{record.get('dtype')} dims {list(record.get('dims', []))} strides "
            f"{list(record.get('strides', []))} box {list(record.get('box', []))} swizzle "
            f"{record.get('swizzle')}" + (f" im2col {dict(record[IM2COL])}" if IM2COL in record else ""))


def arg_format(maps: int, pointers: int) -> str:
    """A prepared call's argument format: a pointer to the kernel's maps where it has any, then
    its `pointers` buffer pointers."""
    return "P" * ((1 if maps else 0) + pointers)


def upload(cuda: Any, tables: Sequence[Sequence[bytes]], what: str) -> tuple[Any, list[int]]:
    """One device allocation holding every table of maps (a kernel's maps, in order, 128 bytes
    apart; each table 128-byte aligned); returns it (None when there are no maps) and each
    table's device address (0 for an empty one). Freed by the caller."""
    blob = b"".join(b"".join(t) for t in tables)
    if not blob:
        return None, [0] * len(tables)
    allocation = None
    try:
        allocation = cuda.mem_alloc(len(blob))
        cuda.memcpy_htod(allocation, blob)
    except (cuda.Error, MemoryError) as err:
        if allocation is not None:
            try:
                allocation.free()
            except cuda.Error:
                pass  # a lost context frees everything when it goes
        raise RunError(f"cannot place the tensor maps of {what} in GPU memory ({_one_line(err)}); "
                       f"free GPU memory") from None
    base, addresses = int(allocation), []
    for t in tables:
        addresses.append(base if t else 0)
        base += MAP_BYTES * len(t)
    return allocation, addresses


def write_constant(cuda: Any, module: Any, symbol: str, maps: Sequence[bytes], what: str, fix: str) -> None:
    """Encoded maps, in order, into the PyCUDA module's constant array `symbol`, which must hold
    exactly them ([Note: TMA maps in constant memory] in aicfc/codegen/tma.py); RunError naming
    `what` and ending in `fix` otherwise."""
    blob = b"".join(maps)
    try:
        address, size = module.get_global(symbol)
    except cuda.Error as err:
        raise RunError(f"{what}: its tensor maps' symbol {symbol!r} is not in its module "
                       f"({_one_line(err)}); {fix}") from None
    if size != len(blob):
        raise RunError(f"{what}: {symbol} holds {size} bytes, not the {len(blob)} of its tensor maps; {fix}")
    cuda.memcpy_htod(address, blob)


def _entry(lib: Any, name: str, entry: str = "cuTensorMapEncodeTiled") -> tuple[Any, Any]:
    """`lib` (default the driver library) and its `entry` (cuTensorMapEncodeTiled or
    cuTensorMapEncodeIm2col), prototype set."""
    if lib is None:
        try:
            lib = _graph.libcuda()
        except RunError:
            raise RunError(f"{name}: cannot load the CUDA driver library {_graph.LIBRARY} to "
                           f"encode TMA tensor maps; check the NVIDIA driver "
                           f"installation") from None
    function = getattr(lib, entry, None)
    if function is None:
        raise RunError(f"{name}: this CUDA driver has no {entry} (CUDA 12 or "
                       f"later has it); update the NVIDIA driver, or recompile for sm_80")
    if hasattr(function, "argtypes"):   # a ctypes function (a test's fake library has none)
        function.argtypes = _PROTOTYPES[entry]
        function.restype = ctypes.c_int
    return lib, function


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(values: Any, low: int, high: int) -> bool:
    return (isinstance(values, Sequence) and not isinstance(values, (str, bytes))
            and all(_is_int(v) and low <= v <= high for v in values))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
