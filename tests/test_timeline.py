"""`aicfc compile --timeline` and `aicf-run --timeline` on the host ([Note: timeline] in
aicfc/codegen/timeline.py): the stamps change nothing but the kernels' entries, the bundle
records where they are, the report's arithmetic, and the refusals. On the GPU:
tests/test_timeline_gpu.py."""
from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

import aicfc
from aicf_run.bundle import Bundle
from aicf_run.errors import RunError
from aicf_run.timeline import EARLY_NS, format_timeline, summarize
from aicfc.codegen import timeline
from tests.test_plans import mlp_model


@pytest.fixture(scope="module")
def payloads():
    model = mlp_model()
    return {mode: aicfc.compile(model, target="sm_90", precision="fp16", shapes={"x": (4, 256)}, timeline=stamped,
                                dependent_launch=pdl)
            for mode, stamped, pdl in (("plain", False, True), ("stamped", True, True),
                                       ("stamped_stream", True, False))}


def _unstamped(source: str) -> str:
    """`source` as it would be without --timeline: the helper, the arrays and the entries undone."""
    source = source.replace(timeline.HELPER, "")
    source = re.sub(r"__device__ unsigned long long aicf_tl_\w+\[\d+\];\n", "", source)
    source = re.sub(r" AicfTimelineExit<aicf_tl_\w+, \d+u> aicf_tl_exit;", "", source)
    source = re.sub(r"aicf_timeline_phase\(aicf_tl_\w+, \d+u, (\d+)u\);   // phase \d+: ", r"// [Note: timeline] phase \1: ",
                    source)
    return re.sub(r"aicf_timeline_entry\(aicf_tl_\w+, \d+u(?:, (\d+u))?\);",
                  lambda m: f"aicf_pdl_entry({m.group(1)});" if m.group(1) else "aicf_pdl_entry();", source)


def test_stamps_change_only_the_entries(payloads):
    plain, stamped = payloads["plain"], payloads["stamped"]
    assert len(plain["modules"]) == len(stamped["modules"])
    kernel_modules = {k["module"] for k in stamped["kernels"]}   # not the interface casts' module
    for i, (a, b) in enumerate(zip(plain["modules"], stamped["modules"])):
        assert (b["source"] != a["source"]) == (i in kernel_modules)
        assert _unstamped(b["source"]) == a["source"]
    for k in stamped["kernels"]:
        blocks = min(timeline.CAP, int(np.prod(k["grid"])))
        source = stamped["modules"][k["module"]]["source"]
        phases = timeline.phase_labels(source, k["name"])
        assert k["timeline"] == {"symbol": f"aicf_tl_{k['name']}", "blocks": blocks, "stamps": timeline.STAMPS,
                                 **({"phases": phases} if phases else {})}
        assert source.count(f"__device__ unsigned long long aicf_tl_{k['name']}[{timeline.STAMPS * blocks}];") == 1
        assert source.count(f"aicf_timeline_entry(aicf_tl_{k['name']}, {blocks}u") == 1
        assert source.count(f"AicfTimelineExit<aicf_tl_{k['name']}, {blocks}u> aicf_tl_exit;") == 1
        assert k["timeline"]["symbol"].encode() + b"\0" in stamped["modules"][k["module"]]["cubin"]
    assert all("timeline" not in k for k in plain["kernels"])
    # same schedules: the stamps are not a decision
    assert [k["params"] for k in plain["kernels"]] == [k["params"] for k in stamped["kernels"]]


def test_stamps_in_plain_launches(payloads):
    stream = payloads["stamped_stream"]
    assert {k["launch"] for k in stream["kernels"]} == {"stream"}
    for k in stream["kernels"]:
        assert f"aicf_timeline_entry(aicf_tl_{k['name']}, {k['timeline']['blocks']}u);" in \
            stream["modules"][k["module"]]["source"]


