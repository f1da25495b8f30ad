"""`aicf-run --bench/--profile/--json/--roofline/--no-graph` and the Executor's bench and profile.

Without a GPU: every bad flag combination is one line and exit 2, refused before the GPU is
touched; and the reports on the fake GPU of tests/test_run_cli.py, whose virtual clock makes
every timing exact (a kernel takes KERNEL_US, a launch call HOST_LAUNCH_US more, a graph
replay GRAPH_LAUNCH_US once), the in-plan marginal cost included. On a GPU (marked `gpu`): graph
and plain launches give the same bits, repeated runs allocate nothing, and the reports of the
compiled examples have their shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aicf_run
from aicf_run.bundle import Bundle, read_bundle
from aicf_run.device import open_device
from aicf_run.errors import RunError
from aicf_run.executor import Executor
from aicf_run.profile import GRAPH_LAUNCHES, MAX_COPIES, cold_copies, format_profile, marginals, stored_ranges
from aicfc.artifact import write_bundle
from tests.conftest import gpu_alone
from tests.test_bundle_format import WEIGHT, make_payload
from tests.test_run_cli import (GRAPH_LAUNCH_US, HOST_LAUNCH_US, KERNEL_US, X, FakeDriver,
                                assert_user_error, run_cli)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLAIN_US = HOST_LAUNCH_US + KERNEL_US     # one kernel launched by the host, on the fake clock
GRAPH_US = GRAPH_LAUNCH_US + KERNEL_US    # the one-kernel plan replayed as a graph
# --profile: a kernel alone, per launch, in a graph of GRAPH_LAUNCHES launches of it.
ALONE_US = (GRAPH_LAUNCH_US + GRAPH_LAUNCHES * KERNEL_US) / GRAPH_LAUNCHES


@pytest.fixture
def roofline_bundle(tmp_path: Path) -> Path:
    """The fake bundle with a target profile that a roofline can be drawn from."""
    payload = make_payload()
    payload["target"]["profile"].update(dram_bandwidth_gbs=1000, peak_tflops={"fp32_simt": 10.0})
    path = tmp_path / "roof.aicf"
    write_bundle(payload, path)
    return path


# --- bad flags: one line, exit 2, before the GPU ---

BAD_FLAGS = [
    (["--bench", "0"], "--bench N needs N >= 1 timed replays, got 0"),
    (["--bench", "-3"], "--bench N needs N >= 1 timed replays, got -3"),
    (["--json"], "--json prints the --bench/--profile/--timeline report; add --bench N, --profile or --timeline"),
    (["--bench", "5", "--json", "--check", "m.onnx"], "--json prints only the timing report"),
    (["--roofline", "r.png"], "--roofline plots the kernels that --profile measures"),
    (["--bench", "5", "--roofline", "r.png"], "add --profile"),
    (["--profile", "--roofline", "r.jpg"], "name the file .png, .svg or .pdf"),
    (["--profile", "--roofline", "nope/r.png"], "folder nope does not exist"),
]


@pytest.mark.parametrize("flags,fragment", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_bad_flag_combination(bundle_path: Path, fake_gpu: FakeDriver, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch, flags: list[str],
                              fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(bundle_path, *flags), fragment)
    assert fake_gpu.allocations == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.aicf"], "nothing written"


def test_flags_are_checked_before_the_bundle_is_read(tmp_path: Path) -> None:
    assert_user_error(run_cli(tmp_path / "absent.aicf", "--json"), "--json prints")


def test_roofline_needs_the_targets_roofline_data(bundle_path: Path, fake_gpu: FakeDriver,
                                                  tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert_user_error(run_cli(bundle_path, "--profile", "--roofline", tmp_path / "r.png"),
                      "the target profile has no dram_bandwidth_gbs and peak_tflops")
    assert fake_gpu.allocations == 0


def test_roofline_without_matplotlib(roofline_bundle: Path, fake_gpu: FakeDriver, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert_user_error(run_cli(roofline_bundle, "--profile", "--roofline", tmp_path / "r.png"),
                      "--roofline needs matplotlib; install it with pip install 'aicf[plot]'")
    assert fake_gpu.allocations == 0


def test_bench_without_pycuda(bundle_path: Path, no_pycuda: None) -> None:
    assert_user_error(run_cli(bundle_path, "--bench", "3"), "PyCUDA is not installed")


def test_bench_input_errors_are_still_checked(bundle_path: Path, tmp_path: Path,
                                              fake_gpu: FakeDriver) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2), dtype=np.float32))
    assert_user_error(run_cli(bundle_path, "--bench", "3", "--input", tmp_path / "x.npy"),
                      "input 'x' has shape [3, 2], expected [2, 3]")
    assert fake_gpu.allocations == 0


# --- the reports on the fake GPU (exact, by its virtual clock) ---


def test_bench_table(bundle_path: Path, fake_gpu: FakeDriver, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(bundle_path, "--bench", "7")
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    assert "inputs: random standard normal" in out
    assert f"graph     median {GRAPH_US:9.2f} us" in out
    assert f"launches  median {PLAIN_US:9.2f} us" in out and "(7 replays)" in out
    overhead = (PLAIN_US - GRAPH_US) / 1
    assert f"host overhead per kernel launch without a graph: {overhead:.2f} us" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.aicf"], "no outputs saved"
    assert fake_gpu.memory == {} and fake_gpu.libcuda.execs == {}


def test_bench_no_graph(bundle_path: Path, fake_gpu: FakeDriver) -> None:
    result = run_cli(bundle_path, "--bench", "3", "--no-graph")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "launches  median" in result.stdout
    assert "graph     median" not in result.stdout and "host overhead" not in result.stdout
    assert fake_gpu.libcuda.calls == []


def test_json_report(bundle_path: Path, x_npy: Path, fake_gpu: FakeDriver) -> None:
    result = run_cli(bundle_path, "--bench", "4", "--profile", "--json", "--input", x_npy)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert set(report) == {"bundle", "model", "gpu", "arch", "precision", "graph", "inputs",
                           "bench", "profile"}
    assert (report["gpu"], report["graph"], report["inputs"]) == ("Fake GPU", True,
                                                                  "given with --input")
    bench = report["bench"]
    assert set(bench) == {"kernels", "warmup", "graph", "launches", "host_overhead_per_kernel_us"}
    assert set(bench["graph"]) == {"mode", "replays", "median_us", "p90_us", "min_us", "max_us"}
    assert bench["graph"]["median_us"] == pytest.approx(GRAPH_US)
    assert bench["launches"]["p90_us"] == pytest.approx(PLAIN_US)
    assert bench["host_overhead_per_kernel_us"] == pytest.approx(PLAIN_US - GRAPH_US)
    profile = report["profile"]
    assert set(profile) == {"kernels", "kernel_sum_us", "predicted_sum_us", "plan_us",
                            "mode", "repeats"}
    [kernel] = profile["kernels"]
    assert set(kernel) == {"index", "name", "measured_us", "predicted_us", "flops", "bytes",
                           "share", "gbs", "tflops", "unit", "roofline_pct", "onnx_nodes", "copies"}
    assert kernel["measured_us"] == pytest.approx(ALONE_US)
    assert kernel["gbs"] == pytest.approx(72 / (ALONE_US * 1e3))
    assert kernel["tflops"] == pytest.approx(6 / (ALONE_US * 1e6))
    assert (kernel["name"], kernel["predicted_us"], kernel["share"], kernel["unit"],
            kernel["roofline_pct"], kernel["onnx_nodes"]) == ("add_0", 1.5, 1.0, "fp32_simt",
                                                              None, ["add_0"])
    assert profile["plan_us"] == pytest.approx(GRAPH_US) and profile["mode"] == "graph"


def test_json_keeps_stdout_clean_when_outputs_are_saved(bundle_path: Path, x_npy: Path,
                                                        tmp_path: Path,
                                                        fake_gpu: FakeDriver) -> None:
    result = run_cli(bundle_path, "--bench", "2", "--json", "--input", x_npy,
                     "--output-dir", tmp_path / "out")
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["bench"]["kernels"] == 1
    assert result.stderr.strip() == f"y: float32 [2, 3] -> {tmp_path / 'out' / 'y.npy'}"
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), X + WEIGHT)


def test_profile_table_and_roofline(roofline_bundle: Path, fake_gpu: FakeDriver,
                                    tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "roof.png"
    result = run_cli(roofline_bundle, "--profile", "--roofline", png)
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.splitlines()
    assert lines[1].startswith(f"profile: 1 kernels, each timed alone ({GRAPH_LAUNCHES} "
                               f"back-to-back launches per graph replay")
    header, row = lines[2].split(), lines[3].split()
    assert header[:3] == ["#", "kernel", "measured"] and header[-2:] == ["onnx", "nodes"]
    bound_us = max(72 / (1000 * 1e3), 6 / (10.0 * 1e6))
    assert row == ["0", "add_0", f"{ALONE_US:.2f}", "1.50", f"{ALONE_US / 1.5:.2f}", "100.0%",
                   f"{72 / (ALONE_US * 1e3):.1f}", f"{6 / (ALONE_US * 1e6):.3f}",
                   f"{100 * bound_us / ALONE_US:.1f}%", "add_0"]
    assert lines[4] == (f"  sum of kernel times {ALONE_US:.2f} us (predicted 1.50 us); whole "
                        f"plan (graph, back-to-back replays) {GRAPH_US:.2f} us")
    within = 1 if 0.8 <= ALONE_US / 1.5 <= 1.25 else 0   # the one kernel, measured against its predicted 1.5 us
    assert lines[5] == f"  measured / predicted within [0.8, 1.25]: {within} of 1 kernels"
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert result.stderr.strip() == (f"wrote {png}: 1 kernel(s), measured beside predicted, on "
                                     f"the sm_90 roofline")


def test_profile_names_the_kernels_past_the_roofline() -> None:
    """A kernel measured faster than its roofline allows kept its bytes in L2 between its launches alone: the table
    says which, and where their time in the plan is."""
    from aicf_run.profile import KernelProfile, ProfileReport

    def kernel(i: int, roofline: float | None) -> KernelProfile:
        return KernelProfile(index=i, name=f"k{i}", measured_us=2.0, predicted_us=2.0, flops=None, bytes=None,
                             share=0.5, gbs=None, tflops=None, unit=None, roofline_pct=roofline, onnx_nodes=())
    report = ProfileReport(kernels=(kernel(0, 99.0), kernel(1, 157.8)), kernel_sum_us=4.0, predicted_sum_us=4.0,
                           plan_us=4.5, mode="graph", repeats=5)
    last = format_profile(report).splitlines()[-1]
    assert last.startswith("  1 kernel(s) ran past the roofline (k1): repeated alone, their bytes stayed in L2")
    assert "aicf-run --timeline" in last
    plain = ProfileReport(kernels=(kernel(0, 99.0), kernel(1, None)), kernel_sum_us=4.0, predicted_sum_us=4.0,
                          plan_us=4.5, mode="graph", repeats=5)
    assert "past the roofline" not in format_profile(plain)


def test_executor_api(bundle_path: Path, fake_gpu: FakeDriver) -> None:
    device = open_device()
    bundle = read_bundle(bundle_path)
    executor = Executor(bundle, device)
    only_graph = executor.bench(3, graph=True)
    assert only_graph.launches is None and only_graph.host_overhead_per_kernel_us is None
    assert only_graph.graph.median_us == pytest.approx(GRAPH_US)
    with pytest.raises(RunError, match="--bench needs at least 1 replay"):
        executor.bench(0)
    # An executor without a graph captures one when asked to time with it.
    plain = Executor(bundle, device, graph=False)
    assert not plain.uses_graph
    both = plain.bench(2)
    assert both.graph is not None and both.launches is not None
    kernels = plain.profile()
    assert kernels.mode == "launches" and kernels.kernels[0].measured_us == pytest.approx(PLAIN_US)
    np.testing.assert_array_equal(plain.run({"x": X})["y"], X + WEIGHT)
    device.close()
    assert fake_gpu.memory == {} and fake_gpu.libcuda.execs == {}
    with pytest.raises(RunError, match="this executor is closed"):
        executor.launch()


def test_profile_rotates_weights_over_copies_past_the_l2(tmp_path: Path, fake_gpu: FakeDriver,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """[Note: cold weights] (aicf_run/profile.py): where the target names its L2, a kernel's launches rotate
    over copies of the weights it reads (L2 96 bytes, the kernel's predicted 72: 2 x 96 / 72 -> 3, + 1 = 4
    copies), each launch of one copy reading what the original holds; the copies are freed after."""
    payload = make_payload()
    payload["target"]["profile"]["l2_bytes"] = 96
    path = tmp_path / "cold.aicf"
    write_bundle(payload, path)
    device = open_device()
    for graph in (True, False):
        executor = Executor(read_bundle(path), device, graph=graph)
        made, copy = [], executor.device_copy

        def spy(pointer: int, nbytes: int, copy=copy, made=made) -> Any:
            allocation = copy(pointer, nbytes)
            made.append(fake_gpu.read(int(allocation), nbytes))
            return allocation
        monkeypatch.setattr(executor, "device_copy", spy)
        held = set(fake_gpu.memory)
        fake_gpu.launches.clear()
        report = executor.profile()
        [kernel] = report.kernels
        assert kernel.copies == 4 and made == [WEIGHT.tobytes()] * 3   # three copies of the weight besides it
        if graph:   # 20 launches a replay either way (4 copies x 5)
            assert kernel.measured_us == pytest.approx(ALONE_US)
            assert "1 with their weights, state and outputs rotated over copies past the L2" in format_profile(report)
        launched = [args for symbol, _, _, args, _ in fake_gpu.launches if symbol == "add"]
        assert len({args[1] for args in launched}) == 4            # the weight, at four addresses
        assert {(args[0], args[2]) for args in launched} == {launched[0][::2]}   # x and y where they lie
        assert set(fake_gpu.memory) == held                         # every copy freed
        np.testing.assert_array_equal(executor.run({"x": X})["y"], X + WEIGHT)
    device.close()


def _profiled_writer(payload: dict, path: Path, fake_gpu: FakeDriver) -> tuple[Any, Any, list[tuple[int, ...]]]:
    """`payload`'s one kernel storing y, with an L2 of 96 bytes (4 copies), profiled: (device, executor, the
    arguments of each of the fake kernel's launches)."""
    payload["target"]["profile"]["l2_bytes"] = 96
    payload["kernels"][0]["stores"] = ["y"]
    write_bundle(payload, path)
    device = open_device()
    executor = Executor(read_bundle(path), device)
    fake_gpu.launches.clear()
    [kernel] = executor.profile().kernels
    assert kernel.copies == 4
    return device, executor, [args for symbol, _, _, args, _ in fake_gpu.launches if symbol == "add"]


