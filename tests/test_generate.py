"""Generation (issue 19, items 3-4) without a GPU: the live-keys bound of the attention ([Note:
live keys] in aicfc/ir/properties.py), the decoder's plans sharing one cache, the generation
loop ([Note: generation] in aicf_run/generate.py) over a fake model, and `aicf-run generate`'s
refusals (exit 2, one line, before the GPU is touched).

The decoder is tests/fixtures/kvcache/llama_gen.onnx (make_generate.py: transformers'
LlamaForCausalLM, random weights, exported with its cache explicit) and its expected greedy
tokens from transformers; benchmarks/decoder_graph.py builds the same graph with onnx.helper.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import aicfc
from aicf_run.bundle import read_bundle
from aicf_run.cli import main as run_main
from aicf_run.errors import RunError
from aicf_run.generate import Sampling, choose, decoder_interface, generate, prefill_lengths
from aicf_run.plan_set import PlanSet, same_state
from aicfc.artifact import write_bundle
from aicfc.driver import compile_plans
from aicfc.passes.fold_cache_writes import FOLD_RULE
from aicfc.passes.streaming_attention import LIVE_RULE
from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
from benchmarks.light_models import onnxruntime_reference
from tests.test_pipeline import evaluate_ir, rel_err
from tests.test_state import SPLIT, plan_of

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kvcache"
MODEL, EXPECTED = FIXTURES / "llama_gen.onnx", FIXTURES / "llama_gen_expected.npz"
CACHE = [n for n, _ in cache_names(DecoderConfig(128, 2, 2, 1, 256, 256, 128))]
CACHE_SHAPE = (1, 1, 128, 64)


def shapes(seq: int, batch: int = 1) -> dict[str, tuple[int, ...]]:
    return {"input_ids": (batch, seq), "cache_position": (seq,)}


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return onnx.load(str(MODEL))


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(EXPECTED) as z:
        return {k: z[k] for k in z.files}


# ---------------------------------------------------------------- the fixture and the built graph


def test_fixture_greedy_tokens_are_transformers_through_onnxruntime(model, expected):
    """The export reproduces transformers: onnxruntime's greedy continuation is its 64 tokens."""
    prompt = expected["prompt"]
    cache = {n: np.zeros(CACHE_SHAPE, np.float32) for n in CACHE}
    ref = onnxruntime_reference(model, {"input_ids": prompt, "cache_position": np.arange(prompt.shape[1]), **cache})
    assert np.abs(ref["logits"][0, -1] - expected["first_logits"][0]).max() <= 1e-4 * np.abs(expected["first_logits"]).max()
    tokens, at = [], prompt.shape[1]
    for _ in range(12):   # 12 of the 64 steps: onnxruntime on the CPU, a few ms each
        tokens.append(int(ref["logits"][0, -1].argmax()))
        cache = {past: ref[past.replace("past", "present")] for past in CACHE}
        ref = onnxruntime_reference(model, {"input_ids": np.array([[tokens[-1]]]), "cache_position": np.array([at]),
                                            **cache})
        at += 1
    assert tokens == list(expected["tokens"][0, :12])


def test_built_graph_matches_its_own_reference_shapes():
    """benchmarks/decoder_graph.py at the fixture's size: onnx's checker, and the interface
    generation needs (the builder's parity with the torch export is checked where torch is)."""
    cfg = DecoderConfig(128, 2, 2, 1, 256, 256, 128)
    rng = np.random.default_rng(0)
    m = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch=2)
    onnx.checker.check_model(m)
    assert cfg.parameters == sum(int(np.prod(s)) for s in weight_shapes(cfg).values()) == 361088
    assert [i.name for i in m.graph.input] == ["input_ids", "cache_position"] + CACHE
    assert [o.name for o in m.graph.output] == ["logits"] + [n.replace("past", "present") for n in CACHE]


