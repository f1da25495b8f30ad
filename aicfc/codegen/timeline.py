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

Phases: where the time between a kernel's go and its last exit goes. A template may mark up to
PHASES points of its body with a line `// [Note: timeline] phase N: what` (PHASE_MARK; N from 0,
each at most once, in the order thread 0 passes them); a plain plan keeps the comment, a stamped one
gets thread 0's clock there (`aicf_timeline_phase`, slot 3 + N of the block's stamps). A block whose
thread 0 leaves before a mark (a cluster's ranks past 0 after the merge) leaves that slot at zero,
which the reader skips. The bundle's timeline record names the phases (`phase_labels`); the gemv
(templates/gemm_gemv.cu.j2) marks its last weight step, its warps' sums and its splits' merge, the
split attention (templates/attention_split.cu.j2) its staged query, its first tile landed, its scores, its
softmax, its key loop's end, its warps' merge and its cluster's barrier (the peers' pushes landed).

From the stamps of one replay (aicf_run/timeline.py): a kernel starts (`go`) when its first
block passes the wait, which is when the kernel before it has completed; it is done when its last
block's thread 0 leaves; its time in the chain is the next kernel's go less its own, of which
the part after `done` is the boundary (the grid's completion, its writes made visible, the next
kernel's wait released). A block `landed early` when it reached the entry before its kernel's
go, that is, while the previous kernel was still running. A block that returns before its entry
(the split attention's blocks past the live keys) leaves its slots at zero, which the reader
counts as not reached.

[Note: a joined role's stamps]
A gemv joined to the launch before it ([Note: a gemv joined to the launch before it] in codegen/join.py) has an
array of its own, one row per block of the role (the launch's blocks past the host's, `skip`), and is read as a
kernel after its host: it arrives with the launch, its `go` is its dependent-launch wait's return (the launch
before complete), its phases say when its slice was requested and had landed and when the host's output was
published, and its exit is its last statement. The host's time in the chain is then the role's go less its own
(about nothing), the role's the whole launch's from there.
"""
from __future__ import annotations

import re

from aicfc.codegen import pdl
from aicfc.errors import AicfError

CAP = 4096          # blocks a kernel stamps (in linear order); the rest run unstamped
PHASES = 8          # marks a kernel body may carry (module docstring: phases)
STAMPS = 3 + PHASES  # u64 a block: arrived, ready, exited, then each phase
PREFIX = "aicf_tl_"
ENTRY = "aicf_timeline_entry("
AHEAD_ENTRY = "aicf_timeline_ahead_entry("
PHASE_MARK = "// [Note: timeline] phase {n}: {what}"
_MARK = re.compile(r"// \[Note: timeline\] phase (\d+): ([^\n]*)")
# A joined role's entry, wait and exit ([Note: a joined role's stamps]): comments in a plain plan's source.
ROLE_MARKS = ("// [Note: timeline] role arrived", "// [Note: timeline] role ready", "// [Note: timeline] role exit")
LABEL_MAX = 40      # characters of a phase's name in the bundle (aicf_run/schema.py checks it)

# Defined in the module header of a plan compiled with --timeline (after pdl.HELPER).
HELPER = """// [Note: timeline] (aicfc/codegen/timeline.py): the dependent-launch entry between two reads of the
// global clock; thread 0 of each of the first `cap` blocks stores them (arrival, then the wait's return).
__device__ __forceinline__ unsigned long long aicf_timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  return t;
}
// `skip`: the launch's blocks before the kernel's own (a joined role's: [Note: a joined role's stamps]).
__device__ __forceinline__ bool aicf_timeline_stamps(unsigned cap, unsigned& b, unsigned skip = 0u) {
  b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) - skip;
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && b < cap;
}
__device__ __forceinline__ void aicf_timeline_entry(unsigned long long* stamps, unsigned cap, unsigned from = 0u) {
  const unsigned long long arrived = aicf_timeline_now();
  aicf_pdl_entry(from);
  const unsigned long long ready = aicf_timeline_now();
  unsigned b;
  if (aicf_timeline_stamps(cap, b)) {
    stamps[STAMPS_ * b] = arrived;
    stamps[STAMPS_ * b + 1] = ready;
  }
}
// [Note: work before the wait]: a kernel that triggers at its entry stamps its arrival twice (it waits as it returns).
__device__ __forceinline__ void aicf_timeline_ahead_entry(unsigned long long* stamps, unsigned cap, unsigned from = 0u) {
  const unsigned long long arrived = aicf_timeline_now();
  aicf_pdl_trigger(from);
  unsigned b;
  if (aicf_timeline_stamps(cap, b)) {
    stamps[STAMPS_ * b] = arrived;
    stamps[STAMPS_ * b + 1] = arrived;
  }
}
// Declared right after the entry in the kernel's outermost scope: its destructor runs as thread 0
// returns, whichever return it takes, and stores the clock then. No state: the array is a parameter.
template <unsigned long long* S, unsigned CAP>
struct AicfTimelineExit {
  __device__ __forceinline__ ~AicfTimelineExit() {
    unsigned b;
    if (aicf_timeline_stamps(CAP, b)) S[STAMPS_ * b + 2] = aicf_timeline_now();
  }
};
// A phase mark of the kernel's body: thread 0's clock as it passes it.
__device__ __forceinline__ void aicf_timeline_phase(unsigned long long* stamps, unsigned cap, unsigned phase,
                                                    unsigned skip = 0u) {
  unsigned b;
  if (aicf_timeline_stamps(cap, b, skip)) stamps[STAMPS_ * b + 3 + phase] = aicf_timeline_now();
}
// A joined role's entry ([Note: a joined role's stamps]): its arrival, then the clock as its wait returns.
__device__ __forceinline__ void aicf_timeline_role_ready(unsigned long long* stamps, unsigned cap, unsigned skip,
                                                        unsigned long long arrived) {
  unsigned b;
  if (aicf_timeline_stamps(cap, b, skip)) {
    stamps[STAMPS_ * b] = arrived;
    stamps[STAMPS_ * b + 1] = aicf_timeline_now();
  }
}
__device__ __forceinline__ void aicf_timeline_role_exit(unsigned long long* stamps, unsigned cap, unsigned skip) {
  unsigned b;
  if (aicf_timeline_stamps(cap, b, skip)) stamps[STAMPS_ * b + 2] = aicf_timeline_now();
}
""".replace("STAMPS_", str(STAMPS))


def symbol(kernel: str) -> str:
    """The name of `kernel`'s stamp array."""
    return PREFIX + kernel