def test_profile_rotates_the_outputs_it_writes(tmp_path: Path, fake_gpu: FakeDriver) -> None:
    """[Note: outputs written back] (aicf_run/profile.py): the arena buffer a kernel stores rotates over copies with
    its weight (L2 96 bytes: 4 copies); the input x stays where it lies, and the run after the profile is right."""
    device, executor, launched = _profiled_writer(make_payload(), tmp_path / "outputs.aicf", fake_gpu)
    assert len({args[2] for args in launched}) == 4 and len({args[1] for args in launched}) == 4   # y and w move
    assert len({args[0] for args in launched}) == 1                                                   # x does not
    np.testing.assert_array_equal(executor.run({"x": X})["y"], X + WEIGHT)
    device.close()


def test_profile_moves_an_update_in_place_with_its_input(tmp_path: Path, fake_gpu: FakeDriver) -> None:
    """y = x + b + w written over b (the same bytes, another name): the profile's launches rotate b and y over the
    same copies (L2 96 bytes: 4), x where it lies."""
    payload = make_payload(two_inputs=True)
    payload["buffers"][3]["offset"] = payload["buffers"][1]["offset"]
    device, _, launched = _profiled_writer(payload, tmp_path / "in_place.aicf", fake_gpu)
    assert all(args[1] == args[3] for args in launched) and len({args[3] for args in launched}) == 4
    assert len({args[0] for args in launched}) == 1
    device.close()


