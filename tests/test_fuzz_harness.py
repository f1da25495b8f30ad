"""The fuzz harness itself (tests/fuzz_harness.py, tests/fuzz_mutate.py): the long run's loop
counts and records what it should, its shortcuts (the planner memo) change no result, and its
mutations are reproducible from their seed."""
from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest

from tests import fuzz_harness as F
from tests.fuzz_mutate import RandomChoices, mutated_bytes, mutated_model, mutated_tree, random_value


@pytest.fixture(scope="module")
def models() -> dict:
    return F.seed_models()


def test_long_run_counts_executions(tmp_path: Path) -> None:
    report = F.long_run("onnx_tree", 120, tmp_path, execs=40, seed=3)
    assert report["executions"] == 40 and report["failures"] == {}
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_long_run_records_each_failure_class_once(tmp_path: Path, monkeypatch) -> None:
    # A check that fails in two ways: two classes, counted, one reproducer (+ traceback) each.
    def check(raw: bytes, folder: Path) -> None:
        if len(raw) % 2:
            raise ValueError("odd")
        raise KeyError("even")
    lengths = iter(range(1000))
    target = F.Target("fake", lambda: lambda c: b"x" * next(lengths), check)
    monkeypatch.setattr(F, "targets", lambda: {"fake": target})
    report = F.long_run("fake", 120, tmp_path, execs=10)
    assert report["executions"] == 10
    assert sorted(report["failures"].values()) == [5, 5]
    assert {k.split()[0] for k in report["failures"]} == {"ValueError", "KeyError"}
    assert len(list(tmp_path.glob("*.bin"))) == 2 and len(list(tmp_path.glob("*.txt"))) == 2
    assert "execution " in next(tmp_path.glob("*.txt")).read_text()


def test_mutations_are_reproducible_from_their_seed(models: dict) -> None:
    # A reproducer names its execution: the same Random seed must give the same file.
    tree = {"a": [1, 2, {"b": b"x"}], "c": "d"}
    model = models["attention"]
    for i in range(20):
        def make(seed: str) -> tuple:
            c = RandomChoices(random.Random(seed))
            return (mutated_bytes(c, b"0123456789" * 8), msgpack.packb(mutated_tree(c, tree)),
                    mutated_model(c, model).SerializeToString())
        assert make(f"0:{i}") == make(f"0:{i}")
    outs = {mutated_bytes(RandomChoices(random.Random(i)), b"0123456789" * 8) for i in range(50)}
    assert len(outs) > 40


def test_tree_mutations_stay_packable() -> None:
    # msgpack holds ints in [-2**63, 2**64): a mutant outside it is no file a user can have.
    tree = {"n": 2**63 - 1, "m": -(2**63), "l": [2**64 - 1]}
    for i in range(2000):
        c = RandomChoices(random.Random(i))
        msgpack.packb(mutated_tree(c, tree), use_bin_type=True)
        msgpack.packb(random_value(c), use_bin_type=True)


def test_planner_memo_changes_no_plan(models: dict) -> None:
    # The memo answers a scheduling problem seen before with its earlier answer: every seed's
    # plan (and its precision variants) prints the same with and without it, and it is
    # restored afterwards.
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes import plan_schedules
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile

    real = plan_schedules.rank
    hw = load_profile("sm_90", None)
    for precision in ["fp32", "fp16"]:
        for name, model in models.items():
            graph = import_model(model, {})
            plain = str(run_pipeline(graph, Options("sm_90", hw, precision)).plan)
            for _ in range(2):   # the first fills the memo, the second reads it
                with F.planner_memo():
                    memo = str(run_pipeline(graph, Options("sm_90", hw, precision)).plan)
                assert memo == plain, (name, precision)
    assert plan_schedules.rank is real and F._RANKED


def test_tree_mutants_stay_small() -> None:
    # A grown list holds one shared object many times; an edit inside it after the grow would
    # multiply the tree (seed 1's execution 72290 packed to over 6 GB before grow became last).
    tree = {"kernels": [{"a": [[1, 2, 3]] * 3, "b": "x" * 100}] * 3}
    for i in range(3000):
        packed = msgpack.packb(mutated_tree(RandomChoices(random.Random(i)), tree), use_bin_type=True)
        assert len(packed) < 3 << 20, i