def test_gemv_stamps_after_its_early_loads():
    """A gemv whose weight loads precede the wait (PRE = 1) stamps where the wait is, after them."""
    from aicfc.codegen import pdl
    source = "__global__ void k7(const float* w) {\n  float a = w[0];\n  " + pdl.MARK + "\n  a += 1;\n}\n"
    out = timeline.instrument(source, "k7", (3, 2, 1))
    assert out.startswith(f"__device__ unsigned long long aicf_tl_k7[{6 * timeline.STAMPS}];\n")
    assert ("float a = w[0];\n  aicf_timeline_entry(aicf_tl_k7, 6u); AicfTimelineExit<aicf_tl_k7, 6u> aicf_tl_exit;\n"
            "  a += 1;") in out
    assert timeline.instrument(source, "k7", (5000, 1, 1), 4224).count("aicf_timeline_entry(aicf_tl_k7, 4096u, 4224u);") == 1


def test_no_exit_stamp_in_a_nested_scope():
    """A mark inside a nested block: the exit object would be destroyed at that block's end, not as the
    kernel returns, so only the entry is stamped."""
    from aicfc.codegen import pdl
    source = "__global__ void k3(float* p) {\n  if (p) {\n    " + pdl.MARK + "\n  }\n}\n"
    out = timeline.instrument(source, "k3", (1, 1, 1))
    assert "aicf_timeline_entry(aicf_tl_k3, 1u);" in out and "AicfTimelineExit" not in out
    assert timeline.exits_stamped("__global__ void k4(float* p) {\n  " + pdl.MARK + "\n}\n", "k4")


def test_phase_marks_become_stamps():
    """A template's phase marks: comments in a plain plan, thread 0's clock in a stamped one, named in the bundle."""
    from aicfc.codegen import pdl
    marks = timeline.phase_mark(0, "streamed") + "\n  a += 2;\n  " + timeline.phase_mark(2, "merged")
    source = "__global__ void k5(float* p) {\n  " + pdl.MARK + "\n  float a = p[0];\n  " + marks + "\n  p[0] = a;\n}\n"
    out = timeline.instrument(source, "k5", (4, 1, 1))
    assert "aicf_timeline_phase(aicf_tl_k5, 4u, 0u);   // phase 0: streamed\n  a += 2;" in out
    assert "aicf_timeline_phase(aicf_tl_k5, 4u, 2u);   // phase 2: merged" in out
    assert timeline.phase_labels(out, "k5") == ["streamed", "", "merged"]
    assert timeline.phase_labels(out, "k6") == []
    assert "[Note: timeline] phase" not in out
    with pytest.raises(AssertionError, match="marked twice"):
        timeline.instrument(source.replace("merged", "x").replace("phase 2", "phase 0"), "k5", (4, 1, 1))
    with pytest.raises(AssertionError):
        timeline.phase_mark(timeline.PHASES, "past the last")


def test_decode_kernels_mark_their_phases():
    """The gemv and the split attention of a decode step name their phases in a stamped bundle."""
    from tests.test_row_scale import decode_shapes, decoder
    payload = aicfc.compile(decoder(), target="sm_90", precision="fp16", shapes=decode_shapes(1), timeline=True)
    by_family = {}
    for k in payload["kernels"]:
        by_family.setdefault((k["family"], k["params"].get("unit")), k["timeline"].get("phases"))
    gemv = [p for (f, u), p in by_family.items() if f == "gemm" and p]
    assert gemv and all(p[:2] == ["weights streamed", "block summed"] for p in gemv)
    attention = [p for (f, u), p in by_family.items() if f == "attention" and p]
    assert attention and attention[0][:6] == ["query staged", "tile landed", "scores", "softmax", "keys scored",
                                              "warps merged"]


def _stamps(blocks_of: list[list[tuple[int, ...]]]) -> list[np.ndarray]:
    """Per kernel (arrived, ready[, exited]) a block; exited 0 where not given."""
    return [np.array([(*b, 0)[:3] for b in blocks], dtype=np.uint64).reshape(-1, 3) for blocks in blocks_of]


