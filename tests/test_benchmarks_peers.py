"""The benchmarks' pure helpers (benchmarks/models.py, gemm.py, gemm_predictions.py, timing.py):
case and shape parsing, the within-band fraction, JSON row shapes, and the timing arithmetic
with fake CUDA events. No GPU and no torch needed."""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from benchmarks import gemm, gemm_predictions, in_plan, models, timing


# ------------------------------------------------------------------ models.py: cases

def test_parse_cases_forms():
    assert models.parse_cases("bert:8x512,gpt2:1x128,resnet50:32") == [
        ("bert", 8, 512), ("gpt2", 1, 128), ("resnet50", 32, 0)]
    # whitespace, case, duplicates, empty items
    assert models.parse_cases(" BERT:8X512 , bert:8x512,,gpt2:2x64 ") == [("bert", 8, 512), ("gpt2", 2, 64)]
    # a transformer without a sequence length takes the standard case's
    assert models.parse_cases("bert:8,gpt2:1") == [("bert", 8, 512), ("gpt2", 1, 128)]


@pytest.mark.parametrize("spec", ["", "bert", "bert:", "bert:0x128", "bert:8x", "bert:8x0", "bert:axb",
                                  "vit:1x128", "llama:1x4096", "resnet50:1x224", "bert:4", "bert:1x1024", "gpt2:1x2048",
                                  "resnet50:-1"])
def test_parse_cases_rejects(spec):
    with pytest.raises(ValueError):
        models.parse_cases(spec)


def test_format_case_round_trip():
    for case in models.CASES:
        assert models.parse_cases(models.format_case(case)) == [case]


def test_default_cases_are_the_issue_cases():
    assert set(models.CASES) == {("bert", 8, 512), ("bert", 1, 128), ("gpt2", 8, 512), ("gpt2", 1, 128),
                                 ("llama", 1, 512), ("llama", 8, 512), ("resnet50", 1, 0), ("resnet50", 32, 0)}


def _args(argv):
    return models.build_parser().parse_args(argv)


def test_select_cases():
    assert models.select_cases(_args([])) == models.CASES
    assert models.select_cases(_args(["--quick"])) == models.QUICK
    assert models.select_cases(_args(["--cases", "gpt2:8x512", "--case", "bert:1", "--case", "gpt2:8"])) == [
        ("gpt2", 8, 512), ("bert", 1, 128)]
    assert models.select_cases(_args(["--only", "gpt2"])) == [c for c in models.CASES if c[0] == "gpt2"]
    with pytest.raises(ValueError):
        models.select_cases(_args(["--only", "vit"]))


def test_models_cli_rejects_bad_cases(capsys):
    with pytest.raises(SystemExit) as e:
        models.main(["--cases", "bert:8x", "--no-gpu"])
    assert e.value.code == 2
    assert "bert:8x" in capsys.readouterr().err


def test_models_plans_with_the_bundled_profile_of_its_gpu():
    assert models.gpu_profile("NVIDIA H200") == "h200"
    assert models.gpu_profile("NVIDIA H100 80GB HBM3") is None and models.gpu_profile(None) is None


def test_peer_modes():
    assert models.peer_modes(False) == ["default", "reduce-overhead"]
    assert models.peer_modes(True) == ["default", "reduce-overhead", "max-autotune"]
    assert models.build_parser().parse_args(["--max-autotune"]).max_autotune


# ------------------------------------------------------------------ models.py: rows and JSON

def _peers(modes):
    return {m: {"us": 2000.0 + 100 * i, "err": 1e-3, "build_s": 10.0, "cudagraph_skips": 0}
            for i, m in enumerate(modes)}


