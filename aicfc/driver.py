"""compile_model: the whole compile path, ONNX in, bundle payload out. No GPU needed."""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import onnx

from aicfc.artifact.payload import build_payload, converted
from aicfc.codegen.io_cast import build_casts
from aicfc.codegen.module import OnKernel, build_modules, count_registers, resolve_jobs
from aicfc.frontend.onnx_import import MAX_MODEL_BYTES, import_model, load_model, parse_shape_overrides
from aicfc.passes.apply_precision import check_precision
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile



def load(model: Any) -> tuple[onnx.ModelProto, str, str]:
    """(model, name, sha256 of its bytes) from a path or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        onnx.checker.check_model(model)
        data = model.SerializeToString()
        return model, model.graph.name or "model", hashlib.sha256(data).hexdigest()
    path = Path(os.fspath(model))
    data = path.read_bytes() if path.is_file() and path.stat().st_size <= MAX_MODEL_BYTES else None
    proto = load_model(path, data)   # checks the path and size itself when data is None
    return proto, path.stem, hashlib.sha256(data if data is not None else path.read_bytes()).hexdigest()


def compile_model(model: Any, target: str = "sm_90", precision: str = "fp32",
                  shapes: dict[str, tuple[int, ...]] | list[str] | None = None,
                  dump_ir: str | Path | None = None, profile_path: str | Path | None = None,
                  on_stage: Callable[[str], None] | None = None, jobs: int | None = None,
                  on_kernel: OnKernel | None = None, pin: dict[str, Any] | None = None,
                  inplace: bool = True, check_registers: bool = True) -> dict[str, Any]:
    """The bundle payload of `model`; `jobs` parallel nvcc runs (None: $AICF_JOBS or the CPU
    count), `on_kernel` as in `build_modules`. --dump-ir also writes module_<i>.cu per module.
    `pin` ({param: value}) restricts the schedule of every kernel whose space has those params;
    `inplace=False` gives every stored tensor bytes of its own (for debugging);
    `check_registers=False` ranks on estimated registers alone (no ptxas runs while planning)."""
    check_precision(precision)
    jobs = resolve_jobs(jobs)
    if isinstance(shapes, (list, tuple)):
        shapes = parse_shape_overrides(shapes)
    profile = load_profile(target, profile_path)
    proto, name, digest = load(model)
    graph = import_model(proto, shapes, name=name)
    check = functools.partial(count_registers, jobs=jobs) if check_registers else None
    options = Options(target, profile, precision, tuple(sorted((pin or {}).items())), inplace, check)
    result = run_pipeline(graph, options, dump_ir, on_stage=on_stage)
    if on_stage:
        on_stage("codegen+nvcc")
    plan, modules = build_modules(result.plan, jobs, on_kernel)
    if dump_ir is not None:
        for i, module in enumerate(modules):
            (Path(dump_ir) / f"module_{i}.cu").write_text(module.source)
    casts = build_casts(plan.name, precision, plan.target, converted(result, plan), len(modules))
    if dump_ir is not None and casts[0] is not None:
        (Path(dump_ir) / f"module_{len(modules)}.cu").write_text(casts[0].source)
    return build_payload(result, plan, modules, profile, precision, digest, casts)