KERNELS = [{"name": "k0", "predicted": {"time_us": 2.0}, "onnx_nodes": ["a"]},
           {"name": "k1", "predicted": {"time_us": 3.0}, "onnx_nodes": ["b"]},
           {"name": "k2", "predicted": {"time_us": 1.0}, "onnx_nodes": ["c"]}]


def test_summarize_arithmetic():
    t = 1_000_000_000
    one = _stamps([
        [(t, t + 50, t + 2000), (t + 400, t + 420, t + 2500)],        # k0: starts at t + 50, done at t + 2500
        [(t + 1000, t + 3050, t + 4000), (t + 2000, t + 3060, t + 4100), (t + 3100, t + 3120, t + 4200)],
        [(t + 5000, t + 5040), (0, 0)]])                               # one block never reached its entry; no exits
    report = summarize([one, one, one], KERNELS)
    k0, k1, k2 = report.kernels
    assert (k0.go_us, k0.chain_us, k0.early, k0.reached) == (0.0, 3.0, 0, 2)
    assert k1.go_us == 3.0 and k1.early == 2 and k1.reached == 3
    assert k1.first_landed_us == pytest.approx(0.95) and k1.last_landed_us == pytest.approx(3.05)
    assert k1.chain_us == pytest.approx(1.99)
    assert k2.chain_us is None and (k2.reached, k2.blocks) == (1, 2)
    assert k0.done_us == pytest.approx(2.45) and k1.done_us == pytest.approx(4.15) and k2.done_us is None
    assert report.last_go_us == pytest.approx(4.99) and report.predicted_sum_us == 6.0
    text = format_timeline(report)
    assert "1/2" in text and "1 of 2 kernels after the first had blocks land early" in text
    # after done: k0 0.55 (3.00 - 2.45), k1 0.84 (4.99 - 4.15)
    assert "1.39 of them after a kernel was done" in text
    # k0 3.00 in chain against 2.0 predicted, k1 1.99 against 3.0: neither within the band; k2 has no chain
    assert "in chain / predicted within [0.8, 1.25]: 0 of 2 kernels" in text
    near = summarize([one], [dict(KERNELS[0], predicted={"time_us": 2.7}), *KERNELS[1:]])
    assert "in chain / predicted within [0.8, 1.25]: 1 of 2 kernels" in format_timeline(near)
    # an arrival within EARLY_NS of the go is the wait's own latency, not early
    late = _stamps([[(t, t + 10)], [(t + 3000 - EARLY_NS + 1, t + 3000)], [(t + 4000, t + 4010)]])
    assert all(k.done_us is None for k in summarize([late], KERNELS).kernels)
    # a kernel stamping 2 of its 5 blocks: its end is not known
    partly = [{**k, "grid": [5 if i == 0 else 3, 1, 1]} for i, k in enumerate(KERNELS)]
    report = summarize([one], partly)
    assert report.kernels[0].done_us is None and report.kernels[1].done_us == pytest.approx(4.15)
    assert summarize([late], KERNELS).kernels[1].early == 0


