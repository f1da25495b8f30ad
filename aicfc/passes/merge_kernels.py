"""What the Decision IR rewrites that merge a kernel into the one reading its result share
(pool_epilogue: a convolution and its max pool; fold_row_scale: a norm and the gemv reading it):
who reads what, the `--pin KEY=0|1` switch, and the decision by the planner's predictions with both
figures in the record.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite, loads

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile


def kernel_readers(plan: Plan) -> dict[str, list[Kernel]]:
    """buffer -> the kernels that read it (each once, in plan order), not the one computing it."""
    readers: dict[str, list[Kernel]] = {}
    for k in plan.kernels:
        for b in {ld.buffer for op in k.ops for ld in loads(op.body)} - k.outs:
            readers.setdefault(b, []).append(k)
    return readers


def sites(plan: Plan, rule: str, why_not: Callable[[Plan, int], str | None], quiet: tuple[str, ...],
          records: list[Rewrite]) -> Iterator[tuple[int, Kernel]]:
    """(index, kernel) of each kernel `why_not` finds nothing against, in plan order; a kernel it declines for a
    reason other than `quiet` (those the rule never concerns) gets its record in `records` as the walk passes it."""
    for i, k in enumerate(plan.kernels):
        why = why_not(plan, i)
        if why is None:
            yield i, k
        elif why not in quiet:
            records.append(Rewrite(rule, k.name, False, why))


def switch(pin: dict | None, key: str, apart: str, merged: str) -> str | None:
    """The value of `--pin key=0|1` ("0": apart, "1": merged wherever legal), None when not pinned."""
    forced = (pin or {}).get(key)
    if forced is not None and str(forced) not in ("0", "1"):
        raise AicfError(f"--pin {key}={forced}: expected {key}=0 ({apart}) or {key}=1 ({merged})")
    return None if forced is None else str(forced)


def left_by_pin(plan: Plan, name: str, key: str, value: str | None) -> str | None:
    """Why a pass that would change kernel `name`'s schedule leaves it as it is: its switch `--pin key=0` (`value`,
    from `switch`), or the `--pin` record that chose that schedule; None where neither does."""
    if value == "0":
        return f"--pin {key}=0"
    pinned = next((r.rule for r in plan.rewrites if r.target == name and r.rule.startswith("--pin ")), None)
    return f"its schedule is the user's ({pinned})" if pinned else None


def declined_for_unit(pin: dict | None, unit: str, forced: str | None, rule: str,
                      sites: list[tuple[str, str]]) -> tuple[Rewrite, ...]:
    """Where a plan-wide `--pin unit=X` asks for another unit than `unit` (the one the merged kernel runs
    on) and the switch is not pinned: the record of each site (its stored tensor, the kernel as the
    record names it) declined; else nothing, and the merges are weighed."""
    pinned = (pin or {}).get("unit")
    if pinned is None or pinned == unit or forced is not None:
        return ()
    return tuple(Rewrite(rule, site, False, f"{what}: --pin unit={pinned} asks for another unit")
                 for site, what in sites)


def decide(plan: Plan, new: Plan, first: Kernel, second: Kernel, merged: Kernel, rule: str, site: str,
           doing: str, forced: str | None, key: str, hw: Profile, tail: str = "") -> tuple[Plan, Rewrite]:
    """`new` (the plan with `merged` in place of `first` and `second`) where the planner predicts the merged
    kernel faster than the two apart (or `--pin key=1`), else `plan`; and the record with both figures.
    `doing`: what the merged kernel does, as the record says it ("pooling its tiles")."""
    from aicfc.passes.plan_schedules import fastest
    t_apart = fastest(first, plan, hw) + fastest(second, plan, hw)
    t_one = fastest(merged, new, hw)
    how = f"; --pin {key}={forced}" if forced is not None else ""
    numbers = (f"predicted {t_one:.2f} us for {merged.name} {doing} against {t_apart:.2f} us for "
               f"{first.name} and {second.name}")
    if t_one < t_apart if forced is None else forced == "1":
        saved = 2 * plan.types()[site].nbytes
        return new, Rewrite(rule, site, True, f"{numbers}; {site!r} neither stored nor read back{tail}{how}", saved)
    return plan, Rewrite(rule, site, False, f"kept apart: {numbers}{how}")