def test_an_output_updated_in_place_moves_with_its_input() -> None:
    """An activation written in place under another name (its bytes exactly those of an input) moves with that
    input, one copy for both, unless the kernel before wrote them (warm in the plan); one that overlaps another
    argument only in part stays; one apart from every other argument moves alone."""
    buffers = [{"name": "x", "region": "arena", "offset": 0, "nbytes": 24},
               {"name": "y", "region": "arena", "offset": 0, "nbytes": 24},
               {"name": "z", "region": "arena", "offset": 256, "nbytes": 24},
               {"name": "w", "region": "weights", "offset": 0, "nbytes": 24},
               {"name": "v", "region": "arena", "offset": 8, "nbytes": 24}]
    in_place = {"args": [0, 3, 1], "stores": ["y"], "predicted": {"bytes": 72}}
    assert cold_copies(in_place, buffers, 96) == (4, [0, 1, 2])
    assert cold_copies(in_place, buffers, 96, warm=((16, 40),)) == (4, [1])
    assert cold_copies(in_place, buffers, 96, warm=((24, 40),)) == (4, [0, 1, 2])
    assert cold_copies({"args": [4, 3, 1], "stores": ["y"], "predicted": {"bytes": 72}}, buffers, 96) == (4, [1])
    assert cold_copies({"args": [0, 3, 2], "stores": ["z"], "predicted": {"bytes": 72}}, buffers, 96) == (4, [1, 2])
    before = {"args": [2, 1], "stores": ["y"]}
    assert stored_ranges(before, buffers) == ((0, 24),)


