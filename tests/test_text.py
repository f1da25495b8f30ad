"""Text prompts for `aicf-run generate` ([Note: text prompts] in aicf_run/text.py): a word-level tokenizer.json
written here (words w3..w{V-1} as ids 3..V-1, `<s>` prepended as BOS where asked) stands for a model's."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from aicf_run.errors import RunError

tokenizers = pytest.importorskip("tokenizers")


def word_tokenizer(path, vocab: int = 300, bos: bool = True):
    """A tokenizer.json at `path`: words "w{i}" are ids i (3 <= i < vocab), split on whitespace; id 0 is `<unk>`, 1
    `<s>` (BOS, added before every encoding when `bos`), 2 `</s>`, the last two special."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return path


def test_text_is_encoded_with_the_bos_and_decoded_to_the_first_stop(tmp_path):
    from aicf_run.text import decode_rows, encode, load_tokenizer
    tok = load_tokenizer(str(word_tokenizer(tmp_path / "tokenizer.json")))
    assert encode(tok, "w5 w17  w200") == [1, 5, 17, 200]
    assert load_tokenizer(str(tmp_path)).get_vocab_size() == tok.get_vocab_size()   # the folder holding it
    tokens = np.array([[7, 8, 2, 2, 2], [9, 1, 10, 11, 12]])   # row 0 stopped at </s> (2) and repeats it
    assert decode_rows(tok, tokens, [2]) == ["w7 w8", "w9 w10 w11 w12"]   # special tokens left out
    assert decode_rows(tok, tokens, [8]) == ["w7 w8", "w9 w10 w11 w12"]


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    ("{not json", "not a tokenizers JSON file"),
    ('{"version": "1.0"}', "not a tokenizers JSON file"),
    (b"\xff\xfe\x00", "not a tokenizers JSON file"),
])
def test_a_bad_tokenizer_is_one_line(tmp_path, content, message):
    from aicf_run.text import load_tokenizer
    path = tmp_path / "tokenizer.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(RunError) as err:
        load_tokenizer(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_huge_tokenizer_or_text_is_refused(tmp_path, monkeypatch):
    from aicf_run import text
    path = word_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.setattr(text, "MAX_TOKENIZER_BYTES", 100)
    with pytest.raises(RunError, match="over the 100 read"):
        text.load_tokenizer(str(path))
    monkeypatch.setattr(text, "MAX_TOKENIZER_BYTES", 1 << 30)
    tok = text.load_tokenizer(str(path))
    monkeypatch.setattr(text, "MAX_TEXT_CHARS", 10)
    with pytest.raises(RunError, match="over 10"):
        text.encode(tok, "w1 w2 w3 w4 w5")


def test_text_that_encodes_to_nothing_is_refused(tmp_path):
    from aicf_run.text import encode, load_tokenizer
    tok = load_tokenizer(str(word_tokenizer(tmp_path / "tokenizer.json", bos=False)))
    with pytest.raises(RunError, match="encodes to no tokens"):
        encode(tok, "   ")


def test_without_the_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    from aicf_run.text import load_tokenizer
    path = word_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)   # import tokenizers -> ImportError
    with pytest.raises(RunError, match=r"pip install 'aicf\[text\]'"):
        load_tokenizer(str(path))


@pytest.mark.parametrize("config,stops", [
    (None, ()),
    ('{"eos_token_id": 2}', (2,)),
    ('{"eos_token_id": [2, 7]}', (2, 7)),
    ('{"bos_token_id": 1}', ()),
])
def test_a_model_folder_gives_its_eos_ids_as_stops(tmp_path, config, stops):
    from aicf_run.text import default_stops
    word_tokenizer(tmp_path / "tokenizer.json")
    if config is not None:
        (tmp_path / "generation_config.json").write_text(config)
    assert default_stops(str(tmp_path)) == stops
    assert default_stops(str(tmp_path / "tokenizer.json")) == ()   # the file alone: no folder to read


@pytest.mark.parametrize("config,message", [
    ("{oops", "not a generation config"),
    ("[1, 2]", "not a generation config"),
    ('{"eos_token_id": "x"}', "is not a token id"),
    ('{"eos_token_id": [2, -1]}', "is not a token id"),
])
def test_a_bad_generation_config_is_one_line(tmp_path, config, message):
    from aicf_run.text import default_stops
    (tmp_path / "generation_config.json").write_text(config)
    with pytest.raises(RunError) as err:
        default_stops(str(tmp_path))
    assert message in str(err.value) and "\n" not in str(err.value)
