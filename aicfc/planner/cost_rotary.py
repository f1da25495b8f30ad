"""Cost terms of the rotary epilogue against the separate rotary kernels it replaces
(passes/rotary_epilogue.py decides with them; `explain` shows both figures in the rewrite's reason).

Both ways run the same QKV GEMM and store a tensor of C's size; they differ in:

    fused    = M·N·ROTARY_OPS / (EPILOGUE_RATE·sqrt(2)·SMs)        the epilogue's extra instructions
               on every element of C (its range tests and table reads run on the copied V
               columns too), at the Hopper engine's measured epilogue rate for two consumer
               warpgroups, taken as exposed (a ping-pong tile hides it under the other
               warpgroup's k-blocks; the schedule is not chosen yet, so the bound is the
               cautious one)
    separate = Σ maps: launch + (2·elements·esize + the cos and sin tables) / (dram·eff.dram)
               each map reads its heads' columns of C (own and partner: the same elements),
               writes as many, and reads the tables once

ROTARY_OPS is counted, not guessed: `cuobjdump -sass` of the B8 S512 QKV kernel (wgmma 128x128
MI=2 PP=1 OUT=2) has 1384 instructions with the epilogue and 520 with it cut at the store, over
the 128 elements a consumer thread holds: 6.75 an element (one LDG and one HADD2 per table read
of the pair's element, FMUL, FFMA, FSEL, addressing). Before the digits were hoisted and the
bands folded ([Note: rotary bands]) the same epilogue took 38.7 an element (4096 instructions
at 128x192 MI=1 OUT=0 against 384 cut at the store, over 96 elements; 580 LDG): measured on the
H200 at B8 S512, that kernel took 45.0 us against 29.4 us for the same tile without the epilogue,
while the two rotary kernels took 7.4 us, so the fusion lost at B8 (it won at B1: 1.47x against 1.44x the peer);
`rotary_fusion_cost(..., ops=ROTARY_OPS_UNHOISTED)` gives the same verdicts.
"""
from __future__ import annotations

import math

from aicfc.planner.hardware import Profile, plan_launch_us

ROTARY_OPS = 7              # instructions an element of C (SASS count above)
ROTARY_OPS_UNHOISTED = 39   # the same before the digits and bands were constants (the tests' record of the B8 loss)


def rotary_fusion_cost(rows: int, cols: int, rotated: list[int], table_elements: int, esize: int,
                       hw: Profile, ops: int = ROTARY_OPS) -> tuple[float, float]:
    """(fused extra us, separate us) for a contraction of `rows` x `cols` whose maps rotate
    `rotated` elements each (their heads' columns of every row), reading cos and sin tables of
    `table_elements` each, stored `esize` bytes an element."""
    from aicfc.planner.cost_wgmma import EPILOGUE_RATE
    rate = hw.data.get("wgmma_epilogue_rate", EPILOGUE_RATE) * math.sqrt(2) * hw.sm_count
    fused = rows * cols * ops / rate
    bandwidth = hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"]
    separate = sum(plan_launch_us(hw) + (2 * n + 2 * table_elements) * esize / bandwidth for n in rotated)
    return fused, separate