def test_cold_copies_stay_within_their_budget() -> None:
    """A buffer whose copies would pass COPY_L2S L2s is read where it lies; past the L2, or an arena buffer the
    kernel does not store, never copied; the smallest are copied first."""
    buffers = [{"region": "weights", "nbytes": 8}, {"region": "weights", "nbytes": 46},
               {"region": "arena", "nbytes": 4}, {"region": "weights", "nbytes": 131},
               {"region": "state", "nbytes": 2}]
    kernel = {"args": [0, 1, 2, 3, 4], "predicted": {"bytes": 10}}
    # 2 x 50 / 10 -> 10, + 1 = 11 copies: 10 more of 2 and 8 (100 of the 200 allowed), not of 46 (460)
    assert cold_copies(kernel, buffers, 50) == (11, [0, 4])
    assert cold_copies({"args": [2, 3], "predicted": {}}, buffers, 50) == (1, [])
    assert cold_copies({"args": [1]}, buffers, 50) == (4, [0])   # no prediction: its own 46 bytes
    assert cold_copies({"args": [4], "predicted": {"bytes": 0.5}}, buffers, 50) == (MAX_COPIES, [0])


def test_marginal_is_the_plan_less_the_plan_without_the_kernel(bundle_path: Path, fake_gpu: FakeDriver) -> None:
    """On the fake clock a kernel costs KERNEL_US wherever it runs; the plan without the fake
    bundle's one kernel is an empty graph's replay."""
    device = open_device()
    for graph in (True, False):
        executor = Executor(read_bundle(bundle_path), device, graph=graph)
        assert marginals(executor) == pytest.approx([KERNEL_US if graph else PLAIN_US])
    device.close()


