"""Greedy feed: the kernels that let aicf-run decode greedily without the host between steps.

[Note: greedy feed] A decoder's decode plan ([Note: generation] in aicf_run/generate.py:
inputs `input_ids` [B, 1] and `cache_position` [1], output `logits` [B, L, V], the KV cache
as state) gets a module of its own, `<model>_feed`, with two kernels the executor launches
after the plan, on the same stream:

- `argmax` (grid B, one block a row): the next token of each row is the argmax of the row's
  last logits, read in their storage dtype (fp16/bf16 widen to float exactly, so the order is
  the float32 interface's): the largest value, NaN above every number, the first index among
  equals, as numpy's and torch's argmax. A row that met a stop token repeats it. The first
  step whose logits hold a NaN is recorded, and the executor refuses it as the host path does.
  The token goes to `last` in the control words and to the log, at row `step % log_rows`.
- `advance` (one warp): `last` into `input_ids` (in its dtype), step and position + 1, the
  position into `cache_position`. A second launch, so that nothing is written into the arena
  while a block still reads logits: the plan may have placed the inputs anywhere.

The control words are int64 at device memory the executor allocates: [0] step, [1] position,
[2] the first step whose logits held a NaN, plus one (0: none), [3] number of stop tokens,
[4, 4 + B) done flags, [4 + B, 4 + 2B) last tokens, [4 + 2B, 4 + 2B + max_stops) stop token
ids (the `control` record). With them the executor captures plan + feed into one CUDA graph
and replays it N times with no host sync between steps, reading the log back every few steps
(aicf_run/greedy_feed.py). Where the plan's kernels are launched dependent, the feed's kernels
start with the dependent-launch entry and are launched so too ([Note: steps in one graph]).
Everything shape-dependent (B, V, vector width, offsets, thread count) is fixed here and
recorded in the plan's `greedy` record.

[Note: the feed's reads at once]
The argmax sits on every decode step's critical path, after the LM head. Its threads read the row's
logits in a loop of one 16-byte load an iteration, each compared before the next was requested: the
PTX of the 1 B Llama's feed (32000 fp16 logits, 512 threads) held one `ld.global.nc.v4` in the loop,
so a thread waited for about 8 round trips to L2 in turn. Thread 0 then read the control words one
after another (step, NaN step, stop count, done flag, last token, each stop id) after the block's
reduction. Now each thread requests its vectors (at most CHUNK_MAX) into registers before it
compares any, and thread 0 requests its control words before the dependent-launch wait: they were
written by the previous step's feed, which completed before this step's first kernel passed its wait
(read with `__ldcg`, at L2). The comparisons are the same, in the same order (and the order above is
total, so the winner does not depend on it): the tokens are the same. Measured on an H200 (session 57,
benchmarks/results/feed_reads_session57_h200.txt; benchmarks/decode_ab.py, the 1 B Llama's 4-layer decode plan, 9
alternating rounds in one process, two bundles of each form, the earlier form's compiled from the previous
template): the generate step 0.1585 / 0.1593 ms against 0.1592 / 0.1598 (1.004x, about 0.6 us a step), the plan's
own replay unchanged (153.6-154.6 us both), the same tokens.

[Note: the advance in the argmax]
The advance is a launch of its own so that input_ids and cache_position, which the plan's arena may place over
the logits, are written only once no block reads a logit. At one row (B = 1) the argmax is one block, and after
its barrier every thread has read its logits, so thread 0 does the advance's work itself (the token into
input_ids, step and position + 1, the position into cache_position; the position read with the other control
words before the wait): a launch and a dependent-launch boundary fewer each step. The record's `advance` is then
None and the executor launches the argmax alone; at B > 1 nothing changes. The argmax takes input_ids and
cache_position at every B (`args` in its record), so the executor passes them whatever the batch; a bundle from
before (no `args`) still runs its three-argument argmax and its advance. Measured on an H200 (session 57,
benchmarks/results/feed_advance_session57_h200.txt; benchmarks/decode_ab.py, the 1 B Llama's 2-layer decode plan,
7 alternating rounds, one bundle of each, the other compiled from the previous feed): the generate step 0.1005
against 0.1012 ms (1.007x, faster in 6 of the 7 rounds), the same tokens.
"""
from __future__ import annotations

