"""Cost terms of the `window` family's tiles (TILE=1) (codegen/window_tile.py, [Note: window tiles]).

A block copies its loads' boxes into shared memory, waits once, then each thread computes its run
from the boxes. Counted per block and fed to the shared formula (`cost._combine`):

    issued    = 2 · blocks · threads · (a thread's instructions from the boxes
                                        + its share of the box vectors · TILE_COPY_OPS
                                        + its share of the 16-bit elements converted to fp32)
                a thread's instructions: `cost._window_vector_instructions` with each tap's quads
                shared loads (TILE_LOAD_OPS each, no guard: the padding is in the box, no conversion)
    l2        = blocks · the boxes' bytes          (halos and the filter re-read from L2 by every tile)
    pipeline  = waves · load_latency / blocks_per_sm
                each block waits one round trip for its boxes; the other blocks resident on the SM
                compute meanwhile
Coefficients are first estimates (session 34), to be checked against measured tiles.
"""
from __future__ import annotations

import math
from typing import Mapping

TILE_LOAD_OPS = 2      # a tap's 16-byte shared load (4 fp32 channels) and its address
TILE_COPY_OPS = 14     # a box vector: its coordinates, the guard, the global load, the shared store


def tile_terms(k, p: Mapping, types: Mapping, hw, per_thread: float, bps: int) -> dict[str, float]:
    from aicfc.codegen import window, window_tile
    from aicfc.ir.types import ITEMSIZE
    from aicfc.planner.cost import load_latency
    kk = window.without_unit_taps(k)
    boxes = window_tile.boxes(kk, p)
    blocks = window_tile.tiles(kk, p)
    threads = window_tile.threads(p)
    vectors = sum(b.elements for b in boxes) / p["vec"]
    box_bytes = sum(b.elements * ITEMSIZE[types[b.load.buffer].dtype] for b in boxes)
    convert = sum(b.elements for b in boxes if ITEMSIZE[types[b.load.buffer].dtype] < 4)   # to fp32, once a block
    issued = 2.0 * blocks * threads * (per_thread + (vectors * TILE_COPY_OPS + convert) / threads)
    bps = max(1, bps)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    return {"issued": issued, "l2": blocks * box_bytes, "pipeline": waves * load_latency(hw) / bps}
