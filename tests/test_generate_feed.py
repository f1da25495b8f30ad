"""The greedy feed ([Note: greedy feed] in aicfc/codegen/greedy_feed.py) without a GPU: what the
compiler decides and records for a decode plan, that the kernels build with nvcc, that explain
shows them, and the device path's chunked loop (aicf_run/generate.py) over a fake feed that
does on the host what the kernels do, against the host path: equal tokens, stops mid-chunk,
NaN refused at its step. tests/test_generate_gpu.py runs the kernels themselves.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aicf_run.generate as gen
from aicf_run.bundle import read_bundle
from aicf_run.errors import RunError
from aicf_run.generate import CHUNK_STEPS
from aicf_run.greedy_feed import GRAPH_STEPS
from aicfc.artifact import write_bundle
from aicfc.codegen.greedy_feed import (LOG_ROWS, MAX_STOPS, control_words, decode_interface, plan_feed,
                                       render_feed, threads_for, vector_width)
from aicfc.codegen import pdl
from aicfc.codegen.nvcc import build
from aicfc.driver import compile_plans
from aicfc.explain import explain_json, explain_text
from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
from tests.test_generate import FakeDecoder, shapes


def fake_payload(batch: int = 2, rows: int = 1, vocab: int = 32000, logits: str = "float16", ids: str = "int64",
                 position: str = "int64", offset: int = 0, state: bool = True) -> dict[str, Any]:
    """A decode plan's payload as far as the feed reads it."""
    return {"model": {"name": "m"}, "target": {"arch": "sm_90"}, "state": [{"name": "k"}] if state else [],
            "inputs": [{"name": "input_ids", "shape": [batch, 1], "dtype": "int64", "buffer": 0},
                       {"name": "cache_position", "shape": [1], "dtype": "int64", "buffer": 1}],
            "outputs": [{"name": "logits", "shape": [batch, rows, vocab], "dtype": "float32", "buffer": 2}],
            "buffers": [{"dtype": ids, "region": "arena", "offset": 4096},
                        {"dtype": position, "region": "arena", "offset": 8192},
                        {"dtype": logits, "region": "arena", "offset": offset}],
            "modules": [], "decisions": []}


# ---------------------------------------------------------------- decisions and rendering


def test_vector_width_follows_the_alignment():
    assert vector_width(32000, 2, [0, 64000, 0]) == 8            # fp16, 16-byte loads
    assert vector_width(32000, 4, [0, 128000, 0]) == 4           # fp32, 16-byte loads
    assert vector_width(32000, 2, [8, 64000, 0]) == 4            # an offset of 8 bytes: 8-byte loads
    assert vector_width(131, 4, [0, 524, 0]) == 1                # a row stride of 524 bytes: one at a time
    assert vector_width(1000, 2, [0, 3 * 2000, 2 * 2000]) == 8   # [B, 3, 1000]: rows 6000 bytes apart


def test_threads_about_eight_loads_each():
    assert threads_for(32) == 32 and threads_for(4000) == 512 and threads_for(16000) == 1024
    assert threads_for(10 ** 6) == 1024


def test_only_decode_plans_of_decoders_get_a_feed():
    assert plan_feed(fake_payload()) is not None
    assert "no state" in decode_interface(fake_payload(state=False))
    prefill = fake_payload()
    prefill["inputs"][0]["shape"], prefill["inputs"][1]["shape"] = [2, 16], [16]
    assert "not a decode plan" in decode_interface(prefill)
    other = fake_payload()
    other["inputs"][0]["name"] = "tokens"
    assert "not the generation interface" in decode_interface(other)
    assert decode_interface(fake_payload(logits="int8")) == "dtypes the feed does not cover"


def test_the_feed_renders_the_decision():
    values = plan_feed(fake_payload(batch=4, rows=3, vocab=1000, logits="bfloat16", ids="int32"))
    assert (values["batch"], values["vocab"], values["row_stride"], values["last_offset"]) == (4, 1000, 3000, 2000)
    assert values["vec"] == 8 and values["pack_c"] == "uint4" and values["threads"] == 32
    source = render_feed(values)
    for text in ("#define FEED_B 4", "#define FEED_V 1000", "#define FEED_ROW_STRIDE 3000LL",
                 "#define FEED_LAST 2000LL", "typedef __nv_bfloat16 logit_t;", "typedef int ids_t;",
                 f"#define FEED_LOG_ROWS {LOG_ROWS}LL", values["argmax"], values["advance"]):
        assert text in source, text
    assert control_words(4) == 4 + 8 + MAX_STOPS


