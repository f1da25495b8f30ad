"""Generation on the GPU (issue 19): the decoder of tests/fixtures/kvcache/llama_gen.onnx
(transformers' LlamaForCausalLM, random weights) compiled with a prefill plan and a decode plan
over one KV cache held as state, against transformers' own greedy tokens (fixture .npz).

- fp32: the 64 greedy tokens equal transformers' exactly, through `generate` on a two-plan
  bundle (prompt 20 = one 16-token prefill run and four single-token ones), on a decode-only
  bundle (the prompt token by token), and through `aicf-run generate`;
- fp16: the logits after the prompt match transformers' fp32 ones within 1e-2 of their max;
- the attention reads only the live cache: slots past the last live key tile hold NaN and the
  logits still equal the run on a clean cache.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from aicf_run.cli import main as run_main
from aicfc.artifact import write_bundle
from aicfc.driver import compile_plans
from tests.test_generate import CACHE, EXPECTED, MODEL, shapes

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(EXPECTED) as z:
        return {k: z[k] for k in z.files}


def load(path, device):
    from aicf_run.bundle import read_bundle
    from aicf_run.executor import Executor
    from aicf_run.plan_set import PlanSet
    bundle = read_bundle(path)
    return PlanSet(bundle, device) if len(bundle.plans) > 1 else Executor(bundle, device)


def bundle(tmp_path, precision: str, lengths: list[int], pin: dict | None = None):
    path = tmp_path / f"gen_{precision}_{'_'.join(map(str, lengths))}.aicf"
    write_bundle(compile_plans(onnx.load(str(MODEL)), [shapes(s) for s in lengths], precision=precision, pin=pin),
                 path)
    return path


@pytest.mark.parametrize("lengths", [[16, 1], [1]])
def test_greedy_tokens_equal_transformers_at_fp32(tmp_path, gpu_device, expected, lengths):
    model = load(bundle(tmp_path, "fp32", lengths), gpu_device)
    try:
        result = model.generate(expected["prompt"], 64)
        assert result.prefill_plans == ([16, 1, 1, 1, 1] if lengths == [16, 1] else [1] * 20)
        same = result.tokens[0] == expected["tokens"][0]
        assert same.all(), f"first difference at step {int(np.argmin(same))} of 64"
        again = model.generate(expected["prompt"], 64)   # the cache is reset: the same tokens
        assert (again.tokens == result.tokens).all()
    finally:
        model.close()


def test_first_step_logits_at_fp16(tmp_path, gpu_device, expected):
    model = load(bundle(tmp_path, "fp16", [16, 1]), gpu_device)
    try:
        model.reset_state()
        prompt = expected["prompt"]
        out = model.run({"input_ids": prompt[:, :16], "cache_position": np.arange(16)})
        for at in range(16, 20):
            out = model.run({"input_ids": prompt[:, at:at + 1], "cache_position": np.array([at])})
        logits, ref = out["logits"][0, -1], expected["first_logits"][0]
        assert np.isfinite(logits).all()
        err = np.abs(logits - ref).max() / np.abs(ref).max()
        assert err <= 1e-2, f"fp16 first-step logits: {err:.2e} of the max"
        tokens = model.generate(prompt, 64).tokens[0]
        agree = int(np.argmin(np.append(tokens == expected["tokens"][0], False)))
        print(f"fp16 greedy tokens equal transformers' fp32 ones for the first {agree} of 64 steps")
    finally:
        model.close()


@pytest.mark.parametrize("pin", [{"unit": "simt", "BN": 32, "TPR": 4}, {"unit": "mma", "BN": 32, "warps": 4},
                                 {"unit": "wgmma", "BN": 64, "NWG": 1, "OVERLAP": 1},
                                 {"unit": "split", "BN": 32, "warps": 4, "SPLITS": 4}],
                         ids=["simt", "mma", "wgmma", "split"])
def test_attention_skips_the_dead_cache(tmp_path, gpu_device, pin):
    """NaN in every slot past the live key tiles: a kernel that read them would give NaN."""
    path = bundle(tmp_path, "fp16", [1], pin)
    from aicf_run.bundle import read_bundle
    tiles = [k["params"]["BN"] for k in read_bundle(path).payload["kernels"] if k["family"] == "attention"]
    model = load(path, gpu_device)
    try:
        rng = np.random.default_rng(0)
        position = 9
        clean = {n: np.zeros((1, 1, 128, 64), np.float16) for n in CACHE}
        for v in clean.values():
            v[:, :, :position] = rng.standard_normal((1, 1, position, 64)).astype(np.float16)
        dead = max(-(-(position + 1) // bn) * bn for bn in tiles)
        assert dead < 128, f"key tiles {tiles} leave no dead slot to poison"
        poisoned = {n: v.copy() for n, v in clean.items()}
        for v in poisoned.values():
            v[:, :, dead:] = np.nan
        feeds = {"input_ids": np.array([[5]]), "cache_position": np.array([position])}
        model.set_state(clean)
        want = model.run(feeds)["logits"]
        model.set_state(poisoned)
        got = model.run(feeds)["logits"]
        assert np.isfinite(got).all() and np.array_equal(got, want)
    finally:
        model.close()


def test_cli_generate(tmp_path, gpu_device, expected):
    path = bundle(tmp_path, "fp32", [16, 1])
    prompt = tmp_path / "prompt.npy"
    np.save(prompt, expected["prompt"])
    out = tmp_path / "tokens.npy"
    result = CliRunner().invoke(run_main, ["generate", str(path), "--prompt", str(prompt), "--max-new-tokens", "64",
                                           "--output", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tokens"] == expected["tokens"].tolist() and (np.load(out) == expected["tokens"]).all()
    assert report["ttft_ms"] > 0 and report["tokens_per_s"] > 0
    stop = int(expected["tokens"][0, 5])
    text = CliRunner().invoke(run_main, ["generate", str(path), "--prompt", str(prompt), "--stop-token", str(stop),
                                         "--temperature", "0.7", "--top-k", "5", "--seed", "3"])
    assert text.exit_code == 0 and "time to first token" in text.output, text.output
