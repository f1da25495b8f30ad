"""compile_model: the whole compile path, ONNX in, bundle payload out. No GPU needed."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import onnx

from aicfc.artifact.payload import build_payload
from aicfc.codegen.module import build_module
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model, load_model, parse_shape_overrides
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile

PRECISIONS = ("fp32",)


def load(model: Any) -> tuple[onnx.ModelProto, str, str]:
    """(model, name, sha256 of its bytes) from a path or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        onnx.checker.check_model(model)
        data = model.SerializeToString()
        return model, model.graph.name or "model", hashlib.sha256(data).hexdigest()
    path = Path(os.fspath(model))
    proto = load_model(path)
    return proto, path.stem, hashlib.sha256(path.read_bytes()).hexdigest()


def compile_model(model: Any, target: str = "sm_90", precision: str = "fp32",
                  shapes: dict[str, tuple[int, ...]] | list[str] | None = None,
                  dump_ir: str | Path | None = None, profile_path: str | Path | None = None,
                  on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    if precision not in PRECISIONS:
        raise AicfError(f"--precision {precision}: this version supports {', '.join(PRECISIONS)}")
    if isinstance(shapes, (list, tuple)):
        shapes = parse_shape_overrides(shapes)
    profile = load_profile(target, profile_path)
    proto, name, digest = load(model)
    graph = import_model(proto, shapes, name=name)
    result = run_pipeline(graph, Options(target, profile), dump_ir, on_stage=on_stage)
    if on_stage:
        on_stage("codegen+nvcc")
    plan, source, built = build_module(result.plan)
    if dump_ir is not None:
        (Path(dump_ir) / "module.cu").write_text(source)
    return build_payload(result, plan, source, built, profile, precision, digest)