def test_built_graph_equals_the_torch_export(model):
    """Both graphs over the same transformers weights agree through onnxruntime (needs torch and
    transformers, as the fixture maker does)."""
    pytest.importorskip("transformers")
    from tests.fixtures.make_generate import hf_model
    sd = {k: v.detach().numpy() for k, v in hf_model().state_dict().items()}
    built = decoder_model(DecoderConfig(128, 2, 2, 1, 256, 256, 128), lambda n: sd[n])
    rng = np.random.default_rng(3)
    for seq, start in ((5, 0), (1, 9)):
        feeds = {"input_ids": rng.integers(0, 256, (1, seq)), "cache_position": np.arange(start, start + seq),
                 **{n: rng.standard_normal(CACHE_SHAPE).astype(np.float32) for n in CACHE}}
        a, b = onnxruntime_reference(built, feeds), onnxruntime_reference(model, feeds)
        assert all(np.abs(a[k] - b[k]).max() <= 1e-4 for k in b)


# ---------------------------------------------------------------- live keys


@pytest.mark.parametrize("seq", [16, 1])
def test_attention_reads_only_live_keys(model, seq):
    """The cache mask is restated in the attention kernel, whose key loop stops after the
    block's largest position; the stored mask kernel is gone."""
    plan = plan_of(model, shapes(seq), "fp16", SPLIT if seq == 1 else None)
    att = [k for k in plan.kernels if k.family == "attention"]
    assert len(att) == 2 and all(LIVE_RULE in k.rewrites for k in att)
    assert all(any(ld == "cache_position" for op in k.ops for ld in _reads(op)) for k in att)
    assert not any("node_le_1" in op.origin or "node_lessorequal" in " ".join(op.origin)
                   for k in plan.kernels if k.family != "attention" for op in k.ops)
    # 9 a layer (4 of them rotary tables and the cache writes), 5 shared, less the tables' 3 (their cos and sin
    # recomputed in the rotary epilogues: [Note: a table recomputed where it is read]); a decode step's split-KV
    # attention writes the cache rows itself (passes/fold_cache_writes.py): 7 a layer; and the norms
    # before a gemv (4 of the 5: not the first, after the embedding's gather; the last one's row, the last
    # residual sum, stays stored: [Note: the last residual row stored]) scale the gemv's sums
    # (passes/fold_row_scale.py)
    assert len(plan.kernels) == (20 if seq > 1 else 12)
    payload = aicfc.compile(model, precision="fp16", shapes=shapes(seq), pin=SPLIT if seq == 1 else None)
    sources = "".join(m["source"] for m in payload["modules"])
    # tiles / split-KV chunks (a chunk past the live length returns, or, in a cluster, reads nothing)
    bound = "n_tiles = min(n_tiles" if seq > 1 else "const int n_live = (live + "
    assert "[Note: live keys]" in sources and bound in sources


def test_decode_folds_the_cache_writes_into_the_attention(model):
    """Decode: no scatter kernel; each split-KV attention writes its layer's K and V rows, and the
    state names it as their writer. Prefill (16 rows a head: tile units) keeps the scatters."""
    plan = plan_of(model, shapes(1), "fp16", SPLIT)
    att = [k for k in plan.kernels if k.family == "attention"]
    assert not [k for k in plan.kernels if k.family == "scatter"]
    assert all(k.schedule.param["unit"] == "split" and FOLD_RULE in k.rewrites for k in att)
    assert {st.kernel for st in plan.state} == {k.name for k in att} and len(plan.state) == 4
    assert [r for r in plan.rewrites if r.rule == FOLD_RULE and r.applied].__len__() == 4
    prefill = plan_of(model, shapes(16), "fp16")
    assert len([k for k in prefill.kernels if k.family == "scatter"]) == 4
    assert all(not r.applied and "not a split-KV attention" in r.reason for r in prefill.rewrites if r.rule == FOLD_RULE)


