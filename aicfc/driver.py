"""compile_model: the whole compile path, ONNX in, bundle payload out. No GPU needed."""
from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path
from typing import Any, Callable

import onnx

from aicfc.artifact.payload import build_payload, converted
from aicfc.artifact.plans import merge_plans
from aicfc.codegen import pdl
from aicfc.codegen.greedy_feed import add_greedy_feed
from aicfc.codegen.io_cast import build_casts
from aicfc.codegen.module import OnKernel, build_modules, count_registers, resolve_jobs
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import MAX_MODEL_BYTES, check_model, import_model, load_model, parse_shape_overrides
from aicfc.ir.shared_weights import shared
from aicfc.passes.apply_precision import check_precision
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.relayout_weights import DECIDING, GEMV_PIN, GEMV_RULE, ONE_ROW
from aicfc.passes.plan_schedules import pins_unused
from aicfc.planner.hardware import load_profile



def load(model: Any) -> tuple[onnx.ModelProto, str, str]:
    """(model, name, sha256 of its bytes) from a path or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        check_model(model, f"model {model.graph.name or '(unnamed)'!r}")
        data = model.SerializeToString()
        return model, model.graph.name or "model", hashlib.sha256(data).hexdigest()
    path = Path(os.fspath(model))
    data = path.read_bytes() if path.is_file() and path.stat().st_size <= MAX_MODEL_BYTES else None
    proto = load_model(path, data)   # checks the path and size itself when data is None
    return proto, path.stem, hashlib.sha256(data if data is not None else path.read_bytes()).hexdigest()


PIN_WORD = "pin:"   # a --shape-sets line's word `pin:[NODE:]KEY=VALUE`: a --pin of that plan alone


def parse_pins(items: list[str] | tuple[str, ...], what: str = "--pin {!r}",
               example: str = "--pin unit=simt") -> dict[str, str]:
    """`KEY=VALUE` / `NODE:KEY=VALUE` items as {key: value} (passes/plan_schedules.node_pins)."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise AicfError(f"{what.format(item)}: expected KEY=VALUE or NODE:KEY=VALUE, e.g. {example}")
        out[key.strip()] = value.strip()
    return out


