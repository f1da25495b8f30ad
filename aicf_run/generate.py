"""Token generation over a decoder bundle whose KV cache is state: prefill, then decode steps.

[Note: generation] The bundle is a decoder compiled with its cache as state ([Note: state] in
aicf_run/executor.py) and one plan per sequence length (aicf_run/plan_set.py), every plan
sharing that state: inputs `input_ids` [B, S] and `cache_position` [S] (integers), output
`logits` [B, S or 1, V], the cache updated in place at `cache_position`. Nothing here decides
how the model runs; it only feeds positions: the prompt goes through the prefill plans (the
longest that fits first, so a prompt of any length is covered by the plans there are, down to
S = 1), then each new token through the decode plan (S = 1) at the next position. Between
steps only the token ids and one position go to the GPU and only the last position's logits
come back. The next token is chosen on the host from those logits: greedy (argmax, the first
on ties, as torch's), or sampled with a temperature, top-k and top-p from a seeded generator.

Greedy decoding of a bundle whose decode plan has a greedy feed ([Note: greedy feed] in
aicfc/codegen/greedy_feed.py; aicf_run/greedy_feed.py) chooses on the device instead: the first
token still comes from the host (from the prefill's logits), then [decode plan + argmax +
advance] is one CUDA graph replayed step after step with no host work in between; the host
reads the device's token log back every CHUNK_STEPS steps, keeping one chunk in flight while it
reads the previous one. The device applies the same rules (first index on ties, a row that met
a stop token repeats it, logits holding NaN are refused at the step that meets them), so the
tokens are the host path's; when every row has stopped, the steps already enqueued (at most two
chunks) still run, and their tokens are dropped. Sampling, more stop tokens than the feed
holds, `device_greedy=False` and bundles without a feed take the host path.

Times are wall-clock on the host around GPU work it waits for: time to first token is the
prefill plus the first choice; decode is every later step, so tokens per second counts the
tokens after the first, per sequence (times B for the batch). On the device path decode ends
when the GPU is idle again, the steps past the last stop included; the feed's one-time setup
(its module, memory and graph capture, at the executor's first greedy generation) is outside
both times, as the plans' own graph captures at load are.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aicf_run.errors import RunError
from aicf_run.greedy_feed import SLOTS, GreedyFeed, greedy_feed
from aicf_run.plan_set import PlanSet, same_state

IDS, POSITION, LOGITS = "input_ids", "cache_position", "logits"
_INTEGER = ("int64", "int32")
# Steps between read-backs of the device's token log on the greedy device path: a read-back
# costs the host tens of microseconds against a step of a millisecond, and at most two chunks
# run past the step where the last row stopped.
CHUNK_STEPS = 8
_NAN = "the model's logits hold NaN; check the bundle with `aicf-run BUNDLE --check MODEL.onnx`"


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: temperature 0 is greedy; else softmax(logits / temperature)
    over the top_k largest (0: all) within the smallest set of cumulative probability top_p."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise RunError(f"temperature must be a finite number >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise RunError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise RunError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """What `generate` produced: `tokens` [B, n] (the new tokens; a row that met a stop token
    repeats it), and the timings."""

    tokens: np.ndarray
    prompt_length: int
    ttft_s: float
    decode_s: float
    prefill_plans: list[int] = field(default_factory=list)   # the S of each prefill run, in order
    stopped: list[bool] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def new_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second per sequence (the tokens after the first)."""
        steps = self.new_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "prompt_length": self.prompt_length, "new_tokens": self.new_tokens,
                "ttft_ms": 1e3 * self.ttft_s, "decode_ms": 1e3 * self.decode_s,
                "tokens_per_s": self.tokens_per_s, "batch_tokens_per_s": self.batch * self.tokens_per_s,
                "prefill_runs": self.prefill_plans, "stopped": self.stopped, "tokens": self.tokens.tolist()}


@dataclass(frozen=True)
class Interface:
    """A decoder bundle's plans as generation sees them: the batch, each plan's sequence length
    (in the bundle's order) and the integer types of the ids and positions."""

    batch: int
    lengths: tuple[int, ...]
    ids_dtype: str
    position_dtype: str