# --- on a real GPU ---

EXAMPLES = [("mlp", "fp32"), ("block", "fp32"), ("block", "fp16"), ("mlp", "bf16")]


@pytest.fixture(scope="module")
def payloads(gpu_device: Any) -> dict[tuple[str, str], dict]:
    import aicfc
    import examples.build_examples as ex
    return {(name, precision): aicfc.compile(ex.BUILDERS[name](), target=gpu_device.arch,
                                             precision=precision)
            for name, precision in EXAMPLES}


def _inputs(bundle: Bundle, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {item["name"]: rng.standard_normal(item["shape"]).astype(item["dtype"])
            for item in bundle.inputs}


@pytest.mark.gpu
@pytest.mark.parametrize("name,precision", EXAMPLES, ids=[f"{n}-{p}" for n, p in EXAMPLES])
def test_graph_and_plain_launches_give_identical_bits(payloads: dict, gpu_device: Any,
                                                      name: str, precision: str) -> None:
    bundle = Bundle.from_payload(payloads[name, precision])
    inputs = _inputs(bundle, seed=11)
    with_graph = Executor(bundle, gpu_device)
    plain = Executor(bundle, gpu_device, graph=False)
    try:
        assert with_graph.uses_graph and not plain.uses_graph
        with_graph.poison()
        plain.poison()
        a, b = with_graph.run(inputs), plain.run(inputs)
        again = with_graph.run(inputs)
    finally:
        with_graph.close()
        plain.close()
    for output in a:
        assert np.isfinite(a[output]).all()
        assert a[output].tobytes() == b[output].tobytes(), f"{output}: graph != plain"
        assert a[output].tobytes() == again[output].tobytes(), f"{output}: replay differs"


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "plain"])
def test_repeated_runs_allocate_no_device_memory(payloads: dict, gpu_device: Any,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 graph: bool) -> None:
    cuda = gpu_device.driver
    bundle = Bundle.from_payload(payloads["block", "fp32"])
    executor = Executor(bundle, gpu_device, graph=graph)
    calls: list[str] = []
    for name in ("mem_alloc", "pagelocked_empty", "Stream", "Event"):
        real = getattr(cuda, name)
        monkeypatch.setattr(cuda, name, lambda *a, _real=real, _name=name, **k:
                            calls.append(_name) or _real(*a, **k))
    try:
        gpu_device.context.synchronize()
        free_before = cuda.mem_get_info()[0]
        inputs = _inputs(bundle, seed=3)
        first = executor.run(inputs)
        for _ in range(10):
            out = executor.run(inputs)
            assert out["y"].tobytes() == first["y"].tobytes()
            assert out["y"] is not first["y"]
        free_after = cuda.mem_get_info()[0]
    finally:
        executor.close()
    assert calls == [], "run() allocates nothing"
    if gpu_alone():   # the free memory is the whole device's: other pytest -n workers move it
        assert free_after == free_before


