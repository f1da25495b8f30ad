"""On the GPU: the KV-cache decoder (tests/fixtures/kvcache/llama_kv.onnx) with its cache as
state, prefill then decode steps, every step's logits and cache against onnxruntime running the
same ONNX with the cache passed explicitly (the previous step's present_* fed back as past_*).

Two bundles (prefill: 8 tokens; decode: 1) until one bundle holds several plans: the prefill
executor's state is moved to the decode executor through the host (`state` / `set_state`).
Arenas are poisoned with NaN before every run, so a value no kernel wrote fails.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import aicfc
from benchmarks.light_models import onnxruntime_reference
from tests.test_pipeline import rel_err
from tests.test_state import CACHE, CACHE_SHAPE, FIXTURE, PRESENT, TOLERANCE, shapes

pytestmark = pytest.mark.gpu
PROMPT, STEPS = 8, 6


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(str(FIXTURE))


def load(payload: dict, device, graph: bool = True):
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    return Executor(Bundle.from_payload(payload), device, graph=graph)


def storage(precision: str) -> type:
    return np.float16 if precision == "fp16" else np.float32


def check_state(ex, ref: dict[str, np.ndarray], precision: str, what: str) -> None:
    state = ex.state
    for past, present in zip(CACHE, PRESENT):
        assert state[past].dtype == storage(precision) and state[past].shape == CACHE_SHAPE
        err = rel_err(state[past], ref[present])
        assert err <= TOLERANCE[precision], f"{what}: {past} rel err {err:.2e}"


@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_prefill_then_decode_matches_onnxruntime(model, precision, graph, gpu_device):
    prefill = load(aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=shapes(PROMPT)),
                   gpu_device, graph)
    decode = load(aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=shapes(1)),
                  gpu_device, graph)
    try:
        rng = np.random.default_rng(11)
        assert all(not v.any() for v in prefill.state.values())          # zeros at load
        ids = rng.integers(0, 64, (1, PROMPT)).astype(np.int64)
        pos = np.arange(PROMPT, dtype=np.int64)
        cache = {n: np.zeros(CACHE_SHAPE, np.float32) for n in CACHE}
        ref = onnxruntime_reference(model, {"input_ids": ids, "cache_position": pos, **cache})
        prefill.poison()
        got = prefill.run({"input_ids": ids, "cache_position": pos})
        assert list(got) == ["logits"]
        assert rel_err(got["logits"], ref["logits"]) <= TOLERANCE[precision]
        check_state(prefill, ref, precision, "prefill")
        decode.set_state(prefill.state)
        for step in range(STEPS):
            token = np.array([[int(np.argmax(ref["logits"][0, -1]))]], dtype=np.int64)
            at = np.array([PROMPT + step], dtype=np.int64)
            cache = {past: ref[present] for past, present in zip(CACHE, PRESENT)}
            ref = onnxruntime_reference(model, {"input_ids": token, "cache_position": at, **cache})
            decode.poison()
            got = decode.run({"input_ids": token, "cache_position": at})
            err = rel_err(got["logits"], ref["logits"])
            assert err <= TOLERANCE[precision], f"decode step {step}: logits rel err {err:.2e}"
            check_state(decode, ref, precision, f"decode step {step}")
        decode.reset_state()
        assert all(not v.any() for v in decode.state.values())
    finally:
        prefill.close()
        decode.close()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_decode_writes_only_its_row(model, precision, gpu_device):
    """A random (nonzero) cache set from the host: one decode step changes exactly row `at` of
    every cache tensor, bit for bit elsewhere, and its logits match onnxruntime on that cache."""
    decode = load(aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=shapes(1)), gpu_device)
    try:
        rng = np.random.default_rng(12)
        start = {n: rng.standard_normal(CACHE_SHAPE).astype(storage(precision)) for n in CACHE}
        decode.set_state(start)
        token, at = rng.integers(0, 64, (1, 1)).astype(np.int64), np.array([37], dtype=np.int64)
        ref = onnxruntime_reference(model, {"input_ids": token, "cache_position": at,
                                            **{n: v.astype(np.float32) for n, v in start.items()}})
        decode.poison()
        got = decode.run({"input_ids": token, "cache_position": at})
        assert rel_err(got["logits"], ref["logits"]) <= TOLERANCE[precision]
        after = decode.state
        for past, present in zip(CACHE, PRESENT):
            others = np.ones(64, bool)
            others[37] = False
            assert np.array_equal(after[past][:, :, others], start[past][:, :, others]), past
            assert rel_err(after[past][:, :, 37], ref[present][:, :, 37]) <= TOLERANCE[precision], past
    finally:
        decode.close()