def test_finish_row_keys_and_ratios():
    row = {"model": "bert", "batch": 8, "seq": 512, "tiny": False, "kernels": 85, "export_s": 4.0, "compile_s": 7.0}
    models.finish_row(row, aicf_us=1000.0, aicf_err=2e-3, eager_us=5000.0, eager_err=3e-3,
                      peers=_peers(models.peer_modes(True)))
    for p in ("compile", "ro", "ma"):
        assert {f"{p}_ms", f"vs_{p}", f"{p}_err", f"{p}_build_s", f"{p}_cudagraph_skips"} <= row.keys()
    assert row["aicf_ms"] == 1.0 and row["eager_ms"] == 5.0
    assert row["vs_eager"] == 5.0
    assert row["vs_compile"] == 2.0 and row["vs_ro"] == 2.1 and row["vs_ma"] == pytest.approx(2.2)
    json.dumps(row)   # every value serialisable
    line = models.format_row(row, True)
    assert "2.10" in line and "skipped" not in line
    row["ro_cudagraph_skips"] = 2
    assert "skipped CUDA graphs" in models.format_row(row, False)


def test_finish_row_failed_peer():
    row = {"model": "bert", "batch": 1, "seq": 128, "tiny": False, "kernels": 85, "export_s": 4.0, "compile_s": 7.0}
    peers = _peers(["default", "reduce-overhead"])
    peers["max-autotune"] = {"error": "RuntimeError: boom"}
    models.finish_row(row, 500.0, 2e-3, 4000.0, 3e-3, peers)
    assert row["ma_ms"] is None and row["vs_ma"] is None and row["ma_error"] == "RuntimeError: boom"
    assert row["vs_ro"] == pytest.approx(2100 / 500)
    line = models.format_row(row, True)
    assert "ma failed: RuntimeError: boom" in line
    json.dumps(row)


def test_format_row_without_gpu():
    row = {"model": "resnet50", "batch": 32, "seq": 0, "tiny": True, "kernels": 56, "export_s": 1.0, "compile_s": 2.0}
    line = models.format_row(row, False)
    assert line.startswith("resnet50") and " - " in line
    assert len(models.header(False).split()) > 10


def test_ratio_missing():
    assert models.ratio(None, 1.0) is None
    assert models.ratio(1.0, 0.0) is None
    assert models.ratio(3.0, 1.5) == 2.0


def test_json_doc_shape():
    row = models.finish_row({"model": "gpt2", "batch": 1, "seq": 128, "tiny": False, "kernels": 85,
                             "export_s": 1.0, "compile_s": 1.0}, 450.0, 2e-3, 5000.0, 2e-3,
                            _peers(models.peer_modes(False)))
    doc = models.json_doc("NVIDIA H200", [row], [], [("gpt2", 1, 128)], False, 50, {"torch": "x"})
    doc = json.loads(json.dumps(doc))
    assert doc["cases"] == ["gpt2:1x128"]
    assert doc["peers"] == ["compile", "ro"]
    assert doc["rows"][0]["vs_ro"] == pytest.approx(2100 / 450)
    assert {"gpu", "versions", "precision", "reps", "tol", "timing", "rows", "failures"} <= doc.keys()


def test_rel_err_nan_never_passes():
    ref = np.array([1.0, -2.0, 4.0])
    assert models.rel_err(ref + 0.04, ref) == pytest.approx(0.01)
    err = models.rel_err(np.array([1.0, np.nan, 4.0]), ref)
    assert math.isnan(err) and not err <= models.TOL


# ------------------------------------------------------------------ gemm.py

def test_gemm_parse_shape_and_pins():
    assert gemm.parse_shape("7x100x257") == (7, 100, 257)
    assert gemm.parse_shape("1X4096X50257") == (1, 4096, 50257)
    for bad in ("7x100", "7x0x3", "ax1x1", "1x2x3x4", "-1x2x3"):
        with pytest.raises(ValueError):
            gemm.parse_shape(bad)
    assert gemm.parse_pins(["unit=mma", " BM = 128 "]) == {"unit": "mma", "BM": "128"}
    for bad in (["unit"], ["=mma"], ["unit="]):
        with pytest.raises(ValueError):
            gemm.parse_pins(bad)