@pytest.mark.gpu
def test_bench_and_profile_reports(payloads: dict, gpu_device: Any) -> None:
    bundle = Bundle.from_payload(payloads["block", "fp32"])
    executor = Executor(bundle, gpu_device)
    try:
        inputs = _inputs(bundle, seed=5)
        before = executor.run(inputs)["y"]
        report = executor.bench(30)
        profile = executor.profile()
        costs = marginals(executor)
        after = executor.run(inputs)["y"]
    finally:
        executor.close()
    assert before.tobytes() == after.tobytes(), "timing changes no result"
    kernels = len(bundle.kernels)
    assert report.kernels == kernels and report.host_overhead_per_kernel_us is not None
    for timing in (report.graph, report.launches):
        assert timing.replays == 30
        assert 0 < timing.min_us <= timing.median_us <= timing.p90_us <= timing.max_us
    assert report.graph.mode == "graph" and report.launches.mode == "launches"
    assert json.dumps(report.as_dict())
    assert [k.name for k in profile.kernels] == [k["name"] for k in bundle.kernels]
    assert [list(k.onnx_nodes) for k in profile.kernels] == [k["onnx_nodes"]
                                                            for k in bundle.kernels]
    assert all(k.measured_us > 0 and k.roofline_pct > 0 and k.gbs > 0 for k in profile.kernels)
    assert sum(k.share for k in profile.kernels) == pytest.approx(1.0)
    assert profile.kernel_sum_us == pytest.approx(sum(k.measured_us for k in profile.kernels))
    assert profile.plan_us > 0 and profile.mode == "graph"
    first = json.loads(json.dumps(profile.as_dict()))["kernels"][0]
    assert first["name"] == bundle.kernels[0]["name"]
    # every kernel costs time in the plan (to within the two medians' noise)
    assert len(costs) == kernels and all(np.isfinite(costs)) and sum(costs) > 0


