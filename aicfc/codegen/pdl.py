"""Dependent launches between the kernels of a plan (Hopper's programmatic dependent launch).

[Note: PDL]
A plan is a chain of kernels on one stream, each reading what the ones before it wrote. Run
plainly, a kernel's blocks are scheduled only after the previous kernel has finished and its
memory is flushed, so every boundary costs the launch latency again: on an H200 the decode step
of a 1 B Llama replayed as a CUDA graph spent ~330 us of its 1600 us between its 185 kernels.

On sm_90 a launch may carry PROGRAMMATIC_STREAM_SERIALIZATION: the GPU may then launch the
kernel once every block of the previous one has executed `griddepcontrol.launch_dependents`
(or exited), and the kernel's `griddepcontrol.wait` returns when the previous kernel has
completed and its writes are visible. Every kernel of a plan compiled for sm_90 starts with
`aicf_pdl_entry()`: the wait, then the trigger, before its first access to memory (a small kernel
that reads nothing a running kernel writes instead triggers first and waits as it returns: [Note: work
before the wait] in passes/work_before_wait.py). So

- no kernel reads a buffer before its producer is complete, and none writes a buffer (the
  memory planner reuses the arena) before the kernels that read it are complete: the wait
  returns only when the previous kernel is complete, which itself waited for the one before
  (so what a kernel reads before its wait is the plan's constants or what kernels two or more
  launches back wrote: [Note: attention reads before the wait] in passes/fold_cache_writes.py,
  [Note: epilogue reads before the wait] in passes/early_epilogue.py);
- the next kernel is launched while this one runs and its blocks wait on the SMs as this
  one's retire: the launch latency overlaps the work instead of following it;
- run-ahead is one kernel: a kernel triggers only after its own wait has returned (but where the
  kernel before it leaves the DRAM idle: [Note: the trigger before the wait] in passes/early_trigger.py). Triggering
  before the wait instead (every kernel's blocks then land while two kernels before them still
  run) measured slower on an H200: a 4-layer decode plan of a 1 B Llama replayed in 300.4 us
  against 228.6 (benchmarks/results/decode_ab_session10_h200.txt). Nor does it pay for the small
  kernels alone (session 24, an H200, the same plan's timeline: [Note: timeline] in
  codegen/timeline.py, benchmarks/results/decode_timeline_session24_h200.txt): with the kernels of
  at most one block an SM after a one-wave kernel (the norms' one block, the decode attention's 96)
  triggering before their wait, the plan replayed in 231.0 us against 209.7. The next gemv's
  blocks then land while the bandwidth-bound kernel two before still streams, and their first
  weight requests slow it (the down projection 10.2 us in the chain against 8.2) by more than they
  save after (the norm before the gate/up 1.2 against 2.2 us, the QKV projection 4.5 against 5.7).
  Nor does a later trigger (the decode attention's, after its cache reads): [Note: the decode
  attention in the chain] in codegen/attention_split.py.

The alternative, one persistent kernel whose resident blocks run the kernels as phases between
grid barriers, measured slower on an H200: that 4-layer decode plan in 253.4 us against 220.5,
and 282.1 us with each phase requesting the next one's weights into L2 ahead (branch
session12-persistent-phases, benchmarks/results/persist_ab_session12_h200.txt): a grid barrier
costs about 1 us more than a dependent launch's boundary. A persistent kernel whose producer warp
streams both projections of a decode MLP through one shared-memory ring, never waiting on the
activations, fared little better (session 23, prototypes in benchmarks/prototypes/, an H200,
benchmarks/results/decode_chain_prototype_session23_h200.txt): the norm, gate/up and down of the
1 B Llama in 22.5-23.3 us a layer against 25.1 for this plan's three kernels alone, where one
launch that only streams the same 66 MB takes 17.5 us (and any launch that streams pays about
2.4 us beyond its bytes at 4.45 TB/s: 8 MB in 4.3 us, 22 MB in 7.5, 44 MB in 12.5). The down rows
wait in the ring until all of h exists and are then multiplied in a burst; splitting the down
weight by k-rows so that they need only the gate/up chunks that made their part of h removed the
wait but not the cost (29.7 us: the blocks' partial sums meet at the end).

Where a decode layer's time goes in the chain (session 24, the 4-layer plan's timeline,
benchmarks/results/decode_timeline_session24_h200.txt): about 42 us a layer, each kernel from its
start to the next one's: the norm 2.2 (1.3 after the down projection), QKV 5.7, attention 7.8,
O 4.1, gate/up 12.6, down 8.2, where the weights alone stream in 20.3 us at 4.45 TB/s. Every
kernel's blocks land before it may start, the down projection's 256 among them (from 1.6 us after
the gate/up starts until 1 us before its own start, as the gate/up's blocks retire): its early
weight reads are not lost to SMs the gate/up fills, contrary to session 23's guess. With exit stamps, a
boundary (the last block leaving to the next kernel's start) costs 0.2-0.5 us; the rest is the
kernels' own run, and two run longer in the chain than alone, where their bytes are warm in L2:
the attention 6.5 us (5.6 alone), the QKV projection 5.4 (4.5). A norm kernel's marginal cost
(the plan's replay less the replay without it) is -3.8 to +1.5 us: without it the gate/up's
blocks land and request their weights while the O projection still streams, as with the early
trigger above, which would explain why the norm folded into the gemv (session 14) ran the plan
slower.

Where a kernel's grid is more than one wave (more blocks than the SMs hold at once), a trigger at
entry would let the next kernel's blocks take SM slots that this kernel's later waves need, and
sit there waiting: those blocks trigger only in the last wave, `aicf_pdl_entry(from)` with `from`
the first linear block index of the last wave (blocks are dispatched in linear order; a block
before it triggers implicitly when it exits). The next launch then overlaps the last wave alone.
`trigger_from` computes it from the schedule's grid and the blocks an SM holds
(planner/hardware.blocks_per_sm); one wave or less gives 0, a trigger at entry, unless the kernel's
TL = 1 (passes/late_trigger.py, [Note: the trigger as the blocks exit]): where the next kernel has no work
before its wait, a one-wave grid lets it launch only as its own blocks exit (the trigger block past its last).

The wait is a no-op for a kernel launched without the attribute (the first of a plan, one
launched alone to profile it, the interface casts), so the same cubin runs either way. The
decision is the plan's `launch` mode ("dependent" or "stream"), recorded in the bundle per
kernel and read by the executor (aicf_run/pdl.py); `aicfc compile --no-pdl` keeps "stream".
"""
from __future__ import annotations

