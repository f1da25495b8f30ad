"""ONNX node conformance: the onnx package's own node test cases for every op aicfc claims.

A case belongs to op X when its graph is one node of X (the `_expanded` function bodies are
other ops' cases). Each case runs through import, every pass and the interpreter of each
level (as tests/test_pipeline.py does) on CPU, and compiled on the GPU (`gpu` mark). Inputs
that are parameters rather than data in a static-shape compiler (Reshape's shape, Slice's
starts/ends/axes/steps, Split's sizes, axes inputs, Clip's bounds, Pow's exponent, Dropout's
ratio and mode) are frozen to the case's values as initializers: the compiler needs them at
compile time. A case the importer refuses with an AicfError (an attribute value, a dtype) is
*unsupported*, reported as such, never as a pass.

    python3 -m tests.test_conformance --report     # per op: cases, passed, unsupported, failed
"""
from __future__ import annotations

import functools
import sys
import warnings

import numpy as np
import onnx
import pytest

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import IMPORT_ONLY, import_model
from aicfc.ir.ops import OPS
from aicfc.passes.pipeline import PIPELINE, Options
from aicfc.planner.hardware import load_profile
from tests.test_pipeline import evaluate_ir

# Ops the compiler claims: the op table plus the ops the importer handles itself.
CLAIMED = frozenset(OPS) | frozenset(IMPORT_ONLY)
# (op, input position) of the inputs frozen into initializers (see the module docstring).
FROZEN_INPUTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "Split": (1,), "Unsqueeze": (1,),
                 "Squeeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,), "ReduceMax": (1,), "Clip": (1, 2),
                 "Pow": (1,), "Dropout": (1, 2), "ConstantOfShape": (0,), "Range": (0, 1, 2)}
FROZEN_INPUTS["Trilu"] = (1,)   # its k
# Issue 18's data ops: repeats, pads and value, the axis of CumSum, TopK's k, reduction axes.
FROZEN_INPUTS.update({"Tile": (1,), "Pad": (1, 2, 3), "CumSum": (1,), "TopK": (1,), "ReduceMin": (1,),
                      "ReduceProd": (1,), "ReduceL2": (1,)})
FROZEN_INPUTS.update({op: (1,) for op in ("ReduceSumSquare", "ReduceL1", "ReduceLogSum", "ReduceLogSumExp", "Upsample")})
FROZEN_INPUTS["OneHot"] = (1, 2)   # depth and values
# Issue 18's spatial ops: Resize's roi, scales and sizes.
FROZEN_INPUTS["Resize"] = (1, 2, 3)


@functools.cache
def node_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return tuple(c for c in cases if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in CLAIMED
                 and c.data_sets)


def as_array(value) -> np.ndarray:
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def freeze(model: onnx.ModelProto, inputs: list[np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's model with its parameter inputs as initializers, and the remaining feeds."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    node = model.graph.node[0]
    frozen = {node.input[k] for k in FROZEN_INPUTS.get(node.op_type, ()) if k < len(node.input) and node.input[k]}
    feeds = {}
    for vi, value in zip(list(model.graph.input), inputs):
        if vi.name in frozen:
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), vi.name))
        else:
            feeds[vi.name] = np.asarray(value)
    return model, feeds


def run_case(case) -> tuple[str, str]:
    """("pass" | "unsupported" | "failed", detail), on CPU through every stage."""
    inputs, expected = case.data_sets[0]
    model, feeds = freeze(case.model, [as_array(x) for x in inputs])
    expected = [as_array(x) for x in expected]
    names = [o.name for o in model.graph.output]
    try:
        ir = import_model(model)
    except AicfError as e:
        return "unsupported", str(e)
    except Exception as e:  # a crash at import is a bug, not an unsupported variant
        return "failed", f"import: {type(e).__name__}: {e}"
    opts = Options("sm_90", load_profile("sm_90"))
    try:
        for stage in [None] + list(PIPELINE):
            if stage is not None:
                ir = stage.run(ir, opts)
            got = evaluate_ir(ir, feeds)
            for name, ref in zip(names, expected):
                why = compare(got[name], np.asarray(ref), case)
                if why:
                    return "failed", f"after {stage.name if stage else 'import'}: {name}: {why}"
    except Exception as e:
        return "failed", f"{type(e).__name__}: {e}"
    return "pass", ""


def compare(got: np.ndarray, ref: np.ndarray, case) -> str:
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if ref.dtype.kind in "biu":
        return "" if np.array_equal(got.astype(ref.dtype), ref) else "values differ"
    ok = np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=max(case.rtol, 1e-5),
                     atol=max(case.atol, 1e-6), equal_nan=True)
    return "" if ok else f"max abs err {np.nanmax(np.abs(got.astype(np.float64) - ref)):.3g}"


def report() -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for case in node_cases():
        op = case.model.graph.node[0].op_type
        verdict, _ = run_case(case)
        row = table.setdefault(op, {"cases": 0, "pass": 0, "unsupported": 0, "failed": 0})
        row["cases"] += 1
        row[verdict] += 1
    return dict(sorted(table.items()))


CASES = [(c.name, c) for c in node_cases()] if __name__ != "__main__" else []


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_node_case(name, case):
    verdict, detail = run_case(case)
    assert verdict != "failed", f"{name}: {detail}"


# Claimed ops none of whose node cases run yet, each for a variant the importer refuses by name.
# The list may only shrink: Equal's and CumSum's int32 cases run since integer computes
# ([Note: Integer computes]). Einsum's cases are all float64 or bfloat16 at run time, refused by
# name; tests/test_data_ops.py runs its float64 cases retyped to float32, and they pass. Session 91's
# ReduceLogSumExp likewise: its cases are all float64 (or an empty set); retyped there, they pass.
NO_PASSING_CASE = {"Einsum", "ReduceLogSumExp"}


def test_claimed_ops_without_a_passing_case_are_known():
    table = report()
    assert {op for op, row in table.items() if row["pass"] == 0 and row["cases"]} <= NO_PASSING_CASE, table


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_node_case_gpu(name, case, gpu_device):
    import aicfc
    from tests.conftest import run_payload
    inputs, expected = case.data_sets[0]
    model, feeds = freeze(case.model, [as_array(x) for x in inputs])
    expected = [as_array(x) for x in expected]
    try:
        payload = aicfc.compile(model, target=gpu_device.arch)
    except AicfError as e:
        if "nvcc failed" in str(e):     # a codegen bug, not an unsupported variant
            raise
        pytest.skip(f"unsupported: {e}")
    got = run_payload(payload, feeds, gpu_device)
    for o, ref in zip(model.graph.output, expected):
        why = compare(np.asarray(got[o.name]), np.asarray(ref), case)
        assert not why, f"{name}: {o.name}: {why}"


def main(argv: list[str]) -> int:
    if "--report" not in argv:
        print("usage: python3 -m tests.test_conformance --report", file=sys.stderr)
        return 2
    table = report()
    print(f"{'op':<20} {'cases':>5} {'passed':>6} {'unsupported':>11} {'failed':>6}")
    for op, row in table.items():
        print(f"{op:<20} {row['cases']:>5} {row['pass']:>6} {row['unsupported']:>11} {row['failed']:>6}")
    total = {k: sum(r[k] for r in table.values()) for k in ("cases", "pass", "unsupported", "failed")}
    print(f"{'total':<20} {total['cases']:>5} {total['pass']:>6} {total['unsupported']:>11} {total['failed']:>6}")
    if "-v" in argv:
        for case in node_cases():
            verdict, detail = run_case(case)
            if verdict != "pass":
                print(f"{verdict:<11} {case.name}: {detail[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
