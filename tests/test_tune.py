"""`aicfc tune`: candidate selection, Spearman, the profile fit, and the measuring path.

The CPU tests run the measuring path against a fake PyCUDA driver with a virtual clock
(every launch of candidate rank r takes exactly 3 + r/2 us), so tune_model, the timing loop
and the CLI's output are checked without a GPU. The `gpu` test tunes a real MatMul.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from aicf_run.device import Device
from aicf_run.timing import (LONG_MS, MIN_LAUNCHES, MIN_MS, REPEATS, SPIN_LAUNCHES, SPIN_SYMBOL,
                             median_per_launch_us)
from aicfc.cli import main
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.fit import FIELDS, fit_profile, get, predictions, spearman
from aicfc.planner.hardware import load_profile
from aicfc.tune import TuneReport, candidates, select, tune_model


def matmul_softmax(m: int = 64, k: int = 64, n: int = 64, softmax: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h" if softmax else "y"])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["h"], ["y"], axis=-1))
    g = helper.make_graph(nodes, "mm_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------- select

def test_select_top_then_evenly_spread_to_the_slowest():
    assert select(list(range(100)), top=8, spread=8) == [*range(8), 19, 30, 42, 53, 65, 76, 88, 99]
    assert select(list(range(10)), top=3, spread=2) == [0, 1, 2, 6, 9]
    assert select(list(range(10)), top=3, spread=1) == [0, 1, 2, 9]
    assert select(list(range(10)), top=3, spread=0) == [0, 1, 2]


def test_select_small_spaces_take_everything_once():
    assert select(list(range(5)), top=8, spread=8) == [0, 1, 2, 3, 4]
    assert select(list(range(10)), top=4, spread=6) == list(range(10))
    assert select(list(range(10)), top=4, spread=60) == list(range(10))
    assert select([], top=8, spread=8) == []
    picked = select(list(range(1000)), top=8, spread=8)
    assert picked == sorted(set(picked)) and len(picked) == 16


# ---------------------------------------------------------------- spearman

def test_spearman_known_values():
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)   # scipy's example
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 5, 4]) == pytest.approx(0.8)   # 1 - 6*4/(5*24)


def test_spearman_ties_get_average_ranks():
    # ranks x: 1, 2.5, 2.5, 4; y: 1, 2, 3, 4 -> Pearson of the ranks
    x, y = [1.0, 2.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]
    rx = np.array([1, 2.5, 2.5, 4]) - 2.5
    ry = np.array([1, 2, 3, 4]) - 2.5
    assert spearman(x, y) == pytest.approx(float((rx * ry).sum() / math.sqrt((rx ** 2).sum() * (ry ** 2).sum())))
    assert spearman([1, 1, 2, 2], [2, 2, 1, 1]) == pytest.approx(-1.0)


def test_spearman_undefined_is_nan():
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([], []))



# ---------------------------------------------------------------- --kernel

def test_candidates_of_the_kernels_named_by_name_or_onnx_node():
    hw = load_profile("sm_90")
    plan = run_pipeline(import_model(matmul_softmax(), None, name="mm"), Options("sm_90", hw, "fp32")).plan
    names = [k.name for k in plan.kernels]
    assert names == ["k0", "k1"], names
    assert [kt.name for kt in candidates(plan, hw, 2, 1, only=["k1"])] == ["k1"]
    node = plan.kernels[0].origins[0]
    assert [kt.name for kt in candidates(plan, hw, 2, 1, only=[node, "k1"])] == ["k0", "k1"]
    assert [kt.name for kt in candidates(plan, hw, 2, 1, only=[])] == names
    with pytest.raises(AicfError, match=r"--kernel k7, nope: no kernel of this plan .* k0 \.\. k1"):
        candidates(plan, hw, 2, 1, only=["k7", "k0", "nope"])

# ---------------------------------------------------------------- fit_profile

def synthetic_report(truth: dict) -> TuneReport:
    """A report of the block example whose 'measurements' are the cost model's predictions
    under the profile `truth`."""
    import examples.build_examples as ex
    hw = load_profile("sm_90")
    plan = run_pipeline(import_model(ex.BUILDERS["block"](), None, name="block"), Options("sm_90", hw, "fp32")).plan
    report = TuneReport("block", "sm_90", "fp32", "synthetic", hw.data, candidates(plan, hw, 6, 6), plan.types())
    for kt in report.kernels:
        for c in kt.candidates:
            c.measured_us = 1.0   # predictions() covers measured candidates only
    for kt, times in zip(report.kernels, predictions(report, truth)):
        for c, t in zip(kt.candidates, times):
            c.measured_us = float(t)
    return report


def test_fit_recovers_a_modified_profile():
    base = load_profile("sm_90").data
    truth = copy.deepcopy(base)
    truth["efficiency"]["dram"] = 0.6
    truth["efficiency"]["fp32_simt"] = 0.35
    truth["launch_overhead_us"] = 3.0
    truth["load_latency_us"] = 0.8
    report = synthetic_report(truth)
    fitted, stats = fit_profile(report, base)
    assert stats["candidates"] == sum(len(kt.candidates) for kt in report.kernels) > 50
    assert stats["msle_before"] > 0.01
    assert stats["msle_after"] < 0.2 * stats["msle_before"]
    assert stats["spearman_after"] >= stats["spearman_before"] - 1e-9
    assert stats["picks_within_10pct_after"] >= stats["picks_within_10pct_before"]
    for field in ("efficiency.fp32_simt", "launch_overhead_us"):   # the dominant terms come back
        assert get(fitted, field) == pytest.approx(get(truth, field), rel=0.25), field
    # Only the fitted fields move; the rest of the profile and the base are untouched.
    assert {k: v for k, v in fitted.items() if k not in ("efficiency", "calibration")} == \
        {k: v for k, v in base.items() if k != "efficiency"} | {
            f: get(fitted, f) for f in FIELDS if "." not in f}
    assert base["efficiency"]["dram"] == 0.85 and "calibration" not in base
    record = fitted["calibration"]
    assert record["gpu"] == "synthetic" and record["model"] == "block" and record["stats"] == stats
    assert record["candidates_measured"] == stats["candidates"]
    json.dumps(fitted, allow_nan=False)


def test_fit_keeps_a_profile_that_already_matches():
    base = load_profile("sm_90").data
    fitted, stats = fit_profile(synthetic_report(base), base)
    assert stats["msle_before"] == pytest.approx(0.0, abs=1e-12)
    assert all(old == new for old, new in stats["fields"].values())
    assert stats["spearman_after"] == pytest.approx(1.0)


def test_fitted_profile_is_accepted_by_compile(tmp_path: Path):
    base = load_profile("sm_90").data
    truth = copy.deepcopy(base)
    truth["launch_overhead_us"] = 4.0
    fitted, _ = fit_profile(synthetic_report(truth), base)
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(fitted))
    # within 10%: the block example's SIMT GEMMs also pay their epilogue's partial sectors
    # (cost._simt_store_eff), a DRAM term the launch overhead trades against in this small fit (3.78)
    assert load_profile("sm_90", path).data["launch_overhead_us"] == pytest.approx(4.0, rel=0.1)
    model = tmp_path / "mm.onnx"
    onnx.save(matmul_softmax(), model)
    out = subprocess.run([sys.executable, "-m", "aicfc", "compile", str(model), "-o", str(tmp_path / "mm.aicf"),
                          "--profile", str(path), "-q"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- the measuring path, on a fake GPU

class FakeDriver:
    """The slice of pycuda.driver that tuning uses, with a virtual clock in microseconds."""

    class Error(Exception):
        pass

    function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dyn_smem")

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.clock = 0.0
        self.refuse = refuse
        self.launches: dict[str, int] = {}
        self.spins: list[float] = []   # microseconds each spin launch held the stream
        self.live = 0

    def module_from_buffer(self, cubin: bytes):
        assert cubin, "an empty cubin"
        return types.SimpleNamespace(get_function=lambda name: FakeFunction(self, name))

    def mem_alloc(self, n: int):
        self.live += 1
        driver = self

        class Allocation(int):
            def free(self) -> None:
                driver.live -= 1
        return Allocation(4096 * self.live)

    def memcpy_htod(self, dest, array) -> None:
        assert int(dest) and np.asarray(array).nbytes >= 0

    def Event(self):
        driver = self

        class Event:
            t = 0.0

            def record(self) -> None:
                self.t = driver.clock

            def synchronize(self) -> None:
                pass

            def time_since(self, other) -> float:
                return (self.t - other.t) / 1e3   # milliseconds
        return Event()


class FakeFunction:
    num_regs = 40
    max_threads_per_block = 1024

    def __init__(self, driver: FakeDriver, name: str) -> None:
        self.driver, self.name = driver, name
        self.rank = None if name == SPIN_SYMBOL else int(name.rsplit("_c", 1)[1])

    def prepare(self, arg_types: str) -> None:
        self.arg_types = arg_types

    def set_attribute(self, attribute, value) -> None:
        pass

    def prepared_call(self, grid, block, *pointers, shared_size=0) -> None:
        assert len(pointers) == len(self.arg_types)
        if self.rank is None:   # the spin kernel holds the stream for its argument's nanoseconds
            self.driver.spins.append(float(pointers[0]) / 1e3)
            self.driver.clock += float(pointers[0]) / 1e3
            return
        if self.name in self.driver.refuse:
            raise FakeDriver.Error("cuLaunchKernel failed: too many resources requested for launch")
        self.driver.clock += 3.0 + 0.5 * self.rank
        self.driver.launches[self.name] = self.driver.launches.get(self.name, 0) + 1


def fake_device(driver: FakeDriver) -> Device:
    context = types.SimpleNamespace(synchronize=lambda: None, pop=lambda: None, detach=lambda: None)
    return Device(driver=driver, context=context, ordinal=0, name="Fake GPU", arch="sm_90")


def test_tune_model_measures_every_selected_candidate():
    driver = FakeDriver(refuse=("k0_c1",))
    steps: list[tuple[int, int, str]] = []
    report = tune_model(matmul_softmax(), top=3, spread=2, device=fake_device(driver),
                        on_progress=lambda *a: steps.append(a))
    assert report.gpu == "Fake GPU" and report.target == "sm_90"
    assert [(kt.name, kt.family) for kt in report.kernels] == [("k0", "gemm"), ("k1", "row_reduce")]
    for kt in report.kernels:
        assert [c.rank for c in kt.candidates] == select(range(kt.feasible), 3, 2)
        for c in kt.candidates:
            assert c.registers is not None
            if kt.name == "k0" and c.rank == 1:
                assert c.measured_us is None and "too many resources" in c.failed
                continue
            assert c.measured_us == pytest.approx(3.0 + 0.5 * c.rank)
            n = driver.launches[f"{kt.name}_c{c.rank}"]
            assert n >= REPEATS * min(SPIN_LAUNCHES, max(MIN_LAUNCHES, MIN_MS * 1e3 / c.measured_us))
        assert kt.pick_ratio == pytest.approx(1.0) and kt.spearman > 0.8
    assert driver.live == 0, "every buffer is freed"
    # every measurement waited behind the spin kernel, which is not in any timing
    assert len(driver.spins) >= sum(driver.launches.values()) / SPIN_LAUNCHES and min(driver.spins) >= 50.0
    total = len(report.kernels) + sum(len(kt.candidates) for kt in report.kernels)
    assert steps[0][:2] == (0, total) and [s[0] for s in steps] == list(range(total + 1))
    assert sum(s[2].startswith("nvcc") for s in steps) == 1 + len(report.kernels)
    data = report.to_json()
    json.dumps(data, allow_nan=False)
    assert data["picks_within_10pct"] == [2, 2] and data["measured"] == total - len(report.kernels) - 1


@pytest.mark.parametrize("per_launch_ms", [0.001, 0.5, 10.0, 120.0])
def test_launch_counts_bound_the_time_of_slow_kernels(per_launch_ms):
    counts: list[int] = []

    def launches(n: int) -> float:
        counts.append(n)
        return n * per_launch_ms

    assert median_per_launch_us(launches) == pytest.approx(per_launch_ms * 1e3)
    measured = counts[1:]   # after the warm-up
    assert all(n * per_launch_ms >= MIN_MS for n in measured)
    if MIN_LAUNCHES * per_launch_ms <= LONG_MS:
        assert min(measured) >= MIN_LAUNCHES
    else:   # slow: as few launches as reach LONG_MS, so 8192^3 fp32 candidates take seconds, not minutes
        assert max(measured) <= max(1, -(-LONG_MS // per_launch_ms)) and sum(measured) * per_launch_ms < 10 * LONG_MS + 5 * per_launch_ms


def test_cli_tune_prints_the_table_and_writes_the_fitted_profile(tmp_path: Path, monkeypatch):
    import aicf_run.device
    monkeypatch.setattr(aicf_run.device, "open_device", lambda ordinal=0: fake_device(FakeDriver()))
    model = tmp_path / "mm.onnx"
    onnx.save(matmul_softmax(), model)
    fitted, report = tmp_path / "fitted.json", tmp_path / "report.json"
    result = CliRunner().invoke(main, ["tune", str(model), "--top", "3", "--spread", "2",
                                       "-o", str(fitted), "--json", str(report)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "k0 (gemm)" in out and "k1 (row_reduce)" in out and "*+" in out
    assert "Spearman rank correlation over all" in out and "within 10% of the fastest measured: 2 of 2" in out
    assert "mean squared log error" in out
    assert load_profile("sm_90", fitted).data["calibration"]["gpu"] == "Fake GPU"
    data = json.loads(report.read_text())
    assert data["fit"]["candidates"] == data["measured"] > 0
    assert not list(tmp_path.glob(".*")), "no temporary file is left behind"


def test_cli_tune_kernel_option_tunes_only_those(tmp_path: Path, monkeypatch):
    import aicf_run.device
    monkeypatch.setattr(aicf_run.device, "open_device", lambda ordinal=0: fake_device(FakeDriver()))
    model = tmp_path / "mm.onnx"
    onnx.save(matmul_softmax(), model)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["tune", str(model), "--top", "2", "--spread", "1", "--kernel", "k1",
                                       "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "k1 (row_reduce)" in result.stdout and "k0 (gemm)" not in result.stdout
    assert [k["name"] for k in json.loads(report.read_text())["kernels"]] == ["k1"]
    bad = CliRunner().invoke(main, ["tune", str(model), "--kernel", "k9"])
    assert bad.exit_code == 2 and "--kernel k9" in bad.output and "Traceback" not in bad.output, bad.output


def test_cli_tune_without_pycuda_is_one_line(tmp_path: Path):
    # A module named pycuda that is no package: `import pycuda.driver` fails as when PyCUDA is
    # missing, on any machine.
    (tmp_path / "pycuda.py").write_text("")
    model = tmp_path / "mm.onnx"
    onnx.save(matmul_softmax(), model)
    import os
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    out = subprocess.run([sys.executable, "-m", "aicfc", "tune", str(model), "-o", str(tmp_path / "f.json")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aicfc: error:") and "PyCUDA" in lines[0], out.stderr
    assert not (tmp_path / "f.json").exists()


def test_cli_tune_bad_arguments_fail_before_any_gpu_work(tmp_path: Path):
    model = tmp_path / "mm.onnx"
    onnx.save(matmul_softmax(), model)
    for args, needle in ((["-o", str(tmp_path / "no" / "f.json")], "folder does not exist"),
                         (["--top", "0"], "--top"), (["--precision", "fp8"], "--precision")):
        out = subprocess.run([sys.executable, "-m", "aicfc", "tune", str(model), *args], capture_output=True, text=True)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], out.stderr


# ---------------------------------------------------------------- on the GPU

@pytest.mark.gpu
def test_tune_matmul_on_the_gpu(gpu_device, tmp_path: Path):
    report = tune_model(matmul_softmax(256, 256, 256, softmax=False), precision="fp16", top=3, spread=2,
                        device=gpu_device)
    assert report.target == gpu_device.arch and report.gpu == gpu_device.name
    (kt,) = report.kernels
    assert kt.family == "gemm" and len(kt.candidates) == 5
    assert any(c.params.get("unit") == "mma" for c in kt.candidates), "fp16 ranks tensor-core schedules"
    assert kt.pick is not None, [c.failed for c in kt.candidates]
    for c in kt.measured:
        assert math.isfinite(c.measured_us) and 0 < c.measured_us < 1e5
        assert c.registers is not None and c.registers > 0
    assert kt.pick_ratio >= 1.0 and -1.0 <= report.spearman <= 1.0
    fitted, stats = fit_profile(report, report.profile)
    assert stats["msle_after"] <= stats["msle_before"]
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(fitted, allow_nan=False))
    assert load_profile(report.target, path).data["calibration"]["gpu"] == gpu_device.name


def test_random_arguments_give_ids_and_positions_past_any_extent():
    """Integer inputs are ids and positions: drawn large and scattered (a decode attention then
    times its full cache, a gather reads scattered rows); tickets stay zero; booleans false."""
    from aicfc import tune
    from aicfc.ir.types import TensorType
    rng = np.random.default_rng(0)
    ids = tune.random_argument(TensorType("i64", (4096,)), rng)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < tune.RANDOM_INT_BOUND
    assert len(np.unique(ids)) > 4000
    tickets = tune.random_argument(TensorType("i32", (64,)), rng, zeroed=True)
    assert tickets.nbytes == 256 and not tickets.any()
    assert not tune.random_argument(TensorType("bool", (16,)), rng).any()
    x = tune.random_argument(TensorType("f16", (1024,)), rng)
    assert x.dtype == np.float16 and 0.5 < float(np.std(x.astype(np.float32))) < 1.5
