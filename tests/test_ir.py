"""Per IR level: the printer's text parses back to an equal IR, and the verifier catches errors."""
from __future__ import annotations

import pytest

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan, verify_plan
from aicfc.ir.high import Graph, Node, parse_graph, verify_graph
from aicfc.ir.lowered import Affine, Compute, Load, parse_program, verify_program
from aicfc.ir.types import TensorType
from aicfc.passes.pipeline import PIPELINE, Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_pipeline import example_models, stages

CASES = [(cid, build) for cid, build in B.OP_CASES][::3] + example_models()


def _stages(model):
    seen = list(stages(model).items())
    return seen[0][1], seen


@pytest.mark.parametrize("case_id,build", CASES, ids=[c for c, _ in CASES])
def test_round_trip_every_stage(case_id, build):
    graph, seen = _stages(build())
    data = {w.name: w.data for _, ir in seen for w in ir.weights}
    parsers = {"high": parse_graph, "lowered": parse_program, "decision": parse_plan}
    for name, ir in seen:
        level = "high" if isinstance(ir, Graph) else ("decision" if hasattr(ir, "kernels") else "lowered")
        text = str(ir)
        back = parsers[level](text, data)
        assert back == ir, f"{name}: printed text does not parse back to the same IR"
        assert str(back) == text


def test_high_verifier_names_bad_node():
    graph = import_model(B.single_op_model("Relu", [(3, 5)]))
    bad = graph.replace(nodes=(Node("Relu", ("nope",), "out", TensorType("f32", (3, 5)), (), "relu_0"),))
    with pytest.raises(AicfError, match="'nope' is used before it is defined"):
        verify_graph(bad)
    wrong_type = graph.replace(nodes=(Node("Relu", ("in0",), "out", TensorType("f32", (5, 3)), (), "r"),))
    with pytest.raises(AicfError, match="its op gives f32\\[3,5\\]"):
        verify_graph(wrong_type)


def test_lowered_verifier_checks_bounds():
    _, seen = _stages(B.single_op_model("Relu", [(3, 5)]))
    p = dict(seen)["lower"]
    op = p.ops[0]
    shifted = Compute(op.out, op.type, "map", (), Load("in0", (Affine.var("i0"), Affine.of({"i1": 1}, 1))))
    with pytest.raises(AicfError, match="dim 1 ranges 1..5, outside 0..4"):
        verify_program(p.replace(ops=(shifted,)))


def test_decision_verifier_requires_outputs_stored():
    _, seen = _stages(B.single_op_model("Relu", [(3, 5)]))
    plan = dict(seen)["plan_memory"]
    k = plan.kernels[0]
    with pytest.raises(AicfError, match="never stored"):
        verify_plan(plan.replace(kernels=(k.replace(stores=()),)))


def test_parse_error_names_line():
    with pytest.raises(AicfError, match="line 2"):
        parse_graph("graph g {\n  input %x f32[2]\n}", {})


def test_dump_ir_writes_every_stage(tmp_path):
    graph = import_model(B.single_op_model("Softmax", [(3, 5)], {"axis": -1}))
    run_pipeline(graph, Options("sm_90", load_profile("sm_90")), tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "00_import.txt"
    assert [n[3:-4] for n in names[1:]] == [s.name for s in PIPELINE]
