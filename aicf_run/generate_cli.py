"""`aicf-run generate BUNDLE`: generate tokens with a decoder bundle ([Note: generation] in
aicf_run/generate.py) and report time to first token and tokens per second.

The prompt is token ids: `--prompt 1,2,3` (one row, repeated for every row of the batch),
`--prompt FILE.npy` (an integer array [B, P]), or `--prompt-length P` (P random ids below
`--vocab`, seeded); or text, `--text "..." --tokenizer tokenizer.json` (every row gets it; the new
tokens are printed as text too: [Note: text prompts] in aicf_run/text.py). Every user error is one
line on stderr and exit 2, as `aicf-run`'s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import numpy as np

from aicf_run.errors import RunError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bundle_path", metavar="BUNDLE")
@click.option("--prompt", default=None, metavar="IDS|FILE.npy",
              help="The prompt's token ids: comma-separated (every batch row gets them), or an integer "
                   ".npy array [B, P].")
@click.option("--prompt-length", type=click.IntRange(min=1), default=None, metavar="P",
              help="Instead of --prompt: P random token ids per row, below --vocab (seeded by --seed).")
@click.option("--vocab", type=click.IntRange(min=1), default=None, metavar="V",
              help="With --prompt-length: ids are drawn below V [default: the logits' last dimension].")
@click.option("--text", default=None, metavar="TEXT",
              help="Instead of --prompt: this text, encoded by --tokenizer (every batch row gets it).")
@click.option("--tokenizer", default=None, metavar="PATH",
              help="The model's Hugging Face tokenizer.json (or its folder, whose generation_config.json's "
                   "eos_token_id then stops rows unless --stop-token is given): encodes --text and prints the new "
                   "tokens as text (pip install 'aicf[text]').")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0 is greedy decoding; above 0, tokens are sampled from softmax(logits / T).")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Sample among the K most likely tokens only (0: all).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
              help="Sample within the smallest set of tokens of cumulative probability P.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the sampling and a random prompt.")
@click.option("--stop-token", "stop_tokens", type=int, multiple=True, metavar="ID",
              help="Stop a row when it produces ID; repeat for several.")
@click.option("--output", default=None, metavar="FILE.npy", help="Save the new tokens [B, n] here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report (tokens and timings) as JSON.")
@click.option("--device", "device_ordinal", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--no-graph", is_flag=True, help="Launch kernels one by one instead of replaying CUDA graphs.")
@click.option("--host-greedy", is_flag=True,
              help="Choose greedy tokens on the host after every step instead of on the device (the bundle's "
                   "greedy feed).")
def generate_command(bundle_path: str, prompt: str | None, prompt_length: int | None, vocab: int | None,
                     text: str | None, tokenizer: str | None, max_new_tokens: int, temperature: float, top_k: int,
                     top_p: float, seed: int, stop_tokens: tuple[int, ...], output: str | None, as_json: bool,
                     device_ordinal: int, no_graph: bool, host_greedy: bool) -> None:
    """Generate tokens with a decoder BUNDLE whose KV cache is state: the prompt through its
    prefill plans, then one token at a time through its decode plan (S = 1)."""
    from aicf_run.cli import _fail
    try:
        _generate(bundle_path, prompt, prompt_length, vocab, text, tokenizer, max_new_tokens, temperature, top_k,
                  top_p, seed, stop_tokens, output, as_json, device_ordinal, not no_graph, not host_greedy)
    except RunError as err:
        _fail(str(err))
    except OSError as err:
        _fail(f"{err.filename or 'I/O'}: {err.strerror or err}; check the path and free space")


def _prompt_ids(prompt: str | None, length: int | None, text_ids: list[int] | None, batch: int, vocab: int,
                seed: int) -> np.ndarray:
    if (prompt is not None) + (length is not None) + (text_ids is not None) != 1:
        raise RunError("give the prompt as --prompt IDS|FILE.npy, --prompt-length P or --text TEXT (one of them)")
    if text_ids is not None:
        ids = np.broadcast_to(np.asarray(text_ids, dtype=np.int64), (batch, len(text_ids)))
    elif length is not None:
        return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int64)
    else:
        assert prompt is not None
        if prompt.endswith(".npy"):
            from aicf_run.inputs import _load_npy
            ids = _load_npy(Path(prompt))
            if ids.ndim == 1:
                ids = np.broadcast_to(ids, (batch, ids.shape[0]))
        else:
            try:
                row = [int(t) for t in prompt.split(",") if t.strip()]
            except ValueError:
                raise RunError(f"--prompt {prompt[:60]!r} is not comma-separated integer token ids nor a .npy "
                               "file") from None
            ids = np.broadcast_to(np.asarray(row, dtype=np.int64), (batch, len(row)))
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer) or ids.shape[1] < 1:
        raise RunError(f"the prompt must be integer token ids [B, P], got {ids.dtype} {list(ids.shape)}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise RunError(f"prompt ids must be in [0, {vocab}) (the logits' size), got {ids.min()}..{ids.max()}")
    return np.ascontiguousarray(ids, dtype=np.int64)


def _generate(bundle_path: str, prompt: str | None, length: int | None, vocab: int | None, text: str | None,
              tokenizer_path: str | None, max_new: int, temperature: float, top_k: int, top_p: float, seed: int,
              stops: tuple[int, ...], output: str | None, as_json: bool, device_ordinal: int, graph: bool,
              device_greedy: bool) -> None:
    from aicf_run.bundle import read_bundle
    from aicf_run.generate import LOGITS, Sampling, decoder_interface, generate

    sampling = Sampling(temperature, top_k, top_p, seed)
    if output is not None and not Path(output).parent.is_dir():
        raise RunError(f"cannot write {output}: folder {Path(output).parent} does not exist")
    if text is not None and tokenizer_path is None:
        raise RunError("--text needs the model's tokenizer: add --tokenizer tokenizer.json")
    tokenizer = None
    if tokenizer_path is not None:
        from aicf_run.text import default_stops, encode, load_tokenizer
        tokenizer = load_tokenizer(tokenizer_path)
        stops = stops or default_stops(tokenizer_path)
    bundle = read_bundle(bundle_path)
    interface = decoder_interface(bundle.plans)   # a one-line error before the GPU is touched
    size = next(o for o in bundle.plans[0].outputs if o["name"] == LOGITS)["shape"][-1]
    text_ids = encode(tokenizer, text) if text is not None else None
    ids = _prompt_ids(prompt, length, text_ids, interface.batch, min(vocab or size, size), seed)

    from aicf_run.device import check_arch, open_device
    device = open_device(device_ordinal)
    try:
        check_arch(bundle.arch, device.arch)
        if len(bundle.plans) > 1:
            from aicf_run.plan_set import PlanSet
            model = PlanSet(bundle, device, graph=graph)
        else:
            from aicf_run.executor import Executor
            model = Executor(bundle, device, graph=graph)
        shown = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - shown[0] >= 0.5 or done == total:
                shown[0] = now
                click.echo(f"\rgenerating: {done}/{total} tokens", err=True, nl=done == total)
        result = generate(model, ids, max_new, sampling, stops, progress=None if as_json else progress,
                          device_greedy=device_greedy)
        gpu = device.name
    finally:
        device.close()
    if output is not None:
        np.save(output, result.tokens)
    texts = None
    if tokenizer is not None:
        from aicf_run.text import decode_rows
        texts = decode_rows(tokenizer, result.tokens, stops)
    if as_json:
        click.echo(json.dumps({"bundle": str(bundle_path), "gpu": gpu, **result.as_dict(),
                               **({"text": texts} if texts is not None else {})}, indent=2))
        return
    mode = "greedy" if sampling.greedy else f"sampled (T={temperature:g}, top-k {top_k}, top-p {top_p:g}, seed {seed})"
    click.echo(f"{bundle.payload['model']['name']} on {gpu}: batch {result.batch}, prompt {result.prompt_length} "
               f"tokens (prefill runs {result.prefill_plans}), {result.new_tokens} new tokens, {mode}"
               + (f", stop tokens {', '.join(map(str, stops))}" if stops else ""))
    for b, row in enumerate(result.tokens[:4]):
        click.echo(f"  row {b}: {' '.join(str(t) for t in row)}")
        if texts is not None:
            click.echo(f"  text {b}: {texts[b]!r}")
    if result.batch > 4:
        click.echo(f"  ... {result.batch - 4} more row(s)")
    click.echo(f"time to first token: {1e3 * result.ttft_s:.2f} ms")
    if result.new_tokens > 1:
        click.echo(f"decode: {result.tokens_per_s:.1f} tokens/s per sequence, "
                   f"{result.batch * result.tokens_per_s:.1f} tokens/s for the batch "
                   f"({1e3 * result.decode_s / (result.new_tokens - 1):.3f} ms a step)")
    if output is not None:
        click.echo(f"tokens -> {output}", err=True)
    sys.stdout.flush()
