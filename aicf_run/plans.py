"""Several plans in one bundle (format version 3): the layout's checks, each plan's view, and the
lookup of the plan whose input shapes equal the given ones. Pure Python, no GPU.

[Note: plans] `aicfc compile` with several shape sets compiles each set into its own plan (its
own kernels, buffers, arena and decision log) and stores the weights once: the payload's
`weights` are the weights section's blobs, end to end, and each plan's `weights` entries name a
blob by index instead of holding bytes. Blobs are shared by content (sha256 and length), so a
weight two plans both read is one blob, and a constant the compiler folded from a shape (it
differs per plan) is a blob of its own. Every plan places its weights buffers in one weights
region of `memory.weights_bytes` bytes (equal in every plan), and a blob read by several plans
sits at the same offset of it in each, so the device holds it once. Plans run one at a time on
one stream, so they share one arena, the largest plan's.

A plan's *view* is what a version-2 payload of that plan alone would hold (the shared fields,
then the plan's own, its weights entries resolved to the blob's section range or bytes); the
runtime's schema checks each view, and the executor runs one like any single-plan bundle.
Choosing a plan is a lookup of what the compiler decided: the plan whose every input shape
equals the given one, never a nearest or a padded one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from aicf_run.errors import RunError

PLANS_VERSION = 3
# Top-level keys every plan shares; every other key of a single-plan payload is the plan's own.
SHARED_KEYS = ("format_version", "compiler", "target", "precision", "model", "weights")
_RECOMPILE = "recompile the model with `aicfc compile`"


class NoPlanError(RunError):
    """The given inputs' shapes equal no plan's (one line: the shapes given, the shapes there are)."""


def shape_text(shape: Sequence[int]) -> str:
    """`1x512`; a scalar is `scalar` (the `--shape` syntax, where it has one)."""
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def plan_name(inputs: Sequence[Mapping[str, Any]]) -> str:
    """A plan's name: its input shapes in the bundle's input order, e.g. `ids=1x512 mask=1x512`."""
    return " ".join(f"{item['name']}={shape_text(item['shape'])}" for item in inputs)


def select_plan(plans: Sequence[Sequence[Mapping[str, Any]]], shapes: Mapping[str, Sequence[int]]) -> int:
    """The index of the plan (given by its `inputs` records) whose every input shape equals
    `shapes[name]`; NoPlanError naming the given shapes and every plan's when none does.
    Inputs missing from `shapes` match nothing: names are checked by the caller."""
    given = {name: tuple(shape) for name, shape in shapes.items()}
    for index, inputs in enumerate(plans):
        if all(given.get(item["name"]) == tuple(item["shape"]) for item in inputs):
            return index
    names = [item["name"] for item in plans[0]] if plans else sorted(given)
    text = " ".join(f"{n}={shape_text(given[n]) if n in given else '?'}" for n in names)
    have = "; ".join(plan_name(inputs) for inputs in plans)
    raise NoPlanError(f"no plan for input shapes {text}: this bundle has {len(plans)} plan(s), "
                      f"for {have}; pass inputs of one of those shapes, or compile the model "
                      f"with a --shape set for these")


def plan_index(plans: Sequence[Sequence[Mapping[str, Any]]], plan: int | str) -> int:
    """`plan` as an index: an int in range, or a plan's name (`plan_name`)."""
    names = [plan_name(inputs) for inputs in plans]
    if isinstance(plan, int) and not isinstance(plan, bool) and 0 <= plan < len(plans):
        return plan
    if isinstance(plan, str):
        if plan in names:
            return names.index(plan)
        if plan.isdigit() and int(plan) < len(plans):
            return int(plan)
    raise RunError(f"no plan {plan!r}: this bundle's plans are "
                   f"{'; '.join(f'{i}: {n}' for i, n in enumerate(names))}")


