"""Tensor Memory Accelerator descriptors: what the compiler decides about each one.

A kernel that loads tiles with `cp.async.bulk.tensor` takes, as its first argument, a pointer
to its 128-byte `CUtensorMap`s in global memory (one per operand, in order, 128 bytes apart).
A tensor map holds a device address, which only exists at run time, so the compiler records
everything else (the tensor's element type, its extents and strides, the box one copy moves,
the shared-memory swizzle) and `aicf_run` encodes the maps at load with the driver's
`cuTensorMapEncodeTiled` (`aicf_run/tensormap.py`) and uploads them once. The executor
computes nothing: the global address is the buffer's base plus `offset` elements.
(Not `__grid_constant__` parameters: PyCUDA launches with a packed parameter buffer, and on
the H200 with driver 580 a kernel with a grid-constant parameter read that buffer wrongly.)

[Note: TMA maps in constant memory]
Maps in global memory were written through the generic proxy, so every block must fence each
one (`fence.proxy.tensormap::generic.acquire`) before the TMA reads it. Maps in `__constant__`
memory, written by the host before the launch, need no fence (CUDA programming guide, "tensor
maps"). So a kernel of `constant_maps(plan)` declares `__constant__ AicfTmap <symbol>[n]`
(symbol: `maps_symbol`) and reads its maps there; the bundle records the symbol, and `aicf_run`
writes the encoded maps into it in every instance of the module it loads (the kernel's pointer
argument still comes first and points at the same maps in global memory, unused). A module's
constant bank holds 64 KB, so a plan puts its first CONST_BUDGET bytes of maps (launch order)
there; the rest stay in global memory, fenced.
What it buys, measured on an H100 (benchmarks/results/gemm_tma_store_session7_h100.txt): three
fences in one kernel cost 0.7 us before its first copy (4096x768x768 with TMA stores, 11.1 us
against 10.4 with none), serial whichever threads issue them. In one process, the shipped GEMMs
with their two maps in constant memory against the same kernels fenced in global memory measured
the same within the rounds' spread (4096x64x768 5.34 against 5.24 us, 4096x768x768 10.52 against
10.65, 4096x768x3072 34.33 against 34.77): either a map's first read from the constant bank costs
about what two fences do, or two fences cost less than these kernels' spread; not separated.
ResNet-50 B32's 3x3 convolutions measured 1.0-1.5 us faster each than in the session before, on
another H100: not an A/B.

[Note: TMA record]
  buffer    the tensor the map reads (a buffer name here, its id in the bundle)
  dtype     "f16" | "bf16" | "f32" (the map's element type; tf32 operands are f32 in memory)
  offset    elements from the buffer's start to element (0, ..., 0) of the map
  dims      extents, innermost first (dims[0] is the contiguous one: stride 1 element)
  strides   byte strides of dims[1:], each a multiple of 16 and below 2^40
  box       elements one copy moves along each dim, innermost first; box[0]·itemsize <= swizzle
  swizzle   0, 32, 64 or 128 (bytes of the swizzle pattern)
Out-of-bounds elements of a box are filled with zeros (the map's OOB fill NONE), which is what
lets a GEMM tile hang over the tensor's edge without predicates.

[Note: TMA im2col record]
A map with the key `im2col` is encoded with `cuTensorMapEncodeIm2col` instead: the tensor is a
channels-last image (dims C, W, H, N innermost first: rank 4), and one copy moves
`box[1]` pixels (pixelsPerColumn) of `box[0]` channels (channelsPerPixel); box[2:] are 1.
  lower           [w, h]: the pixel box's lower corner, -pad (each in -128..127 at rank 4)
  upper           [w, h]: its upper corner, so that ceil((W + upper - lower) / stride) = OW
  element_strides [1, stride_w, stride_h, 1]: the convolution's stride (each 1..8)
A copy at coordinates (c, w, h, n) with offsets (kw·dw, kh·dh) reads, for output pixels
m0, m0 + 1, ... walked w fastest, then h, then n, the pixel (n, h + kh·dh, w + kw·dw) of each, where
(w, h) = (ow·stride_w - pad_w, oh·stride_h - pad_h) of m0; pixels outside the image (padding, and
n >= N) are zeros. Shared memory receives row i = pixel i, 128-byte swizzled as a tiled
[pixels x channels] box would be, so wgmma reads it with the same descriptors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from aicf_run.tensormap import MAP_BYTES   # a CUtensorMap's size: the runtime owns the format
from aicfc.ir.types import ITEMSIZE

MAX_RANK = 5
CONST_BUDGET = 32 * 1024   # bytes of a plan's maps in constant memory (half a module's 64 KB bank)
MAX_BOX = 256
SWIZZLES = (0, 32, 64, 128)


IM2COL_CORNER = {3: 2**15, 4: 2**7, 5: 2**4}   # corners lie in [-c, c - 1] at each rank (cuda.h)
IM2COL_MAX_STRIDE = 8


@dataclass(frozen=True)
class Im2col:
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    element_strides: tuple[int, ...]

    def record(self) -> dict[str, Any]:
        return {"lower": list(self.lower), "upper": list(self.upper), "element_strides": list(self.element_strides)}


@dataclass(frozen=True)
class TensorMap:
    buffer: str
    dtype: str
    offset: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int
    im2col: Im2col | None = None

    def problems(self) -> str | None:
        """Why the driver would refuse this map (None when it would not)."""
        esize = ITEMSIZE[self.dtype]
        if not 1 <= len(self.dims) <= MAX_RANK:
            return f"rank {len(self.dims)} outside 1..{MAX_RANK}"
        if len(self.strides) != len(self.dims) - 1 or len(self.box) != len(self.dims):
            return "strides/box do not match the rank"
        if (self.offset * esize) % 16:
            return f"start {self.offset * esize} B into the tensor is not 16-byte aligned"
        for s in self.strides:
            if s % 16 or not 0 < s < 2**40:
                return f"stride {s} B is not a positive multiple of 16 (TMA)"
        if any(not 1 <= b <= MAX_BOX for b in self.box) or any(d < 1 for d in self.dims):
            return f"box {self.box} outside 1..{MAX_BOX}"
        if self.swizzle not in SWIZZLES or (self.swizzle and self.box[0] * esize > self.swizzle):
            return f"inner box {self.box[0] * esize} B exceeds the {self.swizzle}-byte swizzle"
        if (self.box[0] * esize) % 16:
            return f"inner box {self.box[0] * esize} B is not a multiple of 16"
        if self.im2col is not None:
            rank = len(self.dims)
            lim = IM2COL_CORNER.get(rank)
            if lim is None:
                return f"an im2col map has rank 3 to 5, not {rank}"
            for what, corner in (("lower", self.im2col.lower), ("upper", self.im2col.upper)):
                if len(corner) != rank - 2 or any(not -lim <= v < lim for v in corner):
                    return f"im2col {what} corner {corner} outside [{-lim}, {lim - 1}] (rank {rank})"
            es = self.im2col.element_strides
            if len(es) != rank or any(not 1 <= v <= IM2COL_MAX_STRIDE for v in es):
                return f"im2col element strides {es} outside 1..{IM2COL_MAX_STRIDE}"
            if any(b != 1 for b in self.box[2:]):
                return f"an im2col box is [channels, pixels, 1...], not {self.box}"
        return None

    def record(self, index: Mapping[str, int]) -> dict[str, Any]:
        """The bundle's form (docs/bundle-format.md): the buffer as its id."""
        rec = {"buffer": index[self.buffer], "dtype": self.dtype, "offset": self.offset,
               "dims": list(self.dims), "strides": list(self.strides), "box": list(self.box),
               "swizzle": self.swizzle}
        if self.im2col is not None:
            rec["im2col"] = self.im2col.record()
        return rec