def _reads(op) -> list[str]:
    from aicfc.ir.lowered import loads
    return [ld.buffer for ld in loads(op.body)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("start,seq", [(0, 16), (20, 1), (127, 1)])
def test_decoder_plan_matches_onnxruntime(model, precision, start, seq):
    rng = np.random.default_rng(start + seq)
    feeds = {"input_ids": rng.integers(0, 256, (1, seq)), "cache_position": np.arange(start, start + seq),
             **{n: rng.standard_normal(CACHE_SHAPE).astype(np.float32) for n in CACHE}}
    ref = onnxruntime_reference(model, feeds)
    got = evaluate_ir(plan_of(model, shapes(seq), precision), feeds)
    for name in ref:
        assert rel_err(got[name], ref[name]) <= {"fp32": 1e-4, "fp16": 1e-2}[precision], name


def test_a_slot_table_that_is_not_the_key_index_is_not_bounded():
    """slot[j] = 2j: the mask still hides keys, but not "every key past P", so no bound."""
    cfg = DecoderConfig(64, 1, 1, 1, 64, 32, 64)
    rng = np.random.default_rng(1)
    m = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng))
    for init in m.graph.initializer:
        arr = onnx.numpy_helper.to_array(init)
        if arr.shape == (1, cfg.slots) and np.array_equal(arr[0], np.arange(cfg.slots)):
            init.CopyFrom(onnx.numpy_helper.from_array((2 * arr).astype(np.float32), init.name))
    plan = plan_of(m, shapes(1))
    att = [k for k in plan.kernels if k.family == "attention"]
    assert att and not any(LIVE_RULE in k.rewrites for k in att)
    feeds = {"input_ids": np.array([[3]]), "cache_position": np.array([9]),
             **{f"past_{kv}_0": rng.standard_normal((1, 1, 64, 64)).astype(np.float32) for kv in "kv"}}
    ref = onnxruntime_reference(m, feeds)
    assert rel_err(evaluate_ir(plan, feeds)["logits"], ref["logits"]) <= 1e-4


# ---------------------------------------------------------------- the plans share one cache


@pytest.fixture(scope="module")
def decoder_bundle(tmp_path_factory, model) -> Path:
    path = tmp_path_factory.mktemp("gen") / "llama_gen.aicf"
    write_bundle(compile_plans(model, [shapes(16), shapes(1)], precision="fp16"), path)
    return path


def test_plans_share_the_cache(decoder_bundle):
    bundle = read_bundle(decoder_bundle)
    assert len(bundle.plans) == 2 and same_state(list(bundle.plans))
    interface = decoder_interface(bundle.plans)
    assert interface.batch == 1 and interface.lengths == (16, 1) and interface.ids_dtype == "int64"


def test_the_plan_lookup_leaves_out_a_given_state(decoder_bundle):
    """[Note: state]: a cache given by its input name (aicf-run --input past=..., run({...})) is written
    before the run and is no part of the shapes that choose the plan."""
    from aicf_run.inputs import plan_for, random_inputs
    bundle = read_bundle(decoder_bundle)
    assert bundle.state_names and bundle.state_names == {item["name"] for item in bundle.plans[1].payload["state"]}
    decode = bundle.plans[1]
    inputs = random_inputs(decode)
    cache = {item["name"]: np.zeros(item["shape"], np.float32) for item in decode.payload["state"]}
    assert plan_for(inputs | cache, bundle) is decode


def test_plans_of_other_batches_do_not_share(tmp_path):
    cfg = DecoderConfig(64, 1, 1, 1, 64, 32, 16)
    rng = np.random.default_rng(2)
    built = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch="batch")
    path = tmp_path / "two_batches.aicf"
    sets = [shapes(1, b) | {n: cfg.cache_shape(b) for n, _ in cache_names(cfg)} for b in (1, 2)]
    write_bundle(compile_plans(built, sets, precision="fp16"), path)
    bundle = read_bundle(path)
    assert not same_state(list(bundle.plans))
    with pytest.raises(RunError, match="do not share one KV cache"):
        decoder_interface(bundle.plans)


# ---------------------------------------------------------------- the loop, on a fake model


