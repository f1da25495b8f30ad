"""[Note: weights shared by a bundle's plans] (aicfc/ir/shared_weights.py): what each plan of a bundle would
derive again from the same weight bytes (digests, conversions, interleaved and K-major copies) is derived once
inside `compile_plans`, and the bundle is the same as without it."""
from __future__ import annotations

import contextlib

import numpy as np
import onnx

from aicf_run.weights import FileSlice
from aicfc import driver
from aicfc.ir import shared_weights
from aicfc.ir.shared_weights import remember, shared
from tests.test_row_scale import decoder

SETS = [["input_ids=1x16", "cache_position=16"], ["input_ids=1x1", "cache_position=1"]]


def _counting():
    calls = []

    def compute():
        calls.append(1)
        return object()
    return calls, compute


def test_nothing_is_kept_outside_shared():
    calls, compute = _counting()
    src = FileSlice("/model.data", 0, 64)
    assert remember("k", src, compute) is not remember("k", src, compute)
    assert len(calls) == 2 and shared_weights._memo is None


def test_lazy_sources_by_value_bytes_by_identity():
    calls, compute = _counting()
    data = bytes(range(16))
    with shared():
        first = remember("k", FileSlice("/model.data", 0, 64), compute)
        assert remember("k", FileSlice("/model.data", 0, 64), compute) is first   # another slice object, same bytes
        assert remember("k", FileSlice("/model.data", 64, 64), compute) is not first
        assert remember("other", FileSlice("/model.data", 0, 64), compute) is not first
        mine = remember("k", data, compute)
        assert remember("k", data, compute) is mine
        assert remember("k", bytes(bytearray(data)), compute) is not mine   # equal bytes, another object
        with shared():   # nested: the outer scope's memory
            assert remember("k", data, compute) is mine
        assert len(calls) == 5
    assert shared_weights._memo is None
    remember("k", data, compute)
    assert len(calls) == 6


def test_a_bundle_is_the_same_with_and_without(tmp_path, monkeypatch):
    path = tmp_path / "dec.onnx"
    onnx.save(decoder(), str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="dec.data",
              size_threshold=1024)
    shared_payload = driver.compile_plans(str(path), SETS, precision="fp16")
    monkeypatch.setattr(driver, "shared", contextlib.nullcontext)
    plain = driver.compile_plans(str(path), SETS, precision="fp16")
    assert [w["sha256"] for w in shared_payload["weights"]] == [w["sha256"] for w in plain["weights"]]
    for a, b in zip(shared_payload["weights"], plain["weights"]):
        got = a["data"] if isinstance(a["data"], (bytes, bytearray)) else a["data"].read()
        want = b["data"] if isinstance(b["data"], (bytes, bytearray)) else b["data"].read()
        assert np.array_equal(np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8))
    assert [p["kernels"] for p in shared_payload["plans"]] == [p["kernels"] for p in plain["plans"]]
