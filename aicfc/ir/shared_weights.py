"""What a bundle's plans would each derive again from the same weights, derived once.

[Note: weights shared by a bundle's plans]
`compile_plans` compiles each shape set's plan on its own (import, passes, codegen), and each plan
reads the same weights: the High IR's text names every weight of the model by its SHA-256,
apply_precision converts every fp32 weight to the bundle's storage type, and the payload names
every converted weight by its SHA-256 again. For the 1 B Llama (4 GB of fp32 in its external-data
file) that was most of a two-plan compile's time in Python (a 2-layer cut of it, cubins cached:
27.6 s of which 15 s printing the High IR's digests and 15 s converting, twice each).

Inside `shared()` (compile_plans holds it for its plans) a derived value is remembered by the weight
bytes it came from: a `Lazy` source (a slice of the model's files, or a join or a scaling of such
slices) by its value, which is equal for the same bytes in every plan's import; bytes in memory by
identity (the converted bytes one plan made and the next reuses). Outside it nothing is kept, and
within it nothing that a plan could see differently: the same source bytes give the same digest and
the same conversion.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from aicf_run.weights import Lazy

T = TypeVar("T")
_memo: dict[Hashable, tuple[Any, Any]] | None = None   # key -> (the source, kept alive; the value)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Remember derived values until the outermost `shared()` ends."""
    global _memo
    outer = _memo
    if outer is None:
        _memo = {}
    try:
        yield
    finally:
        if outer is None:
            _memo = None


def remember(kind: Hashable, source: Any, compute: Callable[[], T]) -> T:
    """`compute()`, or what it gave before for the same `kind` of the same source bytes inside `shared()`."""
    if _memo is None:
        return compute()
    if isinstance(source, Lazy):
        key: Hashable = (kind, "value", source)
        try:
            hit = _memo.get(key)
        except TypeError:   # a source that cannot be compared by value
            return compute()
    elif isinstance(source, (bytes, bytearray, memoryview)):
        key = (kind, "id", id(source))
        hit = _memo.get(key)
        if hit is not None and hit[0] is not source:
            hit = None
    else:
        return compute()
    if hit is not None:
        return hit[1]
    value = compute()
    _memo[key] = (source, value)
    return value
