"""Which candidates of a schedule space a build test compiles.

[Note: candidate sweeps]
A sweep test renders candidates of a space into one module and asks ptxas that none spills; a gemv
space holds 60-160 candidates, and compiling all of them took a third of the suite's CPU (session 51:
1.4 of 3.8 thousand seconds). By default a sweep compiles a covering subset instead: every pair of
values two keys take together somewhere in the space is held by at least one candidate built, the
candidates taken greedily from the highest register pressure down (planner/cost.estimate_registers,
where the caller gives it), so the riskiest shapes come first; a gemv space keeps about 40% of its
candidates. AICF_EVERY_CANDIDATE=1 (`make test-every`) builds every one; run it after changing a
template, as the commit that introduced the subset did.
"""

from __future__ import annotations

import itertools
import os
from typing import Callable, Mapping, Sequence

EVERY = "AICF_EVERY_CANDIDATE"


def to_build(space: Sequence[Mapping], pressure: Callable[[Mapping], float] | None = None) -> list[Mapping]:
    """`space`'s candidates to compile, in their order in `space` ([Note: candidate sweeps])."""
    if os.environ.get(EVERY) == "1":
        return list(space)
    order = sorted(range(len(space)), key=lambda i: -pressure(space[i])) if pressure else range(len(space))
    covered: set = set()
    keep = []
    for i in order:
        items = sorted(space[i].items(), key=repr)
        pairs = set(itertools.combinations(items, 2)) | {(a,) for a in items}
        if not pairs <= covered:
            covered |= pairs
            keep.append(i)
    return [space[i] for i in sorted(keep)]