def decoder_interface(bundles: Sequence[Any]) -> Interface:
    """Check that a bundle's plans (aicf_run.bundle.Bundle views) form a decoder generation can
    drive ([Note: generation]), on the host; one-line RunError naming what is missing."""
    if not all(b.payload.get("state") for b in bundles):
        raise RunError("the bundle has no state (KV cache) in some plan: generation needs a decoder whose cache "
                       "inputs are updated by ScatterND / index_copy and returned as outputs")
    if len(bundles) > 1 and not same_state(list(bundles)):
        raise RunError("the bundle's plans do not share one KV cache (their state tensors differ); compile every "
                       "--shape set of the decoder at one batch size with the same cache inputs")
    lengths, batch = [], None
    for bundle in bundles:
        inputs = {item["name"]: item for item in bundle.inputs}
        outputs = {item["name"]: item for item in bundle.outputs}
        if set(inputs) != {IDS, POSITION} or LOGITS not in outputs:
            raise RunError(f"generation needs inputs {IDS!r} [B, S] and {POSITION!r} [S] (the cache as state) and "
                           f"an output {LOGITS!r}; this bundle has inputs {sorted(inputs)} and outputs "
                           f"{sorted(outputs)}")
        ids, pos, logits = inputs[IDS], inputs[POSITION], outputs[LOGITS]
        if (len(ids["shape"]) != 2 or list(pos["shape"]) != [ids["shape"][1]] or len(logits["shape"]) != 3
                or logits["shape"][0] != ids["shape"][0] or logits["shape"][1] not in (1, ids["shape"][1])):
            raise RunError(f"generation needs {IDS} [B, S], {POSITION} [S] and {LOGITS} [B, S or 1, V]; a plan has "
                           f"{ids['shape']}, {pos['shape']} and {logits['shape']}")
        if ids["dtype"] not in _INTEGER or pos["dtype"] not in _INTEGER:
            raise RunError(f"{IDS} and {POSITION} must be integers (int64 or int32); a plan has {ids['dtype']} and "
                           f"{pos['dtype']}")
        if batch is not None and ids["shape"][0] != batch:
            raise RunError(f"the plans have different batch sizes ({batch} and {ids['shape'][0]}); generation "
                           f"needs one batch size: compile the sequence lengths at one B")
        batch = ids["shape"][0]
        lengths.append(ids["shape"][1])
    if 1 not in lengths:
        raise RunError(f"no decode plan: the bundle has sequence lengths {sorted(lengths)} and needs one of 1 "
                       f"(add `--shape {IDS}={batch}x1 --shape {POSITION}=1` to `aicfc compile`)")
    first = {item["name"]: item["dtype"] for item in bundles[0].inputs}
    return Interface(int(batch or 1), tuple(lengths), first[IDS], first[POSITION])


def decoder_plans(model: Any) -> tuple[Interface, dict[int, Any]]:
    """The interface of a loaded bundle (an Executor or a PlanSet) and its plans by sequence
    length, each a runner with `run(inputs)`."""
    if isinstance(model, PlanSet):
        bundles = list(model.bundle.plans)
        runners = [model.plan(i) for i in range(len(bundles))]
    else:
        bundles, runners = [model.bundle], [model]
    interface = decoder_interface(bundles)
    return interface, dict(zip(interface.lengths, runners))


def prefill_lengths(length: int, available: Sequence[int]) -> list[int]:
    """The plan lengths that cover a prompt of `length` tokens, longest first (1 always fits)."""
    runs, left = [], length
    for s in sorted(available, reverse=True):
        while s <= left:
            runs.append(s)
            left -= s
    return runs


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """The next token of every row of `logits` [B, V] ([Note: generation])."""
    if np.isnan(logits).any():
        raise RunError(_NAN)
    if sampling.greedy:
        return logits.argmax(axis=-1)
    scaled = logits.astype(np.float64) / sampling.temperature
    out = np.empty(scaled.shape[0], dtype=np.int64)
    for b, row in enumerate(scaled):
        order = np.argsort(-row, kind="stable")
        if sampling.top_k:
            order = order[:sampling.top_k]
        p = np.exp(row[order] - row[order[0]])
        p /= p.sum()
        if sampling.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(p), sampling.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        out[b] = order[rng.choice(len(order), p=p)]
    return out