import math
import re

from aicfc.errors import AicfError
from aicfc.planner.hardware import Profile, blocks_per_sm

DEPENDENT, STREAM = "dependent", "stream"
MIN_SM = 90
ENTRY = "aicf_pdl_entry("
AHEAD_ENTRY = "aicf_pdl_trigger("   # [Note: work before the wait]
# A template may place this line where its kernel's entry belongs, after work that reads only
# the plan's constants (the gemv's first weight loads); without it the entry is the first
# statement. Left as it is (a comment) in a plan of plain launches.
MARK = "// [Note: PDL] the entry goes here"

# Defined in every module's header; a no-op where the architecture has no griddepcontrol.
HELPER = """// [Note: PDL] (aicfc/codegen/pdl.py): wait for the previous kernel of the plan to complete, then
// let the next one launch (blocks from linear index `from` on: the last wave); a no-op for a kernel
// launched without programmatic serialization.
__device__ __forceinline__ void aicf_pdl_trigger(unsigned from = 0u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (from == 0u || blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) >= from)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void aicf_pdl_entry(unsigned from = 0u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  aicf_pdl_trigger(from);
}
// [Note: work before the wait] (passes/work_before_wait.py): declared first in a kernel that triggers at its
// entry and works before its wait; the wait runs as each thread returns, so the kernel completes only after
// the one before it has.
struct AicfPdlLateWait {
  __device__ __forceinline__ ~AicfPdlLateWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  }
};
"""


def sm(target: str) -> int:
    m = re.fullmatch(r"sm_(\d+)a?", target)
    return int(m.group(1)) if m else 0


def choose(target: str, enabled: bool = True) -> tuple[str, str]:
    """The plan's launch mode and why."""
    if not enabled:
        return STREAM, "dependent launches turned off (aicfc compile --no-pdl)"
    if sm(target) < MIN_SM:
        return STREAM, f"{target} has no programmatic dependent launch (sm_{MIN_SM} and newer)"
    return DEPENDENT, ("each kernel waits for the previous one on the device (griddepcontrol.wait) and lets "
                       "the next one launch early (a grid of more than one wave from its last wave; along a CNN's "
                       "chain one wave only as its blocks exit: [Note: the trigger as the blocks exit]), so the "
                       "launch latency between kernels overlaps their work")