def test_one_row_has_no_advance_kernel_and_chunks_its_reads():
    """[Note: the advance in the argmax] and [Note: the feed's reads at once], as recorded and rendered."""
    from aicfc.codegen.greedy_feed import ARGMAX_ARGS, add_greedy_feed, chunk_for
    payload = fake_payload(batch=1)
    payload["launch"] = {"mode": "stream"}
    one = add_greedy_feed(payload)["greedy"]
    assert one["advance"] is None and one["argmax"]["args"] == list(ARGMAX_ARGS)
    two = add_greedy_feed(fake_payload(batch=2) | {"launch": {"mode": "stream"}})["greedy"]
    assert two["advance"]["symbol"] and two["argmax"]["args"] == list(ARGMAX_ARGS)
    from aicf_run.greedy_feed import argmax_names   # the executor passes the pointers in the order the record names
    assert argmax_names(one) == ARGMAX_ARGS and argmax_names(two) == ARGMAX_ARGS
    assert argmax_names({"argmax": {}, "advance": two["advance"]}) == ("logits", "log", "control")   # before session 57
    for bad in ({"argmax": {}, "advance": None}, {"argmax": {"args": ["logits", "log"]}, "advance": two["advance"]},
                {"argmax": {"args": list(ARGMAX_ARGS) + ["logits"]}, "advance": None},
                {"argmax": {"args": ["logits", "log", "control", "x"]}, "advance": two["advance"]},
                {"argmax": {"args": "logits"}, "advance": two["advance"]}, {"argmax": {"args": [[1]]}, "advance": None}):
        with pytest.raises(RunError, match="argmax of an unknown form"):
            argmax_names(bad)
    assert chunk_for(4000, 512) == 8 and chunk_for(16032, 1024) == 8 and chunk_for(17, 32) == 1
    values = plan_feed(fake_payload(batch=1))
    source = render_feed(values)
    assert "#define FEED_CHUNK 8" in source and "#if FEED_B == 1" in source
    # the control words are requested before the dependent-launch wait
    dependent = render_feed(values, True)
    body = dependent[dependent.index(values["argmax"] + "("):]
    assert body.index("__ldcg(control + CTL_STEP)") < body.index("aicf_pdl_entry();") < body.index("packs[j]")


@pytest.mark.parametrize("logits,ids,vocab,rows", [("float16", "int64", 32000, 1), ("bfloat16", "int32", 1000, 3),
                                                   ("float32", "int64", 131, 1), ("float32", "int32", 128256, 1)])
def test_the_feed_kernels_build(logits, ids, vocab, rows):
    values = plan_feed(fake_payload(batch=3, rows=rows, vocab=vocab, logits=logits, ids=ids))
    built = build(render_feed(values), "sm_90")
    assert values["argmax"].encode() in built.cubin and values["advance"].encode() in built.cubin
    assert not any(built.spills.values())


def test_dependent_feed_kernels_wait_first_and_build():
    values = plan_feed(fake_payload(batch=2, vocab=32000))
    plain, dependent = render_feed(values), render_feed(values, dependent=True)
    assert pdl.ENTRY not in plain
    for name in (values["argmax"], values["advance"]):
        body = dependent[dependent.index(f" {name}("):]
        # the wait before any access to what the plan or the feed writes now (the argmax's control words, from the
        # step before, are read ahead of it with __ldcg: [Note: the feed's reads at once])
        assert body.index(pdl.ENTRY) < body.index("control[")
    built = build(dependent, "sm_90")
    assert values["argmax"].encode() in built.cubin and not any(built.spills.values())


def test_a_chunk_is_one_graph():
    """[Note: steps in one graph]: the feed captures a graph of as many steps as a chunk enqueues."""
    assert GRAPH_STEPS == CHUNK_STEPS


# ---------------------------------------------------------------- the bundle


@pytest.fixture(scope="module")
def small_decoder(tmp_path_factory):
    """A random 1-layer decoder at batch 2, a prefill plan (S = 4) and a decode plan, at fp16."""
    cfg = DecoderConfig(64, 1, 1, 1, 64, 40, 32)
    rng = np.random.default_rng(3)
    built = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch="batch")
    sets = [shapes(s, 2) | {n: cfg.cache_shape(2) for n, _ in cache_names(cfg)} for s in (4, 1)]
    path = tmp_path_factory.mktemp("feed") / "small.aicf"
    write_bundle(compile_plans(built, sets, precision="fp16", jobs=2), path)
    return path


def test_the_decode_plan_records_its_feed(small_decoder):
    bundle = read_bundle(small_decoder)
    prefill, decode = bundle.plans
    assert "greedy" not in prefill.payload
    record = decode.payload["greedy"]
    module = decode.modules[record["module"]]
    assert module["name"].endswith("_feed") and record["argmax"]["symbol"] in module["source"]
    assert record["argmax"]["grid"] == [2, 1, 1] and record["batch"] == 2 and record["vocab"] == 40
    ins = {t["name"]: t["buffer"] for t in decode.inputs}
    assert record["buffers"] == {"logits": decode.outputs[0]["buffer"], "ids": ins["input_ids"],
                                 "position": ins["cache_position"]}
    assert record["dtypes"]["logits"] == "float16"   # the storage the kernel reads, not the interface
    assert record["launch"] == "dependent" and pdl.ENTRY in module["source"]   # launched as the plan's kernels are
    assert any(d.get("kind") == "greedy_feed" for d in decode.payload["decisions"])
    assert explain_json(decode.payload)["greedy"]["argmax"] == record["argmax"]
    assert "greedy feed: " + record["argmax"]["symbol"] in explain_text(decode.payload)
    assert "greedy" not in explain_json(prefill.payload)