class FakeDecoder(PlanSet):
    """Plans of lengths `lengths` over one "cache": the token at position p is
    (sum of the cached ids + p) % V, argmax of a one-hot logit row."""

    def __init__(self, lengths: tuple[int, ...], vocab: int = 11, batch: int = 1, logits_rows: str = "last"):
        self.vocab, self.batch, self.rows = vocab, batch, logits_rows
        self.cache = np.zeros((batch, 64), np.int64)
        self.calls: list[tuple[int, list[int]]] = []
        self.bundle = _FakeBundle(lengths, vocab, batch)

    def plan(self, index):
        fake = self

        class Runner:
            def run(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
                ids, pos = inputs["input_ids"], inputs["cache_position"]
                assert ids.dtype == np.int64 and pos.dtype == np.int64
                fake.calls.append((ids.shape[1], pos.tolist()))
                fake.cache[:, pos] = ids
                nxt = (fake.cache.sum(axis=1, keepdims=True) + pos[None, :]) % fake.vocab
                logits = np.eye(fake.vocab, dtype=np.float32)[nxt]
                return {"logits": logits[:, -1:] if fake.rows == "last" else logits}
        return Runner()

    def reset_state(self) -> None:
        self.cache[:] = 0


class _FakeBundle:
    def __init__(self, lengths, vocab, batch):
        self.plans = [_FakePlan(s, vocab, batch) for s in lengths]


class _FakePlan:
    def __init__(self, s, vocab, batch):
        self.payload = {"state": [{"name": "c", "output": "c_next", "dtype": "int64", "shape": [batch, 64], "buffer": 0}]}
        self.memory = {"state_bytes": 64}
        self.buffers = [{"offset": 0}]
        self.inputs = [{"name": "input_ids", "shape": [batch, s], "dtype": "int64"},
                       {"name": "cache_position", "shape": [s], "dtype": "int64"}]
        self.outputs = [{"name": "logits", "shape": [batch, 1, vocab], "dtype": "float32"}]


def _reference(prompt: np.ndarray, steps: int, vocab: int) -> np.ndarray:
    cache = np.zeros((prompt.shape[0], 64), np.int64)
    out, at = [], 0
    for t in prompt.T:
        cache[:, at] = t
        nxt = (cache.sum(axis=1) + at) % vocab
        at += 1
    for _ in range(steps):
        out.append(nxt)
        cache[:, at] = nxt
        nxt = (cache.sum(axis=1) + at) % vocab
        at += 1
    return np.stack(out, axis=1)


def test_prefill_lengths_cover_any_prompt():
    assert prefill_lengths(20, (16, 1)) == [16, 1, 1, 1, 1]
    assert prefill_lengths(512, (512, 1)) == [512]
    assert prefill_lengths(3, (1,)) == [1, 1, 1]
    assert prefill_lengths(37, (1, 8, 32)) == [32, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("lengths", [(16, 1), (1,), (4, 8, 1)])
@pytest.mark.parametrize("rows", ["last", "all"])
def test_generate_feeds_every_position_once(lengths, rows):
    fake = FakeDecoder(lengths, logits_rows=rows, batch=2)
    prompt = np.random.default_rng(0).integers(0, 11, (2, 21))
    result = generate(fake, prompt, 9)
    assert result.tokens.tolist() == _reference(prompt, 9, 11).tolist()
    positions = [p for _, ps in fake.calls for p in ps]
    assert positions == list(range(21 + 8))   # the last token is chosen, not fed
    assert result.prefill_plans == prefill_lengths(21, lengths) and result.new_tokens == 9


def test_generate_stops_rows_at_stop_tokens():
    fake = FakeDecoder((1,), batch=2)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    free = _reference(prompt, 12, 11)
    stop = int(free[0, 3])
    result = generate(fake, prompt, 12, stop_tokens=[stop])
    row0 = list(free[0, :4]) + [stop] * (result.new_tokens - 4)
    assert list(result.tokens[0]) == row0 and result.stopped[0]
    if not result.stopped[1]:
        assert result.new_tokens == 12


def test_sampling_is_seeded_and_bounded():
    logits = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    greedy = choose(logits, Sampling(), np.random.default_rng(0))
    assert greedy.tolist() == logits.argmax(-1).tolist()
    assert choose(logits, Sampling(1.0, top_k=1), np.random.default_rng(5)).tolist() == greedy.tolist()
    assert choose(logits, Sampling(1.0, top_p=1e-6), np.random.default_rng(5)).tolist() == greedy.tolist()
    a = choose(logits, Sampling(0.8, top_k=10, seed=1), np.random.default_rng(1))
    b = choose(logits, Sampling(0.8, top_k=10, seed=1), np.random.default_rng(1))
    assert a.tolist() == b.tolist()
    top10 = np.argsort(-logits, axis=-1)[:, :10]
    for _ in range(20):
        c = choose(logits, Sampling(2.0, top_k=10), np.random.default_rng(_))
        assert all(t in row for t, row in zip(c, top10))
    with pytest.raises(RunError, match="NaN"):
        choose(np.full((1, 4), np.nan, np.float32), Sampling(), np.random.default_rng(0))
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(RunError):
            Sampling(**bad)


def test_generate_refuses_a_bad_prompt():
    fake = FakeDecoder((1,), batch=2)
    for prompt, what in ((np.zeros((1, 3), np.int64), "compiled for batch 2"), (np.zeros((2, 0), np.int64), "P >= 1"),
                         (np.zeros((2, 3), np.float32), "integer token ids")):
        with pytest.raises(RunError, match=what):
            generate(fake, prompt, 4)


# ---------------------------------------------------------------- aicf-run generate: refusals


def _cli(args: list[str]):
    result = CliRunner().invoke(run_main, args)
    return result.exit_code, result.output


def test_cli_refuses_a_bundle_that_is_no_decoder(tmp_path):
    from tests.test_bundle_format import make_payload
    path = tmp_path / "add.aicf"
    write_bundle(make_payload(), path)
    code, out = _cli(["generate", str(path), "--prompt", "1,2"])
    assert code == 2 and out.count("\n") == 1 and "no state (KV cache)" in out


@pytest.mark.parametrize("args,message", [
    ([], "--prompt IDS|FILE.npy, --prompt-length P or --text TEXT"),
    (["--prompt", "1,x"], "not comma-separated integer token ids"),
    (["--prompt", "1,999"], "prompt ids must be in [0, 256)"),
    (["--prompt", "1", "--prompt-length", "3"], "one of them"),
])
def test_cli_refuses_bad_prompts_before_the_gpu(decoder_bundle, args, message):
    code, out = _cli(["generate", str(decoder_bundle), *args])
    assert code == 2 and out.count("\n") == 1 and message in out, out


@pytest.mark.parametrize("args,message", [
    (["--text", "w5 w6"], "--text needs the model's tokenizer"),
    (["--text", "w5 w6", "--tokenizer", "missing.json"], "no such file"),
    (["--text", "w5 w299", "--tokenizer", "TOK"], "prompt ids must be in [0, 256)"),
    (["--text", "w5", "--prompt", "1,2", "--tokenizer", "TOK"], "one of them"),
])
def test_cli_refuses_bad_text_prompts_before_the_gpu(decoder_bundle, tmp_path, args, message):
    """[Note: text prompts]: a text prompt is checked as an id prompt is, and needs a tokenizer that loads."""
    pytest.importorskip("tokenizers")
    from tests.test_text import word_tokenizer
    tok = str(word_tokenizer(tmp_path / "tokenizer.json"))
    code, out = _cli(["generate", str(decoder_bundle), *[tok if a == "TOK" else a for a in args]])
    assert code == 2 and out.count("\n") == 1 and message in out, out


def test_cli_refuses_a_bundle_without_a_decode_plan(model, tmp_path):
    path = tmp_path / "prefill_only.aicf"
    write_bundle(aicfc.compile(model, precision="fp16", shapes=shapes(4)), path)
    code, out = _cli(["generate", str(path), "--prompt", "1,2"])
    assert code == 2 and "no decode plan" in out and "--shape input_ids=1x1" in out