from typing import Any

from aicfc.artifact.payload import module_record
from aicfc.codegen import pdl
from aicfc.codegen.common import render
from aicfc.codegen.module import ModuleBuild
from aicfc.codegen.nvcc import build

IDS, POSITION, LOGITS = "input_ids", "cache_position", "logits"
LOG_ROWS = 64      # steps the device log holds; the executor reads it back at most this many steps apart
MAX_STOPS = 16     # stop tokens the control words hold; more go through the host path
CONTROL_HEAD = ("step", "position", "nan", "stops")
# bundle dtype -> (C type, bytes)
LOGIT_TYPES = {"float32": ("float", 4), "float16": ("__half", 2), "bfloat16": ("__nv_bfloat16", 2)}
INT_TYPES = {"int64": "long long", "int32": "int"}
PACKS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}
CHUNK_MAX = 8      # vectors a thread of the argmax holds in flight ([Note: the feed's reads at once])
ARGMAX_ARGS = ("logits", "log", "control", "ids", "position")   # the argmax's parameters, in order


def control_words(batch: int) -> int:
    return len(CONTROL_HEAD) + 2 * batch + MAX_STOPS


def vector_width(vocab: int, itemsize: int, strides_bytes: list[int]) -> int:
    """The most logits one aligned load can read (16 bytes at most): every row's start must be a
    multiple of the load's size, so it divides the buffer offset and the row stride in bytes."""
    width = 16 // itemsize
    while width > 1 and any(s % (width * itemsize) for s in strides_bytes):
        width //= 2
    return width