# ---------------------------------------------------------------- the device loop over a fake feed


class FakeFeed:
    """What the feed kernels do, on the host, over a FakeDecoder's decode runner."""

    def __init__(self, runner, batch: int, nan_at: int | None = None) -> None:
        self.runner, self.batch, self.nan_at = runner, batch, nan_at
        self.log_rows, self.max_stops = LOG_ROWS, MAX_STOPS
        self.launched = 0
        self.slots: dict[int, tuple[np.ndarray, int]] = {}

    def start(self, tokens, position, stops, done) -> None:
        self.ids, self.position, self.stops = np.array(tokens), int(position), np.array(stops)
        self.done, self.step, self.nan = np.array(done, bool), 0, 0
        self.log = np.full((self.log_rows, self.batch), -1, np.int64)

    def launch(self, steps: int) -> None:
        for _ in range(steps):
            logits = self.runner.run({"input_ids": self.ids[:, None].astype(np.int64),
                                      "cache_position": np.array([self.position])})["logits"][:, -1]
            if self.step == self.nan_at:
                logits[0, 3] = np.nan
            if np.isnan(logits).any() and not self.nan:
                self.nan = self.step + 1
            token = np.where(self.done, self.ids, logits.argmax(-1))
            self.done |= np.isin(token, self.stops)
            self.log[self.step % self.log_rows] = token
            self.ids, self.position, self.step = token, self.position + 1, self.step + 1
            self.launched += 1

    def read_back(self, slot: int) -> None:
        self.slots[slot] = (self.log.copy(), self.nan)

    def collect(self, slot: int, first: int, count: int):
        log, nan = self.slots[slot]
        return log[(first + np.arange(count)) % self.log_rows], nan - 1


def both_paths(monkeypatch, prompt, steps, nan_at=None, **options):
    fake = FakeDecoder((4, 1), batch=prompt.shape[0])
    host = gen.generate(fake, prompt, steps, device_greedy=False, **options)
    feed = FakeFeed(fake.plan(1), prompt.shape[0], nan_at)
    monkeypatch.setattr(gen, "greedy_feed", lambda step: feed)
    device = gen.generate(fake, prompt, steps, **options)
    return host, device, feed


@pytest.mark.parametrize("steps", [2, 8, 9, 17, 40])
def test_device_loop_gives_the_host_tokens(monkeypatch, steps):
    prompt = np.random.default_rng(1).integers(0, 11, (3, 6))
    host, device, feed = both_paths(monkeypatch, prompt, steps)
    assert device.tokens.tolist() == host.tokens.tolist() and device.stopped == host.stopped
    assert feed.launched == steps - 1   # no stop tokens: exactly the steps the host would run


def test_device_loop_stops_mid_chunk(monkeypatch):
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    free = gen.generate(FakeDecoder((4, 1), batch=2), prompt, 40, device_greedy=False).tokens
    stops = [int(free[0, 5]), int(free[1, 11])]   # rows stop at steps 5 and 11 (chunks of 8)
    host, device, feed = both_paths(monkeypatch, prompt, 40, stop_tokens=stops)
    assert device.tokens.tolist() == host.tokens.tolist() and device.stopped == host.stopped
    assert all(host.stopped) and host.new_tokens < 40
    assert feed.launched <= host.new_tokens - 1 + 2 * gen.CHUNK_STEPS   # the chunks in flight at most


def test_device_loop_refuses_nan_at_its_step(monkeypatch):
    prompt = np.array([[1, 2, 3]])
    with pytest.raises(RunError, match="logits hold NaN"):
        both_paths(monkeypatch, prompt, 30, nan_at=12)
    host, device, _ = both_paths(monkeypatch, prompt, 5, nan_at=12)   # a NaN past the last step is never seen
    assert device.tokens.tolist() == host.tokens.tolist()


def test_progress_is_called_per_chunk(monkeypatch):
    fake = FakeDecoder((4, 1))
    monkeypatch.setattr(gen, "greedy_feed", lambda step: FakeFeed(fake.plan(1), 1))
    calls: list[tuple[int, int]] = []
    result = gen.generate(fake, np.array([[1, 2, 3]]), 20, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(9, 20), (17, 20), (20, 20)] and result.new_tokens == 20


def test_sampling_keeps_the_host_path(monkeypatch):
    monkeypatch.setattr(gen, "greedy_feed", lambda step: pytest.fail("the feed is greedy only"))
    gen.generate(FakeDecoder((4, 1)), np.array([[1, 2]]), 5, gen.Sampling(0.8, seed=1))