def test_gemm_edge_shapes_and_selection():
    assert (7, 100, 257) in gemm.EDGE and (1, 4096, 50257) in gemm.EDGE
    ap = gemm.build_parser()
    assert gemm.select_shapes(ap.parse_args(["--edge"])) == gemm.EDGE
    assert gemm.select_shapes(ap.parse_args(["--edge", "--shape", "8x8x8"])) == [(8, 8, 8)]
    assert gemm.select_shapes(ap.parse_args([])) == gemm.SQUARE + gemm.BERT
    args = ap.parse_args(["--pin", "unit=wgmma", "--compare-units", "--tune"])
    assert args.pin == ["unit=wgmma"] and args.compare_units and args.tune


def test_gemm_variants():
    assert gemm.variants({}, False, "fp16") == [("planner", {})]
    assert gemm.variants({}, True, "fp16") == [("planner", {}), ("unit=mma", {"unit": "mma"})]
    assert gemm.variants({"unit": "wgmma"}, True, "bf16") == [("unit=wgmma", {"unit": "wgmma"}),
                                                              ("unit=mma", {"unit": "mma"})]
    assert gemm.variants({"unit": "mma"}, True, "fp16") == [("unit=mma", {"unit": "mma"})]
    assert gemm.variants({}, True, "fp32") == [("planner", {})]   # no tensor-core GEMM in fp32


def test_gemm_tolerances():
    assert gemm.RTOL["fp16"] == gemm.RTOL["bf16"] == 1e-2 and gemm.RTOL["tf32"] == 1e-3
    ref = np.array([[2.0, -4.0]])
    assert gemm.rel_err(ref * (1 + 1e-3), ref) == pytest.approx(1e-3)
    assert gemm.passes(gemm.rel_err(ref * (1 + 1e-3), ref), "fp16")
    assert not gemm.passes(gemm.rel_err(ref * (1 + 2e-3), ref), "tf32")
    assert not gemm.passes(gemm.rel_err(np.array([[np.nan, -4.0]]), ref), "fp16")
    assert not gemm.passes(float("nan"), "fp32")


def test_gemm_format_row():
    r = {"shape": [7, 100, 257], "precision": "fp16", "variant": "planner", "aicf_us": 2.5, "aicf_launch_us": 5.0,
         "torch_us": 3.0, "aicf_tflops": 0.1, "torch_tflops": 0.09, "ratio": 1.2, "predicted_us": 2.7,
         "aicf_err": 3e-4, "torch_err": 3e-4, "per_replay": 20, "ok": True, "kernels": 1,
         "params": {"unit": "mma", "BM": 32}}
    line = gemm.format_row(r)
    assert "7x100x257" in line and "unit=mma" in line and "FAIL" not in line
    assert "FAIL" in gemm.format_row({**r, "ok": False})
    assert "FAILED" in gemm.format_row({"shape": [1, 2, 3], "precision": "fp32", "variant": "x", "error": "boom"})
    assert math.isclose(gemm.geomean([2.0, 0.5]), 1.0)


# ------------------------------------------------------------------ timing.py with fake events

class _Clock:
    """A fake GPU: enqueued work advances `t` (ms); events read it when recorded."""

    def __init__(self):
        self.t = 0.0


class _PycudaEvent:
    def __init__(self, clock):
        self.clock, self.at, self.streams = clock, None, []

    def record(self, stream=None):
        self.at = self.clock.t
        self.streams.append(stream)

    def synchronize(self):
        pass

    def time_since(self, other):
        return self.at - other.at


class _TorchEvent(_PycudaEvent):
    time_since = None   # torch's events have elapsed_time instead

    def __getattribute__(self, name):
        if name == "time_since":
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def elapsed_time(self, end):
        return end.at - self.at


@pytest.mark.parametrize("event_class", [_PycudaEvent, _TorchEvent])
def test_events_median_us(event_class):
    clock = _Clock()
    durations = iter([1.0] * 3 + [0.2, 0.4, 0.3, 10.0, 0.4])   # 3 warm-ups, then 5 timed (ms)

    def enqueue():
        clock.t += next(durations)
    start, stop = event_class(clock), event_class(clock)
    us = timing.events_median_us(enqueue, start, stop, reps=5, warmup=3, per=4, stream="S")
    assert us == pytest.approx(0.4 / 4 * 1e3)   # median 0.4 ms over 4 calls
    assert set(start.streams) == {"S"}