def test_summarize_phases():
    """Each phase: the median and the last block's mark after the go; blocks that left before it are skipped."""
    t = 2_000_000
    blocks = [(t, t + 100, t + 4100, t + 1100, t + 2100, 0, 0, 0, 0),
              (t, t + 300, t + 3100, t + 1300, 0, 0, 0, 0, 0),       # left before phase 1
              (t, t + 200, t + 5100, t + 2100, t + 3100, 0, 0, 0, 0)]
    arrays = [np.array(blocks, dtype=np.uint64)[:, :3 + timeline.PHASES]]
    kernels = [{"name": "k0", "predicted": {"time_us": 1.0}, "onnx_nodes": ["a"],
                "timeline": {"phases": ["loop", "merged"]}}]
    k0 = summarize([arrays, arrays], kernels).kernels[0]
    assert [p.name for p in k0.phases] == ["loop", "merged", "exit"]
    assert (k0.phases[0].median_us, k0.phases[0].last_us) == pytest.approx((1.2, 2.0))
    assert (k0.phases[1].median_us, k0.phases[1].last_us) == pytest.approx((2.5, 3.0))
    assert (k0.phases[2].median_us, k0.phases[2].last_us) == pytest.approx((4.0, 5.0))
    assert "loop 1.20/2.00 · merged 2.50/3.00 · exit 4.00/5.00" in format_timeline(summarize([arrays], kernels))
    from aicf_run.timeline import timeline_svg   # a tick a mark on the kernel's bar, not one for the exits
    svg = timeline_svg(summarize([arrays], kernels), "phases")
    assert svg.count('stroke="#fd8d3c"') == 2 and "loop 1.20 us after go" in svg
    assert summarize([arrays], [{**kernels[0], "timeline": {}}]).kernels[0].phases == ()


def test_summarize_medians_over_rounds():
    t = 5_000_000
    rounds = [_stamps([[(t, t)], [(t + c, t + c)], [(t + 2 * c, t + 2 * c)]]) for c in (1000, 3000, 2000)]
    report = summarize(rounds, KERNELS)
    assert report.kernels[0].chain_us == 2.0 and report.kernels[1].go_us == 2.0 and report.rounds == 3


def test_summarize_refuses_a_kernel_without_stamps():
    with pytest.raises(RunError, match=r"kernel 1 \(k1\): no block stamped its entry"):
        summarize([_stamps([[(1, 2)], [(0, 0)], [(3, 4)]])], KERNELS)


def _bad(payload: dict, **change) -> dict:
    kernels = [dict(k) for k in payload["kernels"]]
    kernels[0] = {**kernels[0], "timeline": {**kernels[0]["timeline"], **change}}
    return {**payload, "kernels": kernels}


def test_schema_bounds_the_record(payloads):
    stamped = payloads["stamped"]
    Bundle.from_payload(stamped)
    grid = int(np.prod(stamped["kernels"][0]["grid"]))
    with pytest.raises(RunError, match="more than the kernel's"):
        Bundle.from_payload(_bad(stamped, blocks=grid + 1))
    with pytest.raises(RunError, match="not a C identifier"):
        Bundle.from_payload(_bad(stamped, symbol="a b"))
    with pytest.raises(RunError, match="timeline.blocks"):
        Bundle.from_payload(_bad(stamped, blocks=0))
    with pytest.raises(RunError, match=f"more than the {timeline.PHASES} stamped"):
        Bundle.from_payload(_bad(stamped, phases=["a"] * (timeline.PHASES + 1)))
    with pytest.raises(RunError, match=r"phases\[1\]"):
        Bundle.from_payload(_bad(stamped, phases=["a", "b" * 41]))
    with pytest.raises(RunError, match="timeline.stamps"):
        Bundle.from_payload(_bad(stamped, stamps=3 + timeline.PHASES + 1))


