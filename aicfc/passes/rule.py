"""A rewrite rule as data, the one shape every pass's rules share: `name`, `match` (the
pattern's roles at one anchor op, or None where there is no pattern), `check` (the reason the
rewrite is not legal or not worth it there, or None), and `build` (the rewritten ops with the
record explain shows). A pass runs its rules over its anchors and records both the rewrites it
applies and the ones whose check declines, with the reason.

Each pass fixes the types: the anchor it matches at (a Compute, a View, a Load), the roles its
match finds, its Context, and what build returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

Anchor = TypeVar("Anchor")
Roles = TypeVar("Roles")
Ctx = TypeVar("Ctx")
Built = TypeVar("Built")


@dataclass(frozen=True)
class Rule(Generic[Anchor, Roles, Ctx, Built]):
    name: str
    match: Callable[[Anchor, Ctx], Roles | None]
    check: Callable[[Roles, Ctx], str | None]
    build: Callable[[Roles, Ctx], Built]