def test_paired_us_alternates_and_times_each_side():
    clock = _Clock()
    order = []
    # a drifts 1.0, 1.1, 1.2 ... ms; b takes twice a's time of the same rep: every pair's ratio is 2
    state = {"a": 0, "b": 0}

    def side(name, base):
        def enqueue():
            order.append(name)
            clock.t += base * (1.0 + 0.1 * (state[name] - 1))
            state[name] += 1
        return enqueue
    a = (side("a", 1.0), _PycudaEvent(clock), _PycudaEvent(clock), "SA")
    b = (side("b", 2.0), _TorchEvent(clock), _TorchEvent(clock), None)
    ta, tb = timing.paired_us(a, b, reps=4, warmup=1, per=2)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]   # warm-up, then the first side alternates
    assert ta == pytest.approx([500.0, 550.0, 600.0, 650.0]) and tb == pytest.approx([1000.0, 1100.0, 1200.0, 1300.0])
    assert set(a[1].streams) == {"SA"} and set(b[1].streams) == {None}
    r = gemm.paired_ratio(tb, ta)
    assert r["ratio"] == pytest.approx(2.0) and r["ratio_lo"] == pytest.approx(2.0) == r["ratio_hi"]
    assert gemm.paired_ratio([1.0, 3.0, 2.0], [1.0, 1.0, 1.0])["ratio"] == pytest.approx(2.0)


def test_gemm_paired_and_rounds_exclusive(capsys):
    with pytest.raises(SystemExit):
        gemm.main(["--paired", "--rounds", "3", "--shape", "64x64x64"])
    assert "give one" in capsys.readouterr().err


def test_replays_for():
    assert timing.replays_for(3.0) == 20
    assert timing.replays_for(100.0) == 20
    assert timing.replays_for(400.0) == 5
    assert timing.replays_for(60000.0) == 1
    assert timing.replays_for(float("nan")) == 20
    assert timing.replays_for(0.0, most=7) == 7


def test_aicf_graph_us_captures_per_plans(monkeypatch):
    clock = _Clock()
    calls = []

    class FakeGraph:
        @classmethod
        def capture(cls, stream, enqueue):
            g = cls()
            before = len(calls)
            enqueue()
            g.n = len(calls) - before
            g.closed = False
            return g

        def upload(self, stream):
            pass

        def launch(self, stream):
            clock.t += 0.005 * self.n   # 5 us per plan

        def close(self):
            self.closed = True

    class FakeExecutor:
        stream = "exec-stream"

        def __init__(self):
            self._events = (_PycudaEvent(clock), _PycudaEvent(clock))

        def launch(self, graph=None):
            calls.append(graph)
            clock.t += 0.005 if graph is not False else 0.0

        def events(self):
            return self._events

        def synchronize(self):
            pass

    import aicf_run.graph
    monkeypatch.setattr(aicf_run.graph, "Graph", FakeGraph)
    ex = FakeExecutor()
    assert timing.aicf_graph_us(ex, per=20, reps=3, warmup=1) == pytest.approx(5.0)
    assert calls == [False] * 20   # the plan's kernels one by one, captured 20 times
    calls.clear()
    assert timing.aicf_launches_us(ex, per=10, reps=3, warmup=1) == pytest.approx(5.0)
    assert calls == [None] * 10 * 4   # launch() as a caller would, warm-up included
    assert set(ex.events()[0].streams) == {"exec-stream"}


# ------------------------------------------------------------------ gemm_predictions.py

def test_within_band():
    assert gemm_predictions.within_band([1.0, 0.8, 1.25, 0.79, 1.26, None, float("nan")]) == (3, 7, 3 / 7)
    assert gemm_predictions.within_band([]) == (0, 0, None)
    assert gemm_predictions.within_band([0.5], lo=0.5, hi=0.5) == (1, 1, 1.0)
    assert gemm_predictions.geomean([2.0, 0.5, None]) == pytest.approx(1.0)
    assert gemm_predictions.geomean([None]) is None