def stamped_blocks(grid: tuple[int, int, int]) -> int:
    """The blocks of `grid` that store stamps: the first CAP in linear order."""
    return min(CAP, grid[0] * grid[1] * grid[2])


def phase_mark(n: int, what: str) -> str:
    """The line a template puts where phase `n` of its kernel ends (module docstring: phases)."""
    assert 0 <= n < PHASES and 0 < len(what) <= LABEL_MAX and "\n" not in what, (n, what)
    return PHASE_MARK.format(n=n, what=what)


def _stamp_phases(source: str, kernel: str, cap: int, skip: int = 0) -> str:
    """`source` with each phase mark a stamp into `kernel`'s array (the mark's words kept as a comment); `skip`:
    the launch's blocks before the kernel's own."""
    seen: set[int] = set()
    after = f", {skip}u" if skip else ""

    def stamp(m: re.Match) -> str:
        n = int(m.group(1))
        assert n < PHASES and n not in seen, f"kernel {kernel}: phase {n} marked twice or past {PHASES}"
        seen.add(n)
        return f"aicf_timeline_phase({symbol(kernel)}, {cap}u, {n}u{after});   // phase {n}: {m.group(2)}"
    return _MARK.sub(stamp, source)


def instrument_role(source: str, kernel: str, grid: tuple[int, int, int], skip: int) -> str:
    """A joined role's rendered device function with its own stamps ([Note: a joined role's stamps]): `kernel`'s
    array declared before it, its ROLE_MARKS and phase marks stamps of the blocks past the launch's first `skip`."""
    n = stamped_blocks(grid)
    arrived, ready, left = ROLE_MARKS
    if not all(source.count(m) == 1 for m in ROLE_MARKS):
        raise AicfError(f"internal: joined kernel {kernel} lacks its timeline marks")
    sym = symbol(kernel)
    source = (source.replace(arrived, "const unsigned long long aicf_tl_arrived = aicf_timeline_now();")
              .replace(ready, f"aicf_timeline_role_ready({sym}, {n}u, {skip}u, aicf_tl_arrived);")
              .replace(left, f"aicf_timeline_role_exit({sym}, {n}u, {skip}u);"))
    return f"__device__ unsigned long long {sym}[{STAMPS * n}];\n" + _stamp_phases(source, kernel, n, skip)


def phase_labels(source: str, kernel: str) -> list[str]:
    """The names of kernel `kernel`'s phases, by index, from a module source compiled with --timeline
    (a phase no mark names: empty)."""
    found = re.findall(re.escape(f"aicf_timeline_phase({symbol(kernel)}, ")
                       + r"\d+u, (\d+)u(?:, \d+u)?\);   // phase \d+: ([^\n]*)", source)
    labels = [""] * (1 + max((int(n) for n, _ in found), default=-1))
    for n, what in found:
        labels[int(n)] = what
    return labels


def exits_stamped(source: str, kernel: str) -> bool:
    """Whether kernel `kernel`'s entry site is in its body's outermost scope, where the exit stamp's
    destructor runs only as the kernel returns (elsewhere it would run at the end of a nested block)."""
    return pdl.entry_site(source, kernel)[2] == 1


def instrument(source: str, kernel: str, grid: tuple[int, int, int], from_block: int = 0, ahead: bool = False) -> str:
    """`source` with kernel `kernel`'s stamp array declared before it and its entry stamped
    (where pdl.instrument would put the plain entry), with the exit stamp where exits_stamped;
    `ahead`: a kernel that works before its wait ([Note: work before the wait]), whose exit stamp
    follows the wait it does as it returns (the waiting object is declared after the stamping one)."""
    n = stamped_blocks(grid)
    entry = f"{AHEAD_ENTRY if ahead else ENTRY}{symbol(kernel)}, {n}u" + (f", {from_block}u);" if from_block else ");")
    if exits_stamped(source, kernel):
        entry += f" AicfTimelineExit<{symbol(kernel)}, {n}u> aicf_tl_exit;"
    if ahead:
        entry += " AicfPdlLateWait aicf_pdl_late;"
    return (f"__device__ unsigned long long {symbol(kernel)}[{STAMPS * n}];\n"
            + _stamp_phases(pdl.instrument(source, kernel, from_block, entry=entry, ahead=ahead), kernel, n))