@pytest.mark.gpu
def test_load_with_and_without_graph(payloads: dict, tmp_path: Path) -> None:
    path = tmp_path / "mlp.aicf"
    write_bundle(payloads["mlp", "fp32"], path)
    outputs = []
    for graph in (True, False):
        executor = aicf_run.load(path, graph=graph)
        assert executor.uses_graph is graph
        outputs.append(executor.run(_inputs(executor.bundle, seed=9))["y"])
        executor.device.close()
    assert outputs[0].tobytes() == outputs[1].tobytes()


def _cli(*args: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aicf_run", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.gpu
def test_cli_bench_profile_json_roofline(payloads: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    bundle = tmp_path / "block.aicf"
    write_bundle(payloads["block", "fp32"], bundle)
    kernels = len(payloads["block", "fp32"]["kernels"])

    done = _cli(bundle, "--bench", "20", "--profile")
    assert done.returncode == 0 and done.stderr == "", (done.stdout, done.stderr)
    assert "inputs: random standard normal" in done.stdout
    assert "host overhead per kernel launch without a graph" in done.stdout
    assert "sum of kernel times" in done.stdout
    assert list(tmp_path.iterdir()) == [bundle], "no outputs saved without --output-dir"

    png = tmp_path / "roof.png"
    done = _cli(bundle, "--bench", "10", "--profile", "--json", "--roofline", png)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bench"]["graph"]["replays"] == 10
    assert len(report["profile"]["kernels"]) == kernels
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert done.stderr.strip() == (f"wrote {png}: {kernels} kernel(s), measured beside "
                                   f"predicted, on the {report['arch']} roofline")

    np.save(tmp_path / "x.npy", np.ones((16, 64), np.float32))
    done = _cli(bundle, "--input", tmp_path / "x.npy", "--no-graph", "--bench", "5", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["graph"] is False and report["bench"]["graph"] is None
    assert report["inputs"] == "given with --input"


def test_tensor_core_units_are_held_to_the_tensor_cores_peak() -> None:
    """`--profile`'s roofline column: every unit that multiplies on tensor cores against its dtype's peak (the taps
    and pool convolutions were held to the fp32 pipes' and showed 500-800%), the rest against fp32's."""
    from aicf_run.profile import peak_unit
    for unit in ("mma", "wgmma", "taps", "pool"):
        assert peak_unit({"params": {"unit": unit, "dtype": "f16"}}) == "fp16_tc"
    assert peak_unit({"params": {"unit": "gemv", "TC": 1, "BN": 128}}) == "fp32_simt"
    assert peak_unit({"params": {"threads": 128, "vec": 8}}) == "fp32_simt"
