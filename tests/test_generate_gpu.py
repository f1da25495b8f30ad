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
    # [Note: text prompts]: the prompt as text through a word-level tokenizer (no BOS; a word an id) gives the same
    # greedy tokens, printed back as words
    pytest.importorskip("tokenizers")
    from aicf_run.text import decode_rows, load_tokenizer
    from tests.test_text import word_tokenizer
    tok_path = str(word_tokenizer(tmp_path / "tokenizer.json", vocab=256, bos=False))
    tok = load_tokenizer(tok_path)
    words = " ".join(tok.id_to_token(int(t)) for t in expected["prompt"][0])
    result = CliRunner().invoke(run_main, ["generate", str(path), "--text", words, "--tokenizer", tok_path,
                                           "--max-new-tokens", "64", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tokens"] == expected["tokens"].tolist()
    assert report["text"] == decode_rows(tok, expected["tokens"], []) and report["text"][0].count(" ") >= 32


# ---------------------------------------------------------------- greedy on the device ([Note: greedy feed])


def _counting_choose(monkeypatch) -> list[int]:
    """Count the host's choices: the device path makes one (the first token), the host path one a step."""
    import aicf_run.generate as gen
    calls, choose = [], gen.choose

    def counted(*args, **kwargs):
        calls.append(1)
        return choose(*args, **kwargs)
    monkeypatch.setattr(gen, "choose", counted)
    return calls


def _feed_run(gpu_device, x, control, batch, ids, launch):
    """`launch(logits, log, control, ids, position)` on device copies of the logits `x` and the control words; the
    log (64 x batch), the control words, the ids and the position as the kernels left them."""
    cuda = gpu_device.driver
    allocations = [cuda.mem_alloc(n) for n in (x.nbytes, 64 * batch * 8, control.nbytes, batch * 8, 8)]
    try:
        cuda.memcpy_htod(allocations[0], np.ascontiguousarray(x).view(np.uint8))
        cuda.memcpy_htod(allocations[2], control)
        launch(*allocations)
        gpu_device.context.synchronize()
        out = (np.empty((64, batch), np.int64), np.empty_like(control), np.empty(batch, np.dtype(ids)),
               np.empty(1, np.int64))
        for host, device in zip(out, allocations[1:]):
            cuda.memcpy_dtoh(host, device)
    finally:
        for a in allocations:
            a.free()
    return out


@pytest.mark.parametrize("logits,ids,batch,rows,vocab", [("float16", "int64", 5, 1, 32000),
                                                          ("bfloat16", "int32", 5, 3, 1000),
                                                          ("float32", "int64", 5, 1, 131)])
def test_feed_kernels_are_numpys_argmax(gpu_device, logits, ids, batch, rows, vocab):
    """The argmax and advance kernels alone, on crafted rows: ties, -inf, NaN, the last index,
    a row already done, a stop token; against numpy's argmax of the float32 widening."""
    from aicfc.codegen.greedy_feed import CONTROL_HEAD, control_words, plan_feed, render_feed
    from aicfc.codegen.nvcc import build
    from tests.test_generate_feed import fake_payload
    values = plan_feed(fake_payload(batch, rows, vocab, logits, ids))
    cuda = gpu_device.driver
    module = cuda.module_from_buffer(build(render_feed(values), gpu_device.arch).cubin)
    argmax, advance = module.get_function(values["argmax"]), module.get_function(values["advance"])
    rng = np.random.default_rng(vocab)
    x = rng.standard_normal((batch, rows, vocab)).astype(np.float32)
    last = x[:, -1]
    last[0, [7, vocab // 2]] = 50.0                    # a tie: the first index
    last[1] = -np.inf                                  # all -inf: index 0
    last[2, [5, vocab - 3]] = np.nan                   # NaN above everything, the first NaN
    last[2, 9] = np.inf
    last[3, vocab - 1] = 60.0                          # the last index
    last[4, 0] = last[4, vocab - 1] = 70.0             # first and last equal
    if logits == "bfloat16":   # the top 16 bits of float32 (truncated), widened back exactly
        x = (x.view(np.uint32) >> 16).astype(np.uint16)
        wide = (x.astype(np.uint32) << 16).view(np.float32)
    else:
        x = x.astype(np.float16 if logits == "float16" else np.float32)
        wide = x.astype(np.float32)
    want = wide[:, -1].argmax(-1)
    assert want[0] == 7 and want[1] == 0 and want[2] == 5 and want[3] == vocab - 1 and want[4] == 0
    head = len(CONTROL_HEAD)
    control = np.zeros(control_words(batch), np.int64)
    control[1], control[3] = 41, 1                     # position, one stop token
    control[head + 3] = 0
    control[head + 4] = 1                              # row 4 is done: it repeats its last token
    control[head + batch + 4] = 123
    control[head + 2 * batch] = vocab - 1              # row 3 meets the stop token
    def launch(d_logits, d_log, d_control, d_ids, d_pos):
        argmax(d_logits, d_log, d_control, d_ids, d_pos, grid=(batch, 1), block=(values["threads"], 1, 1))
        advance(d_ids, d_pos, d_control, grid=(1, 1), block=(32, 1, 1))
    log, control, got_ids, pos = _feed_run(gpu_device, x, control, batch, ids, launch)
    expect = want.copy()
    expect[4] = 123
    assert log[0].tolist() == expect.tolist() and got_ids.tolist() == expect.tolist()
    assert control[0] == 1 and control[1] == 42 and control[2] == 1       # step, position, NaN at step 0
    assert control[head:head + batch].tolist() == [0, 0, 0, 1, 1]         # row 3 stopped, row 4 stays done
    assert pos[0] == 42


@pytest.mark.parametrize("logits,ids", [("float16", "int64"), ("float32", "int32")])
def test_one_row_argmax_advances_itself(gpu_device, logits, ids):
    """[Note: the advance in the argmax]: at B = 1 the argmax alone writes the token into input_ids, the next
    position into cache_position and both control words; no advance kernel is in the record."""
    from aicfc.codegen.greedy_feed import CONTROL_HEAD, control_words, plan_feed, render_feed
    from aicfc.codegen.nvcc import build
    from tests.test_generate_feed import fake_payload
    vocab = 32000
    values = plan_feed(fake_payload(1, 1, vocab, logits, ids))
    cuda = gpu_device.driver
    argmax = cuda.module_from_buffer(build(render_feed(values), gpu_device.arch).cubin).get_function(values["argmax"])
    x = np.random.default_rng(3).standard_normal((1, 1, vocab)).astype(np.float16 if logits == "float16" else np.float32)
    want = int(x[0, -1].astype(np.float32).argmax())
    head = len(CONTROL_HEAD)
    control = np.zeros(control_words(1), np.int64)
    control[0], control[1] = 3, 41                     # step 3, position 41
    log, control, got_ids, pos = _feed_run(gpu_device, x, control, 1, ids, lambda *args: argmax(
        *args, grid=(1, 1), block=(values["threads"], 1, 1)))
    assert log[3, 0] == want and got_ids[0] == want and control[head + 1] == want
    assert control[0] == 4 and control[1] == 42 and pos[0] == 42


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_device_greedy_equals_the_host_path(tmp_path, gpu_device, expected, precision, monkeypatch):
    model = load(bundle(tmp_path, precision, [16, 1]), gpu_device)
    try:
        calls = _counting_choose(monkeypatch)
        device = model.generate(expected["prompt"], 64)
        assert len(calls) == 1, "the device path chooses only the first token on the host"
        host = model.generate(expected["prompt"], 64, device_greedy=False)
        assert len(calls) == 1 + 64
        assert device.tokens.tolist() == host.tokens.tolist()
        if precision == "fp32":
            assert (device.tokens == expected["tokens"]).all()
        assert device.ttft_s > 0 and device.decode_s > 0 and device.tokens_per_s > 0
        # a stop token met mid-chunk (step 5 of chunks of 8) and one met in the first token
        for stop in (int(host.tokens[0, 5]), int(host.tokens[0, 0])):
            want = model.generate(expected["prompt"], 64, stop_tokens=[stop], device_greedy=False)
            got = model.generate(expected["prompt"], 64, stop_tokens=[stop])
            assert got.tokens.tolist() == want.tokens.tolist() and got.stopped == want.stopped == [True]
    finally:
        model.close()


@pytest.mark.parametrize("graph", [True, False])
def test_device_greedy_at_batch_2_with_stops(tmp_path, gpu_device, graph):
    """A random decoder at batch 2 (tests/test_generate_feed.py's): the rows stop at different
    steps, one mid-chunk; equal tokens on both paths, with and without CUDA graphs."""
    from aicf_run.bundle import read_bundle
    from aicf_run.plan_set import PlanSet
    from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
    from tests.test_generate import shapes
    cfg = DecoderConfig(64, 1, 1, 1, 64, 40, 48)
    rng = np.random.default_rng(3)
    built = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch="batch")
    sets = [shapes(s, 2) | {n: cfg.cache_shape(2) for n, _ in cache_names(cfg)} for s in (4, 1)]
    path = tmp_path / "small.aicf"
    write_bundle(compile_plans(built, sets, precision="fp16"), path)
    model = PlanSet(read_bundle(path), gpu_device, graph=graph)
    try:
        prompt = np.random.default_rng(5).integers(0, 40, (2, 6))
        free = model.generate(prompt, 40, device_greedy=False).tokens
        assert (model.generate(prompt, 40).tokens == free).all()
        stops = [int(free[0, 3]), int(free[1, 12])]
        want = model.generate(prompt, 40, stop_tokens=stops, device_greedy=False)
        got = model.generate(prompt, 40, stop_tokens=stops)
        assert got.tokens.tolist() == want.tokens.tolist() and got.stopped == want.stopped
    finally:
        model.close()
