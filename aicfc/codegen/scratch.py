"""Kernel-private buffers a schedule needs beyond the tensors it computes.

A split-k GEMM (`SPLITK > 1`, the `gemm` family's or a Hopper convolution's) or a stream-k one
(`STREAM = 1`, a slot for each block a tile is cut among) needs two:

- `<kernel>.partials` (arena, f32): every split's partial accumulator tile. It is live only
  during its kernel, so memory planning lets other tensors reuse its bytes.
- `<kernel>.tickets` (zero-initialized, i32, one per output tile): the splits of a tile count
  themselves in; the last one to arrive adds the others' partials, runs the epilogue and
  resets the ticket to zero, so the buffer is zero again for the next run (and for graph
  replay). It lives with the weights, which are uploaded once and never poisoned.

A split-KV attention (`unit = split`, codegen/attention_split.py) needs the same two: every
chunk's partial rows (unnormalised O, then the running max and sum) and one ticket per K/V head.

Names, types and placement are a function of the kernel and its schedule parameters, so the
compiler, the memory plan, the bundle and `aicfc tune` all agree on them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from aicfc.ir.decision import Kernel
from aicfc.ir.types import TensorType


@dataclass(frozen=True)
class Scratch:
    name: str
    type: TensorType
    zeroed: bool     # True: zero at load, kept zero by the kernel; False: arena, live in the kernel


def scratch(k: Kernel, params: Mapping[str, Any] | None = None) -> list[Scratch]:
    p = params if params is not None else (k.schedule.param if k.schedule else {})
    if k.family == "attention" and p.get("unit") == "split" and p.get("SPLITS", 1) > 1 and not p.get("CL"):
        # one chunk: no merge; CL = 1: the chunks merge in their cluster's shared memory
        from aicfc.codegen import attention, attention_split
        _, _, _, _, dv = attention.dims(k)
        sp = attention_split.structure(attention.roles(k))
        return [Scratch(f"{k.name}.partials", TensorType("f32", (attention_split.partial_floats(sp.nkv, sp.rows, dv, p["SPLITS"]),)), False),
                Scratch(f"{k.name}.tickets", TensorType("i32", (sp.nkv,)), True)]
    if k.family == "attention":
        return []
    splits = int(p.get("SPLITK", 1))
    if (splits <= 1 and not p.get("STREAM")) or p.get("CL"):   # gemv CL=1: splits add in the cluster's shared memory
        return []
    if k.family == "conv" and p.get("unit") == "wgmma":
        from aicfc.codegen import conv_wgmma
        tiles = conv_wgmma.tiles(k, p)[2]
    elif k.family == "gemm":
        from aicfc.codegen.gemm import dims, shape
        _, m, n, _, batch = shape(k, p)
        tiles = math.ceil(m / p["BM"]) * math.ceil(n / p["BN"]) * math.prod(e for _, e in batch)
        if p.get("unit") == "gemv":   # BM holds every row, the batch's included
            tiles = math.ceil(n / p["BN"])
    else:
        return []
    if p.get("STREAM"):   # stream-k: a slot for each block a tile's k-blocks are cut among
        from aicfc.codegen import gemm_wgmma
        kk = (conv_wgmma.dims(k)[2] if k.family == "conv" else dims(k)[3])
        splits = gemm_wgmma.stream_parts(tiles, math.ceil(kk / p["BK"]), p["CTAS"])
    return [Scratch(f"{k.name}.partials", TensorType("f32", (tiles * splits * p["BM"] * p["BN"],)), False),
            Scratch(f"{k.name}.tickets", TensorType("i32", (tiles,)), True)]
