"""[Note: a pointwise thread's items in turn] (planner/cost.py): a wave of a map's blocks takes at least
`items` load round trips, a floor on its predicted time that binds in small maps alone."""
from __future__ import annotations

from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.plan_schedules import rank
from aicfc.planner.cost import load_latency
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B

HW = load_profile("sm_90", "h200")


def _map(n: int):
    model = B.single_op_model("Add", [(n, 1536), (n, 1536)])
    plan = run_pipeline(import_model(model, None), Options("sm_90", HW, "fp16")).plan
    k = next(k for k in plan.kernels if k.family == "pointwise" and any("add" in o.lower() for o in k.origins))
    return k, plan


def test_the_floor_binds_in_a_small_map_and_moves_its_pick():
    k, plan = _map(784)                       # 1.2 M halves a tensor: 7.2 MB moved, about 1.8 us
    ranked, _ = rank(k, plan, HW)
    by = {(r.params["items"], r.params["threads"]): r for r in ranked}
    eight = by[(8, 64)]
    floor = eight.estimate.terms["t_items_us"]
    assert floor >= 8 * load_latency(HW) - 1e-9
    assert eight.time_us >= floor + HW.launch_overhead_us - 1e-9
    assert k.schedule.param["items"] < 8


def test_a_large_map_streams_past_the_floor():
    k, plan = _map(32 * 784)                  # 32x the bytes: the DRAM time binds for every item count
    for r in rank(k, plan, HW)[0]:
        assert r.time_us > r.estimate.terms["t_items_us"] + HW.launch_overhead_us


def test_explain_names_the_floor():
    import aicfc
    from aicfc.explain import explain_text
    payload = aicfc.compile(B.single_op_model("Add", [(784, 1536), (784, 1536)]), target="sm_90", precision="fp16",
                            profile_path="h200")
    line = next(x for x in explain_text(payload).splitlines() if "predicted" in x and "items in turn" in x)
    assert "+ launch" in line
