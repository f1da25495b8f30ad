"""What a bundle's plans would each derive again from the same weights, derived once.

[Note: weights shared by a bundle's plans]
`compile_plans` compiles each shape set's plan on its own (import, passes, codegen), and each plan
reads the same weights: the High IR's text names every weight of the model by its SHA-256,
interleave_gates and relayout_weights write new copies of some, apply_precision converts every fp32
weight to the bundle's storage type, and the payload names every weight it stores by its SHA-256.
Each plan did all of it again. Profiled (session 52, the 20-layer 1 B Llama of benchmarks/generate.py,
4 GB of fp32 in its external-data file, its two plans, cubins cached): 107 s, of which the gate/up
interleaving 22 s, the conversions 17, the K-major copies 15, the payload's digests 15 and the High
IR's 9, and reading the file 19 s within them.

Inside `shared()` (compile_plans holds it for its plans) a derived value is remembered by the weight
bytes it came from: a `Lazy` source (a slice of the model's files, or a join or a scaling of such
slices) by its value, which is equal for the same bytes in every plan's import; bytes in memory by
identity (the converted bytes one plan made and the next reuses), kept alive and checked with `is` as
ir/memo.py's `by_identity` does, but only for the scope, and keyed by what is derived as well. Outside it nothing is kept, and
within it nothing that a plan could see differently: the same source bytes give the same digest and
the same conversion. Measured on a 2-core machine (`benchmarks/generate.py --compile-only --layers 20
--batch 1 --jobs 2`, cubins cached): 84-87 s before, 55 s after, the bundle byte-identical
(tests/test_shared_weights.py compares the payloads with and without it). The memory kept until the
end (a weight's fp32 interleaving, its [K, N] copy before the K-major one) is less than what the second
plan no longer allocates: the same compile's peak RSS 5.99 GB against 7.66 without.
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