def tensor_maps(k: Any, params: Mapping | None, types: Mapping) -> list[TensorMap]:
    """The tensor maps kernel `k` takes under schedule `params` (default: its chosen one), in
    argument order; [] for a kernel that uses none."""
    from aicfc.codegen import FAMILIES
    p = params if params is not None else (dict(k.schedule.params) if k.schedule else {})
    fn = getattr(FAMILIES[k.family], "tensor_maps", None)
    return list(fn(k, p, types)) if fn else []


def records(k: Any, params: Mapping | None, types: Mapping, index: Mapping[str, int],
            what: str = "bundle buffers") -> list[dict[str, Any]]:
    """`tensor_maps` in the bundle's form, each buffer named by `index` (bundle ids, or the
    positions of a tuning candidate's arguments); a map over a buffer `index` lacks is a compiler bug."""
    maps = tensor_maps(k, params, types)
    missing = [m.buffer for m in maps if m.buffer not in index]
    assert not missing, f"{k.name}: tensor maps over {missing}, which are not {what}"
    return [m.record(index) for m in maps]


def maps_symbol(kernel_name: str) -> str:
    """The `__constant__` array a kernel of `constant_maps` reads its maps from."""
    return f"{kernel_name}_tmaps"


def constant_maps(plan: Any) -> frozenset[str]:
    """The kernels whose maps live in constant memory ([Note: TMA maps in constant memory]): in
    launch order, while the plan's maps there stay within CONST_BUDGET bytes."""
    types = plan.types()
    names, used = [], 0
    for k in plan.kernels:
        n = len(tensor_maps(k, None, types)) * MAP_BYTES
        if n and used + n <= CONST_BUDGET:
            names.append(k.name)
            used += n
    return frozenset(names)
