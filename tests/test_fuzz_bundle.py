"""Fuzzed bundles (tests/fuzz_harness.py): a short derandomized run of each bundle target, and
one regression test per failure class the fuzzers found, through the CLIs (exit 2, one line).

`make fuzz` runs the same targets for minutes each."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import fuzz_harness as F
from tests.test_bundle_format import make_payload
from tests.test_cli import aicfc, assert_user_error


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    return F.seed_bundles(tmp_path_factory.mktemp("seeds"))


def test_fuzz_bundle_bytes(seeds: dict[str, bytes], tmp_path: Path) -> None:
    F.hypothesis_run(F.bundle_bytes_mutator(seeds), F.check_bundle_bytes, 300, tmp_path)


def test_fuzz_bundle_tree(seeds: dict[str, bytes], tmp_path: Path) -> None:
    F.hypothesis_run(F.bundle_tree_mutator(seeds), F.check_bundle_bytes, 150, tmp_path)


def test_seeds_are_valid(seeds: dict[str, bytes], tmp_path: Path) -> None:
    # The targets mutate valid bundles: each seed reads and explains cleanly.
    from aicf_run.bundle import read_bundle
    from aicfc.explain import explain_json
    for name, raw in seeds.items():
        path = tmp_path / f"{name}.aicf"
        path.write_bytes(raw)
        assert explain_json(read_bundle(path).payload)["kernels"]


def test_guard_catches_unbounded_memory_and_hangs() -> None:
    # The harness's own limits: an allocation past the limit and an endless loop both fail.
    with pytest.raises(MemoryError):
        with F.guard(memory=1 << 30):
            bytearray(4 << 30)
    with pytest.raises(F.Hang):
        with F.guard(seconds=0.2):
            while True:
                pass


# --- regressions: what the fuzzers found, each exit 2 with one line ---


def _explain(tmp_path: Path, mutate: Any, *flags: str) -> Any:
    payload = make_payload()
    mutate(payload)
    path = tmp_path / "m.aicf"
    path.write_bytes(F.pack_bundle(payload))
    return aicfc("explain", str(path), *flags)


def test_explain_refuses_stores_not_a_list(tmp_path: Path) -> None:
    # Was: TypeError "can only join an iterable" in explain_text.
    out = _explain(tmp_path, lambda p: p["kernels"][0].update(stores=7))
    assert_user_error(out, "kernels[0].stores", "a list of str")


def test_explain_refuses_predicted_without_time(tmp_path: Path) -> None:
    # Was: KeyError 'time_us'.
    out = _explain(tmp_path, lambda p: p["kernels"][0]["predicted"].pop("time_us"), "--json")
    assert_user_error(out, "kernels[0].predicted.time_us")


def test_explain_refuses_non_numeric_cost(tmp_path: Path) -> None:
    # Was: TypeError formatting a str with :.2f.
    out = _explain(tmp_path, lambda p: p["kernels"][0]["predicted"].update(flops="many"))
    assert_user_error(out, "kernels[0].predicted", "numbers")


def test_explain_refuses_bad_candidate(tmp_path: Path) -> None:
    out = _explain(tmp_path, lambda p: p["kernels"][0]["candidates"][0].update(predicted_time_us=b"1"))
    assert_user_error(out, "kernels[0].candidates[0].predicted_time_us")


def test_explain_rewrite_without_bytes_saved(tmp_path: Path) -> None:
    # Was: KeyError 'bytes_saved'; the field is optional in the free-form decision log.
    def add(p: dict) -> None:
        p["decisions"].append({"kind": "rewrite", "rule": "r", "target": "t", "applied": True,
                               "reason": "why"})
    out = _explain(tmp_path, add)
    assert out.returncode == 0, out.stderr
    assert "applied  'r' on t: why" in out.stdout


def test_explain_json_leaves_out_foreign_keys(tmp_path: Path) -> None:
    # Was: TypeError "bytes is not JSON serializable" for an extra key holding bytes.
    def add(p: dict) -> None:
        p["model"]["extra"] = b"\x00"
        p["memory"]["inplace"].append({"kernel": "k", "output": "y", "reuses": "x", "reason": "r",
                                       "blob": b"\x01"})
        p["kernels"][0]["candidates"][0]["blob"] = b"\x02"
    out = _explain(tmp_path, add, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["model"] == {"name": "add", "source_sha256": make_payload()["model"]["source_sha256"]}
    assert report["memory"]["inplace"] == [{"kernel": "k", "output": "y", "reuses": "x", "reason": "r"}]
    assert report["kernels"][0]["candidates"][0] == {"params": {"vec": 1}, "predicted_time_us": 1.5}