def split_set(words: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """A shape set's shape specs and its own pins (its `pin:` words)."""
    pins = [w[len(PIN_WORD):] for w in words if w.startswith(PIN_WORD)]
    return ([w for w in words if not w.startswith(PIN_WORD)],
            parse_pins(pins, what="shape set word 'pin:{}'", example="pin:unit=simt"))


def compile_model(model: Any, target: str = "sm_90", precision: str = "fp32",
                  shapes: dict[str, tuple[int, ...]] | list[str] | None = None,
                  dump_ir: str | Path | None = None, profile_path: str | Path | None = None,
                  on_stage: Callable[[str], None] | None = None, jobs: int | None = None,
                  on_kernel: OnKernel | None = None, pin: dict[str, Any] | None = None,
                  inplace: bool = True, check_registers: bool = True, dependent_launch: bool = True,
                  check_pins: bool = True, timeline: bool = False) -> dict[str, Any]:
    """The bundle payload of `model`; `jobs` parallel nvcc runs (None: $AICF_JOBS or the CPU
    count), `on_kernel` as in `build_modules`. --dump-ir also writes module_<i>.cu per module.
    `pin` ({param: value}) restricts the schedule of every kernel whose space has those params;
    `inplace=False` gives every stored tensor bytes of its own (for debugging);
    `check_registers=False` ranks on estimated registers alone (no ptxas runs while planning);
    `dependent_launch=False` launches the kernels plainly ([Note: PDL] in codegen/pdl.py);
    `timeline=True` makes every kernel stamp its entry for `aicf-run --timeline` ([Note: timeline]
    in codegen/timeline.py); `check_pins=False` leaves the check that the plan-wide pins restrict some kernel to the caller
    (`compile_plans`: a key one plan lacks another may have)."""
    check_precision(precision)
    jobs = resolve_jobs(jobs)
    if isinstance(shapes, (list, tuple)):
        specs, own = split_set(shapes)   # a shape set's `pin:` words pin its plan alone
        shapes, pin = parse_shape_overrides(specs), {**(pin or {}), **own}
    profile = load_profile(target, profile_path)
    proto, name, digest = load(model)
    graph = import_model(proto, shapes, name=name)
    check = functools.partial(count_registers, jobs=jobs) if check_registers else None
    options = Options(target, profile, precision, tuple(sorted((pin or {}).items())), inplace, check,
                      dependent=dependent_launch)
    result = run_pipeline(graph, options, dump_ir, on_stage=on_stage)
    if check_pins:
        why = pins_unused((k.schedule.param for k in result.plan.kernels if k.schedule), pin or {})
        if why:
            raise AicfError(why)
    if on_stage:
        on_stage("codegen+nvcc")
    launch, why = pdl.choose(target, dependent_launch)
    plan, modules = build_modules(result.plan.replace(launch=launch, timeline=timeline), jobs, on_kernel)
    if dump_ir is not None:
        for i, module in enumerate(modules):
            (Path(dump_ir) / f"module_{i}.cu").write_text(module.source)
    casts = build_casts(plan.name, precision, plan.target, converted(result, plan), len(modules))
    if dump_ir is not None and casts[0] is not None:
        (Path(dump_ir) / f"module_{len(modules)}.cu").write_text(casts[0].source)
    payload = build_payload(result, plan, modules, profile, precision, digest, casts)
    payload["launch"] = {"mode": launch, "reason": why}
    payload = add_greedy_feed(payload)   # [Note: greedy feed]: decode plans of decoders only
    if dump_ir is not None and "greedy" in payload:
        (Path(dump_ir) / f"module_{payload['greedy']['module']}.cu").write_text(payload["modules"][-1]["source"])
    return payload


def compile_plans(model: Any, shape_sets: list[list[str]] | list[dict[str, tuple[int, ...]]],
                  dump_ir: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """One plan per shape set over one copy of the weights ([Note: plans] in aicf_run/plans.py):
    a version-3 payload when there are several sets, `compile_model`'s payload for one. Each
    set is compiled on its own, as `compile_model` would; --dump-ir goes to DIR/plan_<i>."""
    if len(shape_sets) <= 1:
        return compile_model(model, shapes=shape_sets[0] if shape_sets else None, dump_ir=dump_ir, **options)
    with shared():   # [Note: weights shared by a bundle's plans] (ir/shared_weights.py)
        return _compile_plans(model, shape_sets, dump_ir, **options)


def _compile_plans(model: Any, shape_sets: list[list[str]] | list[dict[str, tuple[int, ...]]],
                   dump_ir: str | Path | None, **options: Any) -> dict[str, Any]:
    def refuse_unused(payloads: list[dict[str, Any]], pin: dict[str, Any], where: str = "") -> None:
        why = pins_unused((k["params"] for p in payloads for k in p["kernels"]), pin)
        if why:
            raise AicfError(f"{where}{why}")
    user = dict(options.get("pin") or {})
    order = sorted(range(len(shape_sets)), key=lambda i: _input_elements(shape_sets[i]))
    payloads: dict[int, dict[str, Any]] = {}
    layout: str | None = None if str(user.get(GEMV_PIN, "1")) in DECIDING else str(user[GEMV_PIN])
    decide = layout is None
    word = [ONE_ROW] if str(user.get(GEMV_PIN)) == ONE_ROW else []   # the word carried to the other plans with the names

    def build(i: int) -> None:
        shapes = shape_sets[i]
        folder = None if dump_ir is None else Path(dump_ir) / f"plan_{i}"
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        pin = user if layout is None else {**user, GEMV_PIN: layout}
        payloads[i] = compile_model(model, shapes=shapes, dump_ir=folder, check_pins=False, **{**options, "pin": pin})
        own = split_set(shapes)[1] if isinstance(shapes, (list, tuple)) else {}
        refuse_unused([payloads[i]], own, f"shape set {i + 1}: ")   # a set's pin: words, its plan alone
    # [Note: one layout for a bundle's plans]
    # The plans share one copy of the weights, so a weight is K-major (relayout_weights.GEMV_RULE) in all of them
    # or in none. The plan of the fewest input elements (a decode step's) is compiled first and decides by the
    # planner's predictions; the others are compiled with its choice by name (a prefill's GEMMs read either
    # layout). Where another plan needs one of those weights [K, N] (a gemv of 2-8 rows: its declined record),
    # the weight stays [K, N] and the plans that stored it K-major are compiled again.
    for i in order:
        build(i)
        if layout is None:
            chosen = sorted(_k_major(payloads[i])[0])
            layout = "+".join(word + chosen) if chosen else "0"
    kept = set() if layout == "0" else set(layout.split("+")) - {ONE_ROW}
    vetoed = set().union(*(_k_major(p)[1] for p in payloads.values())) & kept
    if vetoed and decide:
        layout = "+".join(word + sorted(kept - vetoed)) if kept - vetoed else "0"
        for i in order:
            if _k_major(payloads[i])[0] != kept - vetoed:
                build(i)
    refuse_unused(list(payloads.values()), user)
    return merge_plans([payloads[i] for i in range(len(shape_sets))])


def _input_elements(shapes: list[str] | dict[str, tuple[int, ...]]) -> int:
    """The elements of a shape set's inputs: a decode step's set (one token) has the fewest."""
    if isinstance(shapes, (list, tuple)):
        shapes = parse_shape_overrides(split_set(shapes)[0])
    return sum(math.prod(s) for s in shapes.values())


def _k_major(payload: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(the weights a compiled plan stores K-major by relayout_weights.GEMV_RULE, those it declined to: a gemv
    of the plan needs them [K, N], or, in the plan that decides, K-major is predicted no faster, so that plan does
    not store them K-major either), from its decision log."""
    done, declined = set(), set()
    for d in payload.get("decisions", ()):
        if d.get("kind") == "rewrite" and d.get("rule") == GEMV_RULE:
            (done if d["applied"] else declined).add(d["target"])
    return done, declined


def shape_sets(specs: list[str] | tuple[str, ...], lines: list[str] | None = None) -> list[list[str]]:
    """The shape sets of `--shape` options (`specs`, in order) or of a --shape-sets file's lines.

    `--shape` options form one set until one names an input the current set already names:
    that option starts the next set (`--shape ids=1x512 --shape ids=1x1` is two sets). A file
    holds one set per line (`ids=1x512 mask=1x512`; `#` starts a comment), where a word
    `pin:[NODE:]KEY=VALUE` is a --pin of that set's plan alone. Every set must name
    the same inputs, and no two sets may be equal, so that each set is one plan and a plan is
    found by its shapes alone."""
    if lines is not None and specs:
        raise AicfError("give the shape sets with --shape or with --shape-sets, not both")
    sets: list[list[str]] = []
    if lines is not None:
        for line in lines:
            words = line.split("#", 1)[0].split()
            if words:
                sets.append(words)
        if not sets:
            raise AicfError("--shape-sets: the file names no shape set; write one set per line, e.g. ids=1x512")
    else:
        for spec in specs:
            name = spec.rpartition("=")[0]
            if not sets or name in {s.rpartition("=")[0] for s in sets[-1]}:
                sets.append([])
            sets[-1].append(spec)
    specs = [split_set(s)[0] for s in sets]              # one-line errors for a bad pin word
    parsed = [parse_shape_overrides(s) for s in specs]   # and for a bad spec
    for i, shapes in enumerate(parsed):
        if len(shapes) != len(specs[i]):
            raise AicfError(f"shape set {i + 1} ({' '.join(sets[i])}) names an input twice")
        if set(shapes) != set(parsed[0]):
            raise AicfError(f"shape set {i + 1} names {', '.join(sorted(shapes))} but set 1 names "
                            f"{', '.join(sorted(parsed[0]))}; give every input's shape in every set")
        if shapes in parsed[:i]:
            raise AicfError(f"shape set {i + 1} ({' '.join(sets[i])}) repeats set {parsed.index(shapes) + 1}; "
                            f"each set is one plan")
    return sets