def generate(model: Any, prompt: np.ndarray, max_new_tokens: int, sampling: Sampling = Sampling(),
             stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
             reset: bool = True, device_greedy: bool = True) -> Generation:
    """Generate up to `max_new_tokens` after `prompt` [B, P] (integer token ids) on a loaded
    decoder bundle (aicf_run.load); stops early once every row has produced a stop token. The
    cache is zeroed first unless `reset=False`. Greedy decoding runs on the device where the
    bundle has a greedy feed, unless `device_greedy=False`. See [Note: generation]."""
    plans, by_length = decoder_plans(model)
    prompt = np.asarray(prompt)
    if prompt.ndim == 1:
        prompt = prompt[None]
    if prompt.ndim != 2 or prompt.shape[1] < 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise RunError(f"the prompt must be integer token ids of shape [B, P] with P >= 1, got {prompt.dtype} "
                       f"{list(prompt.shape)}")
    if prompt.shape[0] != plans.batch:
        raise RunError(f"the prompt has {prompt.shape[0]} row(s) but the bundle was compiled for batch {plans.batch}; "
                       f"pass {plans.batch} prompt row(s) of one length or recompile")
    if max_new_tokens < 1:
        raise RunError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids_dtype, pos_dtype = np.dtype(plans.ids_dtype), np.dtype(plans.position_dtype)
    rng = np.random.default_rng(sampling.seed)
    stops = np.asarray(list(stop_tokens), dtype=np.int64)
    step = by_length[1]
    feed = None
    if device_greedy and sampling.greedy and max_new_tokens > 1:
        feed = greedy_feed(step)   # built once per executor, before the clocks start
        if feed is not None and len(stops) > feed.max_stops:
            feed = None
    if reset:
        model.reset_state()
    start = time.perf_counter()
    runs = prefill_lengths(prompt.shape[1], by_length)
    at = 0
    logits = None
    for s in runs:
        out = by_length[s].run({IDS: prompt[:, at:at + s].astype(ids_dtype),
                                      POSITION: np.arange(at, at + s, dtype=pos_dtype)})
        logits = out[LOGITS]
        at += s
    token = choose(np.asarray(logits)[:, -1], sampling, rng)
    ttft = time.perf_counter() - start
    tokens = [token]
    done = np.isin(token, stops)
    decode_start = time.perf_counter()
    if feed is not None and not done.all():
        tokens, done = _decode_on_device(feed, tokens, done, at, stops, max_new_tokens, progress)
    position = np.empty(1, dtype=pos_dtype)
    while len(tokens) < max_new_tokens and not done.all():
        if progress is not None:
            progress(len(tokens), max_new_tokens)
        position[0] = at
        out = step.run({IDS: token.astype(ids_dtype)[:, None], POSITION: position})
        at += 1
        nxt = choose(np.asarray(out[LOGITS])[:, -1], sampling, rng)
        token = np.where(done, token, nxt)   # a finished row repeats its stop token
        done |= np.isin(token, stops)
        tokens.append(token)
    decode = time.perf_counter() - decode_start
    if progress is not None:
        progress(len(tokens), max_new_tokens)
    return Generation(np.stack(tokens, axis=1).astype(np.int64), int(prompt.shape[1]), ttft, decode, runs,
                      [bool(d) for d in done])


def _decode_on_device(feed: GreedyFeed, tokens: list[np.ndarray], done: np.ndarray, at: int, stops: np.ndarray,
                      max_new_tokens: int, progress: Callable[[int, int], None] | None
                      ) -> tuple[list[np.ndarray], np.ndarray]:
    """The greedy decode steps on the device ([Note: generation]): `tokens` (the first one,
    chosen on the host) with the rest appended, up to `max_new_tokens` or until every row has
    stopped, and the rows' done flags. Returns with the GPU idle."""
    steps = max_new_tokens - len(tokens)
    chunk = max(1, min(CHUNK_STEPS, feed.log_rows))
    feed.start(tokens[-1], at, stops, done)
    pending: deque[tuple[int, int, int]] = deque()   # (first step, steps, read-back slot)
    enqueued = chunks = 0

    def enqueue() -> None:
        nonlocal enqueued, chunks
        count = min(chunk, steps - enqueued)
        slot = chunks % SLOTS
        feed.launch(count)
        feed.read_back(slot)
        pending.append((enqueued, count, slot))
        enqueued += count
        chunks += 1

    while len(pending) < SLOTS and enqueued < steps:
        enqueue()
    finished = False
    while pending and not finished:
        first, count, slot = pending.popleft()
        rows, nan_step = feed.collect(slot, first, count)
        for j, row in enumerate(rows):
            if nan_step == first + j:
                _drain(feed, pending)
                raise RunError(_NAN)
            tokens.append(row)
            done = done | np.isin(row, stops)
            if done.all():
                finished = True
                break
        if not finished:
            if progress is not None and len(tokens) < max_new_tokens:   # generate reports the end
                progress(len(tokens), max_new_tokens)
            if enqueued < steps:
                enqueue()
    _drain(feed, pending)
    return tokens, done


def _drain(feed: GreedyFeed, pending: deque[tuple[int, int, int]]) -> None:
    """Wait for the chunks still in flight (steps past the last stop), so the GPU is idle."""
    while pending:
        first, count, slot = pending.popleft()
        feed.collect(slot, first, count)
