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
of each block stores both in the kernel's own array `aicf_tl_<kernel>` (STAMPS u64 a block, for
the first CAP blocks in linear order). Where the entry is in the body's outermost scope (always,
but where a template's MARK sits in a nested block), an object declared beside it stores the
clock a third time from its destructor, which C++ runs as thread 0 leaves the kernel by any
return. The kernel's code is otherwise the same, so its schedule is that of the plan without
stamps, plus three clock reads and three stores a block (ptxas may give it a register or two more).

From the stamps of one replay (aicf_run/timeline.py): a kernel starts (`go`) when its first
block passes the wait, which is when the kernel before it has completed; it is done when its last
block's thread 0 leaves; its time in the chain is the next kernel's go less its own, of which
the part after `done` is the boundary (the grid's completion, its writes made visible, the next
kernel's wait released). A block `landed early` when it reached the entry before its kernel's
go, that is, while the previous kernel was still running. A block that returns before its entry
(the split attention's blocks past the live keys) leaves its slots at zero, which the reader
counts as not reached.
"""
from __future__ import annotations

from aicfc.codegen import pdl

CAP = 4096          # blocks a kernel stamps (in linear order); the rest run unstamped
STAMPS = 3          # u64 a block: arrived, ready, exited
PREFIX = "aicf_tl_"
ENTRY = "aicf_timeline_entry("

# Defined in the module header of a plan compiled with --timeline (after pdl.HELPER).
HELPER = """// [Note: timeline] (aicfc/codegen/timeline.py): the dependent-launch entry between two reads of the
// global clock; thread 0 of each of the first `cap` blocks stores them (arrival, then the wait's return).
__device__ __forceinline__ unsigned long long aicf_timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  return t;
}
__device__ __forceinline__ bool aicf_timeline_stamps(unsigned cap, unsigned& b) {
  b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && b < cap;
}
__device__ __forceinline__ void aicf_timeline_entry(unsigned long long* stamps, unsigned cap, unsigned from = 0u) {
  const unsigned long long arrived = aicf_timeline_now();
  aicf_pdl_entry(from);
  const unsigned long long ready = aicf_timeline_now();
  unsigned b;
  if (aicf_timeline_stamps(cap, b)) {
    stamps[3 * b] = arrived;
    stamps[3 * b + 1] = ready;
  }
}
// Declared right after the entry in the kernel's outermost scope: its destructor runs as thread 0
// returns, whichever return it takes, and stores the clock then. No state: the array is a parameter.
template <unsigned long long* S, unsigned CAP>
struct AicfTimelineExit {
  __device__ __forceinline__ ~AicfTimelineExit() {
    unsigned b;
    if (aicf_timeline_stamps(CAP, b)) S[3 * b + 2] = aicf_timeline_now();
  }
};
"""


def symbol(kernel: str) -> str:
    """The name of `kernel`'s stamp array."""
    return PREFIX + kernel


def stamped_blocks(grid: tuple[int, int, int]) -> int:
    """The blocks of `grid` that store stamps: the first CAP in linear order."""
    return min(CAP, grid[0] * grid[1] * grid[2])


def exits_stamped(source: str, kernel: str) -> bool:
    """Whether kernel `kernel`'s entry site is in its body's outermost scope, where the exit stamp's
    destructor runs only as the kernel returns (elsewhere it would run at the end of a nested block)."""
    return pdl.entry_site(source, kernel)[2] == 1


def instrument(source: str, kernel: str, grid: tuple[int, int, int], from_block: int = 0) -> str:
    """`source` with kernel `kernel`'s stamp array declared before it and its entry stamped
    (where pdl.instrument would put the plain entry), with the exit stamp where exits_stamped."""
    n = stamped_blocks(grid)
    entry = f"{ENTRY}{symbol(kernel)}, {n}u" + (f", {from_block}u);" if from_block else ");")
    if exits_stamped(source, kernel):
        entry += f" AicfTimelineExit<{symbol(kernel)}, {n}u> aicf_tl_exit;"
    return (f"__device__ unsigned long long {symbol(kernel)}[{STAMPS * n}];\n"
            + pdl.instrument(source, kernel, from_block, entry=entry))