def chunk_for(vectors: int, threads: int) -> int:
    """Vectors a thread requests before it compares any ([Note: the feed's reads at once]): all of its
    share, at most CHUNK_MAX (each a 16-byte register quad at most)."""
    return max(1, min(CHUNK_MAX, -(-vectors // threads)))


def threads_for(vectors: int) -> int:
    """About 8 loads a thread, a power of two from one warp to 1024."""
    threads = 32
    while threads < 1024 and threads * 8 < vectors:
        threads *= 2
    return threads


def decode_interface(payload: dict[str, Any]) -> tuple[dict, dict, dict] | str:
    """(input_ids, cache_position, logits) of a decode plan, or why the payload is none."""
    inputs = {t["name"]: t for t in payload["inputs"]}
    outputs = {t["name"]: t for t in payload["outputs"]}
    if not payload.get("state"):
        return "no state (KV cache)"
    if set(inputs) != {IDS, POSITION} or LOGITS not in outputs:
        return f"not the generation interface ({IDS}, {POSITION} -> {LOGITS})"
    ids, pos, logits = inputs[IDS], inputs[POSITION], outputs[LOGITS]
    if len(ids["shape"]) != 2 or ids["shape"][1] != 1 or list(pos["shape"]) != [1]:
        return f"not a decode plan ({IDS} {ids['shape']}, {POSITION} {pos['shape']})"
    if len(logits["shape"]) != 3 or logits["shape"][0] != ids["shape"][0] or logits["shape"][2] < 1:
        return f"{LOGITS} {logits['shape']} is not [B, L, V]"
    buffers = payload["buffers"]
    if (buffers[ids["buffer"]]["dtype"] not in INT_TYPES or buffers[pos["buffer"]]["dtype"] not in INT_TYPES
            or buffers[logits["buffer"]]["dtype"] not in LOGIT_TYPES):
        return "dtypes the feed does not cover"
    if any(buffers[t["buffer"]]["region"] != "arena" for t in (ids, pos, logits)):
        return "interface tensors outside the arena"
    return ids, pos, logits


def plan_feed(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The template values of a decode plan's feed, or None when the payload is no decode plan."""
    found = decode_interface(payload)
    if isinstance(found, str):
        return None
    ids, pos, logits = found
    buffers = payload["buffers"]
    batch, rows, vocab = logits["shape"]
    logit_dtype = buffers[logits["buffer"]]["dtype"]
    c_type, itemsize = LOGIT_TYPES[logit_dtype]
    stride, last = rows * vocab, (rows - 1) * vocab
    vec = vector_width(vocab, itemsize, [buffers[logits["buffer"]]["offset"], stride * itemsize, last * itemsize])
    threads = threads_for(-(-vocab // vec))
    return {"model": payload["model"]["name"], "batch": batch, "vocab": vocab, "row_stride": stride,
            "last_offset": last, "vec": vec, "threads": threads, "chunk": chunk_for(-(-vocab // vec), threads),
            "log_rows": LOG_ROWS,
            "max_stops": MAX_STOPS, "logits_c": c_type, "pack_c": PACKS[vec * itemsize],
            "ids_c": INT_TYPES[buffers[ids["buffer"]]["dtype"]],
            "position_c": INT_TYPES[buffers[pos["buffer"]]["dtype"]],
            "argmax": f"aicf_feed_argmax_b{batch}_v{vocab}", "advance": f"aicf_feed_advance_b{batch}",
            "buffers": {"logits": logits["buffer"], "ids": ids["buffer"], "position": pos["buffer"]},
            "dtypes": {"logits": logit_dtype, "ids": buffers[ids["buffer"]]["dtype"],
                       "position": buffers[pos["buffer"]]["dtype"]}}


def render_feed(values: dict[str, Any], dependent: bool = False) -> str:
    """The feed module's source; `dependent`: its kernels start with the dependent-launch entry, to be launched
    with programmatic serialization after the plan's last kernel and each other ([Note: PDL])."""
    return render("greedy_feed.cu.j2", pdl_helper=pdl.HELPER if dependent else "", **values)


def add_greedy_feed(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` (one plan, as compile_model builds it) with its feed module, `greedy` record and
    decision added when it is a decode plan ([Note: greedy feed]); else `payload` itself."""
    values = plan_feed(payload)
    if values is None:
        return payload
    launch = payload.get("launch", {}).get("mode", pdl.STREAM)
    source, arch = render_feed(values, launch == pdl.DEPENDENT), payload["target"]["arch"]
    module = module_record(ModuleBuild(f"{values['model']}_feed", source, build(source, arch),
                                      (values["argmax"], values["advance"])), arch)
    index = len(payload["modules"])
    batch = values["batch"]
    reason = (f"decode plan of a decoder (state, {IDS} [{batch}, 1], {POSITION} [1]): greedy tokens chosen and "
              f"fed back on the device, argmax over {values['vocab']} logits ({values['dtypes']['logits']}, "
              f"{values['vec']} a load, {values['threads']} threads a row), so decode steps replay with no host "
              f"round trip")
    record = {
        "module": index,
        "argmax": {"symbol": values["argmax"], "grid": [batch, 1, 1], "block": [values["threads"], 1, 1],
                   "args": list(ARGMAX_ARGS)},
        # [Note: the advance in the argmax]: at one row no advance kernel runs
        "advance": None if batch == 1 else {"symbol": values["advance"], "grid": [1, 1, 1], "block": [32, 1, 1]},
        "launch": launch,
        "buffers": values["buffers"], "dtypes": values["dtypes"],
        "batch": batch, "vocab": values["vocab"], "vector": values["vec"],
        "log_rows": LOG_ROWS, "max_stops": MAX_STOPS,
        "control": {"words": control_words(batch), "head": list(CONTROL_HEAD), "done": len(CONTROL_HEAD),
                    "last": len(CONTROL_HEAD) + batch, "stop_ids": len(CONTROL_HEAD) + 2 * batch},
        "nan": "NaN is above every number (numpy's and torch's argmax); the first step meeting one is recorded "
               "and aicf-run refuses it as the host path does",
        "ties": "the first index",
        "reason": reason,
    }
    decision = {"kind": "greedy_feed", "kernel": values["argmax"], "advance": values["advance"] if batch > 1 else None,
                "reason": reason}
    return {**payload, "modules": [*payload["modules"], module], "greedy": record,
            "decisions": [*payload["decisions"], decision]}