def trigger_from(grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, registers: int | None,
                 hw: Profile) -> int:
    """The first linear block index of the grid's last wave; 0 when the grid fits in one wave."""
    blocks = grid[0] * grid[1] * grid[2]
    per_sm, _ = blocks_per_sm(block[0] * block[1] * block[2], smem, registers or 0, hw)
    wave = max(1, per_sm) * hw.sm_count
    return 0 if blocks <= wave else (blocks - 1) // wave * wave


def entries(kernels, launch: str, hw: Profile) -> list[int]:
    """The trigger_from of each scheduled kernel of a plan launched as `launch`, in order (0 for
    plain launches, where nothing triggers)."""
    if launch != DEPENDENT:
        return [0] * len(kernels)
    return [math.prod(k.schedule.grid) if k.schedule.param.get("TL") else   # [Note: the trigger as the blocks exit]
            trigger_from(k.schedule.grid, k.schedule.block, k.schedule.smem_bytes, k.schedule.registers, hw)
            for k in kernels]


def entry_site(source: str, name: str) -> tuple[int, int, int]:
    """(start, end, depth) of where kernel `name`'s entry goes: the body's MARK line (replaced),
    else the start of its body (start == end); depth, the braces open there counted from the
    body's own (1: the body's outermost scope)."""
    brace = _body_brace(source, name)
    nxt = source.find("__global__", brace)
    mark = source.find(MARK, brace, len(source) if nxt < 0 else nxt)
    if mark < 0:
        return brace + 1, brace + 1, 1
    between = source[brace:mark]
    return mark, mark + len(MARK), between.count("{") - between.count("}")


def _body_brace(source: str, name: str) -> int:
    """Where kernel `name`'s body opens in `source` (the index of its `{`)."""
    m = re.search(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", source)
    if m is None:
        raise AicfError(f"internal: kernel {name!r} has no __global__ definition to start with {ENTRY}")
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
    brace = source.index("{", i)
    if source[i:brace].strip(" \n\t") and not source[i:brace].strip().startswith("__"):
        raise AicfError(f"internal: kernel {name!r}: unexpected text before its body: {source[i:brace]!r}")
    return brace


def call(entry: str, from_block: int = 0) -> str:
    """The statement calling `entry` (ENTRY or AHEAD_ENTRY, with its open parenthesis) from block `from_block`."""
    return entry + (f"{from_block}u);" if from_block else ");")


def trigger_first(source: str, name: str, from_block: int = 0) -> str:
    """`source` with kernel `name`'s trigger as the first statement of its body ([Note: the trigger before the
    wait] in passes/early_trigger.py); its entry, where the wait is, stays where it is (its trigger then a no-op)."""
    brace = _body_brace(source, name) + 1
    return source[:brace] + "\n  " + call(AHEAD_ENTRY, from_block) + source[brace:]


def ahead_entry(from_block: int = 0) -> str:
    """The entry of a kernel that works before its wait ([Note: work before the wait]): the trigger, then
    the object whose destructor waits as the thread returns."""
    return call(AHEAD_ENTRY, from_block) + " AicfPdlLateWait aicf_pdl_late;"


def instrument(source: str, name: str, from_block: int = 0, entry: str | None = None, ahead: bool = False) -> str:
    """`source` with the entry (trigger from block `from_block`) as the first statement of kernel
    `name`'s body, or in place of the body's MARK line where it has one; `entry`, a statement
    calling another entry in its place (codegen/timeline.py); `ahead`: the trigger and the wait as the
    kernel returns (`ahead_entry`), in the body's outermost scope only."""
    if entry is None:
        entry = ahead_entry(from_block) if ahead else call(ENTRY, from_block)
    start, end, depth = entry_site(source, name)
    if ahead and depth != 1:
        raise AicfError(f"internal: kernel {name!r} works before its wait, but its entry is not in its body's "
                        f"outermost scope")
    if start == end:
        return source[:start] + "\n  " + entry + source[start:]
    return source[:start] + entry + source[end:]
