"""Stamps that show how a plan's kernels overlap as they run (`aicfc compile --timeline`,
read by `aicf-run --timeline`, aicf_run/timeline.py).

[Note: timeline]
`aicf-run --profile` times each kernel alone; the plan's own time is more or less than their
sum, and in a plan of dependent launches ([Note: PDL], codegen/pdl.py) the difference depends
on when each kernel's blocks reach the SMs: a block that lands while the previous kernel still
runs issues its early reads (the gemv's weights, [Note: gemv weights before the wait]) and
waits; one that lands after it has finished starts cold. Nothing outside the kernels can see
that, so a plan compiled with --timeline records it from inside: every kernel's entry
(`aicf_pdl_entry`, the first statement that may wait) becomes `aicf_timeline_entry`, which
reads the GPU's global nanosecond clock (%globaltimer) before and after the wait, and thread 0
of each block stores both in the kernel's own array `aicf_tl_<kernel>` (two u64 a block, for
the first CAP blocks in linear order). The kernel's code is otherwise the same, so its
registers and schedule are those of the plan without stamps, plus the two clock reads and one
store a block.

From the stamps of one replay (aicf_run/timeline.py): a kernel starts (`go`) when its first
block passes the wait, which is when the kernel before it has completed; its time in the chain
is the next kernel's go less its own; and a block `landed early` when it reached the entry
before its kernel's go, that is, while the previous kernel was still running. A block that
returns before its entry (the split attention's blocks past the live keys) leaves its slot at
zero, which the reader counts as not reached.
"""
from __future__ import annotations

from aicfc.codegen import pdl

CAP = 4096          # blocks a kernel stamps (in linear order); the rest run unstamped
PREFIX = "aicf_tl_"
ENTRY = "aicf_timeline_entry("

# Defined in the module header of a plan compiled with --timeline (after pdl.HELPER).
HELPER = """// [Note: timeline] (aicfc/codegen/timeline.py): the dependent-launch entry between two reads of the
// global clock; thread 0 of each of the first blocks stores them (arrival, then the wait's return).
__device__ __forceinline__ void aicf_timeline_entry(unsigned long long* stamps, unsigned cap, unsigned from = 0u) {
  unsigned long long arrived, ready;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(arrived) :: "memory");
  aicf_pdl_entry(from);
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ready) :: "memory");
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && b < cap) {
    stamps[2 * b] = arrived;
    stamps[2 * b + 1] = ready;
  }
}
"""


def symbol(kernel: str) -> str:
    """The name of `kernel`'s stamp array."""
    return PREFIX + kernel


def stamped_blocks(grid: tuple[int, int, int]) -> int:
    """The blocks of `grid` that store stamps: the first CAP in linear order."""
    return min(CAP, grid[0] * grid[1] * grid[2])


def instrument(source: str, kernel: str, grid: tuple[int, int, int], from_block: int = 0) -> str:
    """`source` with kernel `kernel`'s stamp array declared before it and its entry stamped
    (where pdl.instrument would put the plain entry)."""
    n = stamped_blocks(grid)
    entry = f"{ENTRY}{symbol(kernel)}, {n}u" + (f", {from_block}u);" if from_block else ");")
    return (f"__device__ unsigned long long {symbol(kernel)}[{2 * n}];\n"
            + pdl.instrument(source, kernel, from_block, entry=entry))