_IR = """decision m target=sm_90 precision=fp16 {
  kernel k0 row_reduce {
    %a: f16[2,64,64] = max[64] load(%x, [i0, i1, r0])
  }
  kernel k1 gemm {
    %val_38.val_46: f16[2,64,192] = sum[64] mul(load(%ln, [i0, i1, r0]), load(%w, [r0, i2])) from [n1, n2]
    bind %y {i0: i0}
  }
  kernel k2 gemm {
    %y: f16[128,512] = sum[256] mul(load(%x, [i0, r0]), load(%w, [r0, i1])) from [MatMul_0]
  }
"""


def _payload():
    k = lambda name, fam, flops, store, params: {  # noqa: E731
        "name": name, "family": fam, "stores": [store], "onnx_nodes": ["n"], "params": params,
        "predicted": {"time_us": 4.0, "flops": flops}}
    mma = {"BK": 64, "BM": 128, "BN": 256, "SPLITK": 1, "STAGES": 4, "WM": 2, "WN": 4, "dtype": "f16", "unit": "mma"}
    return {"kernels": [k("k0", "row_reduce", 0.0, "a", {}), k("k1", "gemm", 2.0 * 128 * 192 * 64, "q", mma),
                        k("k2", "gemm", 2.0 * 128 * 512 * 256, "y", {**mma, "SPLITK": 3}),
                        k("k3", "gemm", 2.0 * 7 * 257 * 100, "z", {"unit": "simt", "BM": 16, "BN": 16, "BK": 8})],
            "buffers": [{"name": "q", "shape": [2, 64, 3, 64]}, {"name": "y", "shape": [128, 512]},
                        {"name": "z", "shape": [7, 257]}],
            "ir": {"decision": _IR}}


def test_ir_contractions():
    c = gemm_predictions.ir_contractions(_IR)
    assert c == {"k1": ([2, 64, 192], 64), "k2": ([128, 512], 256)}


def test_gemm_rows_dims_schedule_and_ratio():
    rows = gemm_predictions.gemm_rows(_payload(), [1.0, 4.4, 6.0, 4.0])
    assert [r["name"] for r in rows] == ["k1", "k2", "k3"]
    k1, k2, k3 = rows
    assert (k1["m"], k1["n"], k1["k"]) == (128, 192, 64)       # from the IR, not the stored view's shape
    assert (k2["m"], k2["n"], k2["k"]) == (128, 512, 256)
    assert (k3["m"], k3["n"], k3["k"]) == (7, 257, 100)        # no IR line: stored shape and FLOPs
    assert k1["schedule"] == "mma 128x256x64 s4 WM=2 WN=4"
    assert k2["schedule"].startswith("mma 128x256x64 s4 splitk3")
    assert k3["unit"] == "simt"
    assert k1["ratio"] == pytest.approx(1.1) and k2["ratio"] == 1.5
    s = gemm_predictions.summary(rows)
    assert (s["within"], s["measured"]) == (2, 3) and s["fraction"] == pytest.approx(2 / 3)
    assert "2/3" in gemm_predictions.summary_text(s)
    assert any("*" in line for line in gemm_predictions.format_rows(rows))   # k2 outside the band


def test_gemm_rows_unmeasured_and_json():
    rows = gemm_predictions.gemm_rows(_payload(), None)
    assert all(r["measured_us"] is None and r["ratio"] is None for r in rows)
    s = gemm_predictions.summary(rows)
    assert s["measured"] == 0 and s["fraction"] is None
    assert "not measured" in gemm_predictions.summary_text(s)
    case = {"case": "bert:8x512", "gemms": gemm_predictions.gemm_rows(_payload(), [1.0, 4.0, 4.0, 4.0])}
    case["summary"] = gemm_predictions.summary(case["gemms"])
    doc = json.loads(json.dumps(gemm_predictions.json_doc("H200", [case], [], {"unit": "mma"})))
    assert doc["band"] == [0.8, 1.25] and doc["overall"]["fraction"] == 1.0
    row = doc["cases"][0]["gemms"][0]
    assert {"name", "m", "n", "k", "unit", "schedule", "params", "predicted_us", "measured_us", "ratio"} <= row.keys()


