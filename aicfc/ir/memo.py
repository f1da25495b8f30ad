"""Memoization by object identity, for pure functions of immutable IR objects.

`functools.lru_cache` hashes its argument on every call, and an IR dataclass hashes its whole
expression tree each time (slotted frozen dataclasses do not keep their hash): for the
planner's thousands of questions about the same few ops that costs more than the answer.
Here the key is `id(arg)`; the entry keeps the argument alive, so the id cannot be reused
while the entry exists, and an `is` check guards against a stale entry all the same.

`last_by_identity` keeps one entry, the last call's: for a pure function of several objects
that are asked about in runs (the cost model's bytes of a kernel under one types mapping, which
ranking asks for every candidate of the kernel in a row), where a full cache would keep every
mapping alive. The entry is read and replaced as one tuple, so a thread never pairs one call's
arguments with another's answer.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

T = TypeVar("T")
MAX_ENTRIES = 1 << 16


def by_identity(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    cache: dict[int, tuple[Any, T]] = {}

    @functools.wraps(fn)
    def wrapper(arg: Any) -> T:
        hit = cache.get(id(arg))
        if hit is not None and hit[0] is arg:
            return hit[1]
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        result = fn(arg)
        cache[id(arg)] = (arg, result)
        return result
    return wrapper


def last_by_identity(fn: Callable[..., T]) -> Callable[..., T]:
    last: list[tuple[tuple[Any, ...], Any]] = [((), None)]

    @functools.wraps(fn)
    def wrapper(*args: Any) -> T:
        seen, result = last[0]
        if len(seen) == len(args) and all(a is b for a, b in zip(seen, args)):
            return result
        result = fn(*args)
        last[0] = (args, result)
        return result
    return wrapper