def test_cli_refuses_a_bundle_without_stamps(payloads, tmp_path):
    from aicf_run.cli import main
    from aicfc.artifact import write_bundle
    path = tmp_path / "plain.aicf"
    write_bundle(payloads["plain"], path)
    result = CliRunner().invoke(main, ["run", str(path), "--timeline"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"aicf-run: error: --timeline reads the stamps of a bundle compiled with them, and {path} has none; "
        f"recompile it with aicfc compile --timeline"]


def test_compile_cli_flag(tmp_path):
    from aicfc.cli import main
    from aicf_run.bundle import read_bundle
    onnx_path = tmp_path / "mlp.onnx"
    import onnx
    onnx.save(mlp_model(), str(onnx_path))
    out = tmp_path / "mlp.aicf"
    result = CliRunner().invoke(main, ["compile", str(onnx_path), "-o", str(out), "--shape", "x=4x256", "--timeline", "-q"])
    assert result.exit_code == 0, result.output
    assert all("timeline" in k for k in read_bundle(str(out)).kernels)


def test_svg_draws_every_kernel(tmp_path):
    from aicf_run.timeline import save_svg, timeline_svg
    t = 1_000_000_000
    report = summarize([_stamps([[(t, t + 50, t + 2000)], [(t + 1000, t + 3000, t + 6000)],
                                 [(t + 5000, t + 6500, t + 9000)]])], KERNELS)
    svg = timeline_svg(report, "a <model>")
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "a &lt;model&gt;" in svg and svg.count('fill="#08519c"') == 3
    assert svg.count('fill="#9ecae1"') == 2 and svg.count('fill="#bbb"') == 2   # k1, k2 landed early; 2 boundaries
    path = tmp_path / "t.svg"
    save_svg(str(path), svg)
    assert path.read_text() == svg and [p.name for p in tmp_path.iterdir()] == ["t.svg"]
    with pytest.raises(RunError, match="cannot write"):
        save_svg(str(tmp_path / "missing" / "t.svg"), svg)


def test_cli_refuses_svg_without_timeline(payloads, tmp_path):
    from aicf_run.cli import main
    from aicfc.artifact import write_bundle
    path = tmp_path / "s.aicf"
    write_bundle(payloads["stamped"], path)
    result = CliRunner().invoke(main, ["run", str(path), "--timeline-svg", str(tmp_path / "t.svg")])
    assert result.exit_code == 2
    assert result.output.strip() == "aicf-run: error: --timeline-svg draws what --timeline measures; add --timeline"
    result = CliRunner().invoke(main, ["run", str(path), "--timeline", "--timeline-svg", str(tmp_path / "no" / "t.svg")])
    assert result.exit_code == 2 and "does not exist" in result.output and len(result.output.strip().splitlines()) == 1


def test_explain_says_the_bundle_is_stamped(payloads):
    from aicfc.explain import explain_json, explain_text
    assert explain_json(payloads["stamped"])["timeline"] is True and "timeline" not in explain_json(payloads["plain"])
    assert "timeline: every kernel stamps" in explain_text(payloads["stamped"])
    assert "timeline:" not in explain_text(payloads["plain"])


class _FakeDriver:
    """Device memory as a dict of numpy arrays, for aicf_run.timeline's reads and zeroing."""

    def __init__(self, arrays: dict[int, np.ndarray]) -> None:
        self.arrays = arrays

    def memset_d8(self, address: int, value: int, nbytes: int) -> None:
        self.arrays[address].view(np.uint8)[:nbytes] = value

    def memcpy_dtoh(self, host: np.ndarray, address: int) -> None:
        host[...] = self.arrays[address].reshape(host.shape)


class _FakeExecutor:
    """One kernel of one block whose replays stamp consecutive clock values; counts the replays."""

    def __init__(self) -> None:
        self.memory = {8: np.zeros(11, np.uint64)}
        self.device = type("Device", (), {"driver": _FakeDriver(self.memory)})()
        self.bundle = type("B", (), {"kernels": [{"name": "k0", "grid": [1, 1, 1], "timeline": {"stamps": 11}}]})()
        self.launches = 0

    def stamp_arrays(self):
        return [(8, 1)]

    def launch(self) -> None:
        self.launches += 1
        t = 1_000_000 * self.launches
        self.memory[8][:3] = (t, t + 100, t + 900)

    def synchronize(self) -> None:
        pass


def test_busy_timeline_times_a_replay_right_after_another():
    from aicf_run.timeline import timeline as run_timeline
    plain, busy = _FakeExecutor(), _FakeExecutor()
    run_timeline(plain, rounds=3)
    report = run_timeline(busy, rounds=3, busy=True)
    assert plain.launches == 1 + 3 and busy.launches == 1 + 2 * 3   # the warm-up, then one or two a round
    assert report.kernels[0].done_us == pytest.approx(0.8)           # the second replay's own stamps