def test_gemm_rows_in_plan_band():
    rows = gemm_predictions.gemm_rows(_payload(), [1.0, 4.4, 6.0, 4.0], in_plan={1: 4.0, 2: 3.9})
    k1, k2, k3 = rows
    assert k1["in_plan_ratio"] == pytest.approx(1.0) and k2["in_plan_ratio"] == pytest.approx(0.975)
    assert k3["in_plan_us"] is None and k3["in_plan_ratio"] is None
    s = gemm_predictions.summary(rows)
    assert (s["in_plan_within"], s["in_plan_measured"]) == (2, 2) and s["in_plan_sum_us"] == pytest.approx(7.9)
    assert "in the plan" in gemm_predictions.summary_text(s) and "2/2" in gemm_predictions.summary_text(s)
    assert "in the plan" not in gemm_predictions.summary_text(gemm_predictions.summary(
        gemm_predictions.gemm_rows(_payload(), [1.0, 4.4, 6.0, 4.0])))


def _trace(starts_durs: list[tuple[str, float, float]]) -> list[dict]:
    return [{"name": n, "ts": t, "dur": d, "cat": "kernel"} for n, t, d in starts_durs]


def test_in_plan_slots_from_a_trace():
    # two replays of k0, k1, k2 (k1 overlaps k0's tail, as a dependent launch does), a foreign kernel
    # between k1 and k2 in the second, and events out of order
    events = _trace([("k0", 0.0, 5.0), ("k1", 4.0, 10.0), ("k2", 15.0, 3.0),
                     ("k1", 104.0, 9.0), ("k0", 100.0, 5.0), ("memcpy_kernel", 114.0, 1.0),
                     ("k2(float*, int)", 116.0, 3.0)])
    got = in_plan.slots(events, ["k0", "k1", "k2"])
    # end to end: k0 its duration (5, 5); k1 14 - 5 and 113 - 105; k2 18 - 14 and 119 - 113
    assert got == {0: 5.0, 1: pytest.approx(8.5), 2: pytest.approx(5.0)}
    assert in_plan.slots(events, []) == {}
    # a replay that lost k2 starts over at the plan's first; a kernel after a missing one has no slot
    lost = _trace([("k0", 0.0, 2.0), ("k1", 3.0, 2.0), ("k0", 10.0, 2.0), ("k1", 13.0, 2.0), ("k2", 16.0, 1.0),
                   ("k0", 20.0, 2.0), ("k2", 24.0, 1.0)])
    assert in_plan.slots(lost, ["k0", "k1", "k2"]) == {0: 2.0, 1: 3.0, 2: 2.0}


def test_gemm_predictions_parser():
    args = gemm_predictions.build_parser().parse_args(["--tiny", "--no-gpu", "--pin", "unit=mma"])
    assert args.tiny and args.no_gpu and args.pin == ["unit=mma"]
    assert gemm_predictions.build_parser().parse_args(["--profile", "p.json"]).profile.name == "p.json"
    assert set(gemm_predictions.CASES) == {("bert", 8, 512), ("bert", 1, 128), ("gpt2", 8, 512), ("gpt2", 1, 128)}


def test_modules_import_without_torch():
    # the helpers above ran without torch; the GPU paths import it lazily
    assert isinstance(models, types.ModuleType) and "torch" not in models.__dict__


def test_decode_ab_variants():
    from benchmarks import decode_ab
    assert decode_ab.parse_variant("a:pin.PRE=1,env.X=1,run.Y=2") == ("a", {"PRE": "1"}, {"X": "1"}, {"Y": "2"})
    assert decode_ab.parse_variant("base:") == ("base", {}, {}, {})
    for bad in (":pin.PRE=1", "a:PRE=1", "a:pin.PRE"):
        with pytest.raises(SystemExit):
            decode_ab.parse_variant(bad)


