"""Text in and out of `aicf-run generate` through a Hugging Face tokenizer (`tokenizer.json`).

[Note: text prompts] A decoder bundle takes and returns token ids; a user of it holds text and the model's
`tokenizer.json`. `--tokenizer PATH` (the file, or the model's folder holding it) loads it with the `tokenizers`
package (the optional extra `aicf[text]`: the tokenizer's normalizer, pre-tokenizer, BPE or unigram model and
post-processor are its own, nothing to write again here), `--text` is encoded with the tokenizer's special tokens
(a Llama's BOS, as transformers' tokenizers add them), and each row's new tokens are decoded up to and including
its first stop token (a stopped row repeats it), special tokens left out. Given the model's folder and no
`--stop-token`, the rows stop at its generation_config.json's `eos_token_id`, as transformers' `generate` does. The
ids the model sees are checked as any prompt's are (below the logits' size). Nothing here touches the GPU, so every
error comes before it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aicf_run.errors import RunError

TOKENIZER_FILE = "tokenizer.json"
MAX_TOKENIZER_BYTES = 256 << 20   # the largest tokenizer.json read (vocabularies of 256 k tokens take ~20 MB)
MAX_TEXT_CHARS = 1 << 20          # the longest --text encoded


def load_tokenizer(path: str) -> Any:
    """The `tokenizers.Tokenizer` of `path`: a tokenizer.json file, or a folder that holds one."""
    where = Path(path)
    if where.is_dir():
        where = where / TOKENIZER_FILE
    if not where.is_file():
        raise RunError(f"--tokenizer {path}: no such file; give the model's {TOKENIZER_FILE} or the folder holding it")
    size = where.stat().st_size
    if size > MAX_TOKENIZER_BYTES:
        raise RunError(f"--tokenizer {where}: {size} bytes, over the {MAX_TOKENIZER_BYTES} read; "
                       f"give the model's {TOKENIZER_FILE}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise RunError("--tokenizer needs the tokenizers package: pip install 'aicf[text]'") from None
    content = where.read_bytes()   # an OSError here is the CLI's one line about the path
    try:
        return Tokenizer.from_str(content.decode("utf-8"))
    except Exception as err:   # a malformed file: tokenizers raises a bare Exception, a bad encoding UnicodeDecodeError
        raise RunError(f"--tokenizer {where}: not a tokenizers JSON file ({_first_line(err)}); give the model's "
                       f"{TOKENIZER_FILE}") from None


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:120]


def encode(tokenizer: Any, text: str) -> list[int]:
    """`text` as token ids, with the tokenizer's special tokens (its post-processor's BOS, if any)."""
    if len(text) > MAX_TEXT_CHARS:
        raise RunError(f"--text is {len(text)} characters, over {MAX_TEXT_CHARS}; give a shorter prompt")
    ids = tokenizer.encode(text, add_special_tokens=True).ids
    if not ids:
        raise RunError("--text encodes to no tokens; give a non-empty prompt")
    return list(ids)


def decode_rows(tokenizer: Any, tokens: np.ndarray, stops: Sequence[int]) -> list[str]:
    """Each row's new tokens as text: up to and including its first stop token, special tokens left out."""
    out = []
    for row in np.asarray(tokens).tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        out.append(tokenizer.decode(row[:end], skip_special_tokens=True))
    return out


GENERATION_CONFIG = "generation_config.json"
MAX_CONFIG_BYTES = 1 << 20


def default_stops(path: str) -> tuple[int, ...]:
    """The end-of-sequence ids of the model folder `path` (its generation_config.json's `eos_token_id`, an id or a
    list of them, as transformers' `generate` stops on them), or () where `path` is a file or the folder has none."""
    config = Path(path) / GENERATION_CONFIG
    if not config.is_file():   # (a file's path / anything is no file)
        return ()
    if config.stat().st_size > MAX_CONFIG_BYTES:
        raise RunError(f"{config}: over {MAX_CONFIG_BYTES} bytes, not a generation config; fix it or give "
                       f"--tokenizer the tokenizer.json itself")
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token_id")
    except (ValueError, AttributeError) as err:   # bad JSON, a bad encoding, not an object
        raise RunError(f"{config}: not a generation config ({_first_line(err)}); fix it or give "
                       f"--tokenizer the tokenizer.json itself") from None
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise RunError(f"{config}: eos_token_id {eos!r} is not a token id or a list of them")
    return tuple(ids)