def plan_views(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each plan of a version-3 payload (one `check_plans` passed) as a single-plan payload."""
    blobs = payload["weights"]
    shared = {key: payload[key] for key in SHARED_KEYS if key != "weights"}
    views = []
    for plan in payload["plans"]:
        weights = [{"buffer": entry["buffer"], **_blob_fields(blobs[entry["blob"]])}
                   for entry in plan["weights"]]
        views.append({**shared, **{k: v for k, v in plan.items() if k != "weights"}, "weights": weights})
    return views


def _blob_fields(blob: Mapping[str, Any]) -> dict[str, Any]:
    if "data" in blob:
        return {"data": blob["data"], "sha256": blob["sha256"]}
    return {"offset": blob["offset"], "nbytes": blob["nbytes"], "sha256": blob["sha256"]}


def check_plans(payload: Any, section_bytes: int | None, digests: bool = True) -> None:
    """Raise RunError naming the first field of a version-3 payload that breaks the layout of
    [Note: plans]; each plan's view is then checked by the version-2 schema (`check_payload`).

    `section_bytes`: the file's weights section length, None for a payload in memory (every
    blob inline, `data`)."""
    from aicf_run.schema import check_payload   # the schema imports nothing from here

    if not isinstance(payload, dict):
        _fail("payload", "must be a map")
    for key in (*SHARED_KEYS, "plans"):
        if key not in payload:
            _fail(key, "is missing")
    blobs = payload.get("weights")
    if not isinstance(blobs, (list, tuple)) or not all(isinstance(b, dict) for b in blobs):
        _fail("weights", "must be a list of maps (the weights section's blobs)")
    end = 0
    for i, blob in enumerate(blobs):
        keys = {"data", "sha256"} if "data" in blob or section_bytes is None else {"offset", "nbytes", "sha256"}
        if set(blob) != keys:
            _fail(f"weights[{i}]", f"has keys {sorted(map(str, blob))}, expected {sorted(keys)}")
        if "data" in blob:
            continue
        offset, nbytes = blob.get("offset"), blob.get("nbytes")
        if not _is_int(offset) or offset != end:
            _fail(f"weights[{i}].offset", f"is {offset!r}, expected {end} (blobs lie end to end in order)")
        if not _is_int(nbytes) or nbytes < 0:
            _fail(f"weights[{i}].nbytes", f"is {nbytes!r}, expected a non-negative int")
        end += nbytes
    if section_bytes is not None and end != section_bytes:
        _fail("weights", f"fill {end} bytes of the {section_bytes}-byte weights section; the file is corrupt")
    plans = payload.get("plans")
    if not isinstance(plans, (list, tuple)) or not plans or not all(isinstance(p, dict) for p in plans):
        _fail("plans", "must be a non-empty list of maps")
    for p, plan in enumerate(plans):
        own = sorted(str(key) for key in plan if key in SHARED_KEYS and key != "weights")
        if own:
            _fail(f"plans[{p}].{own[0]}", "is shared by every plan; it belongs at the top level")
        entries = plan.get("weights")
        if not isinstance(entries, (list, tuple)) or not all(isinstance(e, dict) for e in entries):
            _fail(f"plans[{p}].weights", "must be a list of maps")
        for i, entry in enumerate(entries):
            if set(entry) != {"buffer", "blob"} or not _is_int(entry["blob"]) or not 0 <= entry["blob"] < len(blobs):
                _fail(f"plans[{p}].weights[{i}]", f"must be {{buffer, blob}} with blob in 0..{len(blobs) - 1}")
    views = plan_views(payload)
    for p, view in enumerate(views):
        try:
            check_payload(view, PLANS_VERSION, section_bytes, digests)
        except RunError as err:
            raise RunError(f"plans[{p}]: {err}") from None
    _check_shared(plans, views, len(blobs))


def _check_shared(plans: Sequence[dict[str, Any]], views: list[dict[str, Any]], blob_count: int) -> None:
    """What makes the plans one model over one copy of the weights: the same input and output
    names and dtypes, distinct input shapes, one weights region, each blob at one offset."""
    first = views[0]
    signature = lambda v, key: [(t["name"], t["dtype"]) for t in v[key]]  # noqa: E731
    names: dict[str, int] = {}
    where: dict[int, int] = {}
    for p, view in enumerate(views):
        for key in ("inputs", "outputs"):
            if signature(view, key) != signature(first, key):
                _fail(f"plans[{p}].{key}", f"names and dtypes {signature(view, key)} differ from "
                                           f"plans[0]'s {signature(first, key)}")
        if view["memory"]["weights_bytes"] != first["memory"]["weights_bytes"]:
            _fail(f"plans[{p}].memory.weights_bytes", f"is {view['memory']['weights_bytes']}, but the plans "
                                                      f"share one region of {first['memory']['weights_bytes']}")
        name = plan_name(view["inputs"])
        if name in names:
            _fail(f"plans[{p}].inputs", f"shapes {name} repeat plans[{names[name]}]'s; a lookup needs distinct shapes")
        names[name] = p
        used = set()
        for i, entry in enumerate(plans[p]["weights"]):
            blob, offset = entry["blob"], view["buffers"][entry["buffer"]]["offset"]
            if blob in used:
                _fail(f"plans[{p}].weights[{i}].blob", f"{blob} is read by two buffers of one plan")
            used.add(blob)
            if where.setdefault(blob, offset) != offset:
                _fail(f"plans[{p}].weights[{i}]", f"blob {blob} is at weights offset {offset}, but at "
                                                  f"{where[blob]} in an earlier plan; plans share it in place")
    unused = sorted(set(range(blob_count)) - set(where))
    if unused:
        _fail(f"weights[{unused[0]}]", "is read by no plan")
    # Distinct blobs never overlap in the region: a plan's upload skips an offset already
    # filled (aicf_run.executor.Shared), which is only right when the bytes there are its own.
    size = {entry["blob"]: view["buffers"][entry["buffer"]]["nbytes"]
            for plan, view in zip(plans, views) for entry in plan["weights"]}
    extents = sorted((offset, offset + size[blob], blob) for blob, offset in where.items())
    for (_, end, blob), (start, _, other) in zip(extents, extents[1:]):
        if start < end:
            _fail("plans", f"blobs {blob} and {other} overlap in the weights region (bytes {start}..{end})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(field: str, problem: str) -> NoReturn:
    raise RunError(f"bad bundle field {field}: {problem}; {_RECOMPILE}")


@dataclass(frozen=True)
class PlanInfo:
    """What a caller may ask of a plan: its index, its name, and its input shapes."""

    index: int
    name: str
    shapes: dict[str, tuple[int, ...]]


def plan_infos(plans: Sequence[Sequence[Mapping[str, Any]]]) -> tuple[PlanInfo, ...]:
    """A PlanInfo per plan, given each plan's `inputs` records."""
    return tuple(PlanInfo(i, plan_name(inputs), {item["name"]: tuple(item["shape"]) for item in inputs})
                 for i, inputs in enumerate(plans))


def input_shapes(inputs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every given input (numpy arrays and GPU tensors of other libraries all have
    `shape`); a value without one raises RunError."""
    shapes = {}
    for name, value in inputs.items():
        shape = getattr(value, "shape", None)
        if shape is None:
            raise RunError(f"input {name!r} is a {type(value).__name__}, which has no shape; pass a "
                           f"numpy array or a GPU tensor")
        shapes[name] = tuple(int(d) for d in shape)
    return shapes