# ------------------------------------------------------------------ cudnn_convs.py: shapes and the join

def test_cudnn_convs_reads_conv_shapes_from_onnx():
    from onnx import TensorProto, helper, numpy_helper
    from benchmarks import cudnn_convs
    w = numpy_helper.from_array(np.ones((8, 2, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="c0", pads=[1, 1, 1, 1], strides=[2, 2], group=2)
    graph = helper.make_graph([conv], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    (c,) = cudnn_convs.conv_nodes(helper.make_model(graph))
    assert (c["node"], c["x"], c["w"], c["stride"], c["pad"], c["groups"], c["kernel"]) == \
        ("c0", [2, 4, 16, 16], [8, 2, 3, 3], [2, 2], [1, 1], 2, [3, 3])


def test_cudnn_convs_matches_a_node_with_its_largest_kernel():
    from benchmarks import cudnn_convs
    table = "\n".join([
        "  27  k28   4.07   6.51  0.63  0.5%  5517.7    1.182  115.0%  node_add_7, node_Conv_835",
        "  28  k29  14.63  19.23  0.76  2.0%  1644.2  674.362   68.2%  node_Conv_832, node_relu_24, node_Conv_835",
        "  29  k30   8.14   8.46  0.96  1.1%  2037.3  404.040   42.4%  node_Conv_838, node_relu_25"])
    ours = cudnn_convs.kernels_by_node(table)
    assert ours["node_Conv_835"]["kernel"] == "k29" and ours["node_add_7"]["kernel"] == "k28"
    assert ours["node_Conv_838"]["kernel"] == "k30" and ours["node_Conv_832"]["kernel"] == "k29"


def test_cudnn_convs_compares_a_joined_projection_in_its_host_kernel():
    from benchmarks import cudnn_convs

    def conv(node, out, flops, us):
        return {"node": node, "x": [32, 64, 56, 56], "out": out, "kernel": [1, 1], "stride": [1, 1], "lib": "cuBLAS",
                "us": us, "flops": flops, "bytes": 1e7}
    res = [conv("a", [32, 256, 56, 56], 2e9, 20.0), conv("b", [32, 256, 56, 56], 2e9, 22.0),
           conv("c", [32, 64, 56, 56], 1e9, 10.0)]
    ours = {"a": {"kernel": "k6", "meas": 24.0, "tflops": 4e9 / 24.0 / 1e6, "gbs": 3000.0},
            "b": {"kernel": "k5", "meas": 3.0, "tflops": 1e-3, "gbs": 4000.0},
            "c": {"kernel": "k7", "meas": 9.0, "tflops": 1e9 / 9.0 / 1e6, "gbs": 3500.0}}
    assert cudnn_convs.joins(res, ours) == {"b": "a"}
    lines, tally = cudnn_convs.compare(res, ours, 4000.0, 989.4)
    assert res[0]["vendor_bar"]["us"] == 42.0 and res[0]["vendor_bar"]["with"] == ["b"]
    assert "runs in k6 with a" in lines[1] and tally["joined"] == 1 and tally["aicf_us"] == 33.0
    # c's kernel does only its own work: nothing is joined to it
    assert res[2]["vendor_bar"]["with"] == []


def test_cudnn_convs_plots_each_convolution_against_its_bar(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import cudnn_convs
    doc = {"convs": [
        {"node": "a", "vendor_bar": {"bound": "memory", "fraction": 0.6, "pass": False},
         "aicf": {"kernel": "k3", "bound": "memory", "fraction": 0.85, "pass": True}},
        {"node": "b", "vendor_bar": {"bound": "compute", "fraction": 0.55, "pass": True},
         "aicf": {"kernel": "k4", "bound": "compute", "fraction": 0.45, "pass": False}},
        {"node": "c"}]}   # joined into another kernel: not drawn
    out = tmp_path / "convs.svg"
    assert cudnn_convs.plot(doc, str(out), "t") == 2
    text = out.read_text()
    assert "k3" in text and "k4" in text and not list(tmp_path.glob(".*.tmp"))
