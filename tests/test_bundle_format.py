"""The `.aicf` bundle format: writer/reader round trip, header checks, schema checks.

No GPU is needed: the payload is synthetic (fake cubin bytes). `make_payload` and `raw_bundle`
are shared with test_run_cli.py.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np
import pytest

from aicf_run.bundle import (FORMAT_VERSION, HEADER, MAGIC, Bundle, read_bundle,
                             validate_payload)
from aicf_run.errors import RunError
from aicf_run.weights import inlined
from aicfc.artifact import read_bundle as reexported_read_bundle
from aicfc.artifact import write_bundle
from aicfc.errors import AicfError

WEIGHT = np.arange(6, dtype=np.float32).reshape(2, 3) / 4


def sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def make_payload(two_inputs: bool = False, smem_bytes: int = 0) -> dict[str, Any]:
    """A valid payload: y = x (+ b) + w by one fake "add" kernel over float32 [2, 3].

    Buffers: 0 x (arena), 1 y (arena), 2 w (weights), and 3 b (arena) with `two_inputs`.
    The fake GPU in test_run_cli.py runs the "add" symbol: last arg = sum of the others.
    """
    cubin = b"\x7fELF fake cubin for tests"
    source = 'extern "C" __global__ void add(float* a, float* b, float* out) {}'

    def buffer(buffer_id: int, name: str, region: str, offset: int) -> dict[str, Any]:
        return {"id": buffer_id, "name": name, "region": region, "offset": offset,
                "nbytes": 24, "dtype": "float32", "shape": [2, 3]}

    buffers = [buffer(0, "x", "arena", 0), buffer(1, "y", "arena", 256),
               buffer(2, "w", "weights", 0)]
    inputs = [{"name": "x", "dtype": "float32", "shape": [2, 3], "buffer": 0}]
    args = [0, 2, 1]
    if two_inputs:
        buffers.append(buffer(3, "b", "arena", 512))
        inputs.append({"name": "b", "dtype": "float32", "shape": [2, 3], "buffer": 3})
        args = [0, 3, 2, 1]
    return {
        "format_version": FORMAT_VERSION,
        "compiler": {"name": "aicfc", "version": "0.1.0"},
        "target": {"arch": "sm_90", "profile": {"name": "h100", "sms": 132}},
        "precision": "fp32",
        "model": {"name": "add", "source_sha256": sha("model")},
        "inputs": inputs,
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 3], "buffer": 1}],
        "buffers": buffers,
        "memory": {"arena_bytes": 768, "weights_bytes": 24, "intermediate_bytes": 0,
                   "inplace": []},
        "weights": [{"buffer": 2, "data": WEIGHT.tobytes(), "sha256": sha(WEIGHT.tobytes())}],
        "modules": [{"name": "m0", "arch": "sm_90", "cubin": cubin, "cubin_sha256": sha(cubin),
                     "source_sha256": sha(source), "source": source}],
        "kernels": [{
            "name": "add_0", "module": 0, "symbol": "add", "family": "pointwise",
            "params": {"vec": 1, "layout": "row"}, "grid": [1, 1, 1], "block": [6, 1, 1],
            "smem_bytes": smem_bytes, "registers": None, "args": args,
            "onnx_nodes": ["add_0"], "properties": ["elementwise"], "rewrites": [],
            "predicted": {"time_us": 1.5, "flops": 6, "bytes": 72},
            "candidates": [{"params": {"vec": 1}, "predicted_time_us": 1.5},
                           {"params": {"vec": 4}, "rejected_because": "6 % 4 != 0"}],
        }],
        "ir": {"high": "%0 = add(x, w)", "lowered": "k0", "decision": "fuse nothing"},
        "decisions": [{"kind": "schedule", "kernel": "add_0", "reason": "only candidate"}],
    }


def raw_bundle(path: Path, payload: Any = None, *, data: bytes | None = None,
               version: int = FORMAT_VERSION, flags: int = 0, length: int | None = None,
               digest: bytes | None = None) -> Path:
    """Write a bundle byte by byte, bypassing the writer's validation (to forge bad files)."""
    if data is None:
        data = msgpack.packb(payload, use_bin_type=True)
    header = HEADER.pack(MAGIC, version, flags, len(data) if length is None else length,
                         hashlib.sha256(data).digest() if digest is None else digest)
    path.write_bytes(header + data)
    return path


@pytest.fixture
def payload() -> dict[str, Any]:
    return make_payload()


# --- round trip and the writer ---


def test_round_trip(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tmp_path / "model.aicf"
    write_bundle(payload, path)
    bundle = read_bundle(path)
    assert isinstance(bundle, Bundle)
    assert inlined(bundle) == payload
    assert bundle.path == path
    assert bundle.arch == "sm_90"
    assert bundle.kernels[0]["grid"] == [1, 1, 1]
    # version 2: the weight is in the section after the payload, named by offset and length
    assert bundle.weights[0] == {"buffer": 2, "offset": 0, "nbytes": 24, "sha256": sha(WEIGHT.tobytes())}
    assert path.read_bytes()[-24:] == WEIGHT.tobytes()
    assert bundle.memory["arena_bytes"] == 768
    assert reexported_read_bundle is read_bundle
    assert os.listdir(tmp_path) == ["model.aicf"]


def test_header_layout(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tmp_path / "model.aicf"
    write_bundle(payload, path)
    raw = path.read_bytes()
    assert HEADER.size == 56
    magic, version, flags, length, digest = HEADER.unpack(raw[:56])
    assert (magic, version, flags) == (b"\x89AICF\r\n\x1a", 2, 0)
    assert length == len(raw) - 56 - WEIGHT.nbytes   # the weights section follows the payload
    assert digest == hashlib.sha256(raw[56:56 + length]).digest()
    on_disk = msgpack.unpackb(raw[56:56 + length], raw=False)
    assert on_disk == {**payload, "weights": [{"buffer": 2, "offset": 0, "nbytes": 24,
                                               "sha256": sha(WEIGHT.tobytes())}]}
    assert raw[56 + length:] == WEIGHT.tobytes()


def test_writer_accepts_tuples(tmp_path: Path, payload: dict[str, Any]) -> None:
    payload["kernels"][0]["grid"] = (1, 1, 1)
    write_bundle(payload, tmp_path / "model.aicf")
    assert read_bundle(tmp_path / "model.aicf").kernels[0]["grid"] == [1, 1, 1]


def test_writer_replaces_an_existing_file(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tmp_path / "model.aicf"
    path.write_bytes(b"old")
    write_bundle(payload, path)
    assert inlined(read_bundle(path)) == payload
    assert os.listdir(tmp_path) == ["model.aicf"]


def test_invalid_payload_writes_nothing(tmp_path: Path, payload: dict[str, Any]) -> None:
    payload["kernels"][0]["grid"] = [0, 1, 1]
    with pytest.raises(ValueError, match=r"kernels\[0\]\.grid"):
        write_bundle(payload, tmp_path / "model.aicf")
    assert os.listdir(tmp_path) == []


def test_invalid_payload_keeps_the_old_file(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tmp_path / "model.aicf"
    write_bundle(payload, path)
    before = path.read_bytes()
    del payload["ir"]
    with pytest.raises(ValueError, match="ir"):
        write_bundle(payload, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.aicf"]


def test_unpackable_payload_leaves_no_temp_file(tmp_path: Path,
                                                payload: dict[str, Any]) -> None:
    payload["decisions"][0]["bad"] = object()  # free-form, so only msgpack refuses it
    with pytest.raises(TypeError):
        write_bundle(payload, tmp_path / "model.aicf")
    assert os.listdir(tmp_path) == []


def test_missing_folder_is_an_aicf_error(tmp_path: Path, payload: dict[str, Any]) -> None:
    with pytest.raises(AicfError, match="cannot write bundle"):
        write_bundle(payload, tmp_path / "no" / "such" / "model.aicf")
    assert os.listdir(tmp_path) == []


# --- the reader's header checks ---


def _valid_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.aicf"
    write_bundle(make_payload(), path)
    return path


def test_truncated(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-10])   # into the weights section
    with pytest.raises(RunError, match=r"weights\[0\]: ends at byte 24 of the weights section, "
                                       r"which has 14"):
        read_bundle(path)
    path.write_bytes(raw[:-40])   # into the payload
    with pytest.raises(RunError, match=rf"truncated: header says {len(raw) - 56 - 24} payload "
                                       rf"bytes, file has {len(raw) - 96}; recompile it"):
        read_bundle(path)


def test_truncated_header(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    path.write_bytes(path.read_bytes()[:30])
    with pytest.raises(RunError, match="shorter than the 56-byte header"):
        read_bundle(path)


def test_trailing_bytes(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(RunError, match="fill 24 bytes of the 25-byte weights section"):
        read_bundle(path)
    v1 = raw_bundle(tmp_path / "v1.aicf", {**make_payload(), "format_version": 1}, version=1)
    v1.write_bytes(v1.read_bytes() + b"\0")
    with pytest.raises(RunError, match="1 bytes after the payload"):
        read_bundle(v1)


def test_checksum(tmp_path: Path) -> None:
    path = _valid_file(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(RunError, match="checksum mismatch.*the file is corrupt, recompile it"):
        read_bundle(path)


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n" + bytes(100), b"hello, world\n" * 9,
                                     b"\x89AB"], ids=["png", "text", "short"])
def test_foreign_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.aicf"
    path.write_bytes(content)
    with pytest.raises(RunError, match=r"is not an AICF bundle \(bad magic\); pass a file "
                                       r"written by `aicfc compile`"):
        read_bundle(path)


def test_empty(tmp_path: Path) -> None:
    (tmp_path / "model.aicf").write_bytes(b"")
    with pytest.raises(RunError, match="is empty"):
        read_bundle(tmp_path / "model.aicf")


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="cannot read bundle .*No such file"):
        read_bundle(tmp_path / "absent.aicf")
    with pytest.raises(RunError, match="not a regular file"):
        read_bundle(tmp_path)
    os.mkfifo(tmp_path / "pipe.aicf")  # must be refused, not block waiting for a writer
    with pytest.raises(RunError, match="not a regular file"):
        read_bundle(tmp_path / "pipe.aicf")


@pytest.mark.parametrize("forge_checksum", [False, True])
def test_wrong_version(tmp_path: Path, forge_checksum: bool) -> None:
    path = raw_bundle(tmp_path / "model.aicf", make_payload(), version=7,
                      digest=None if forge_checksum else bytes(32))
    with pytest.raises(RunError, match=r"format version 7 is not supported by this aicf-run "
                                       r"\(supports 1, 2, 3\)"):
        read_bundle(path)


def test_flags(tmp_path: Path) -> None:
    path = raw_bundle(tmp_path / "model.aicf", make_payload(), flags=4)
    with pytest.raises(RunError, match="flags"):
        read_bundle(path)


def test_huge_length_is_refused_before_reading(tmp_path: Path) -> None:
    path = raw_bundle(tmp_path / "model.aicf", make_payload(), length=2**63)
    with pytest.raises(RunError, match="over the 17179869184-byte limit"):
        read_bundle(path)


@pytest.mark.parametrize("data", [msgpack.packb([1, 2, 3]), msgpack.packb("text"),
                                  msgpack.packb(None)], ids=["list", "str", "nil"])
def test_payload_not_a_map(tmp_path: Path, data: bytes) -> None:
    path = raw_bundle(tmp_path / "model.aicf", data=data)
    with pytest.raises(RunError, match="not a map"):
        read_bundle(path)


@pytest.mark.parametrize("data", [b"\xc1", b"\x81\xa1x", msgpack.packb({}) + b"\x00",
                                  b"\x81\x91\x01\x01", b"\xa2\xff\xfe", b"\x91" * 5000],
                         ids=["reserved_byte", "cut_short", "extra_data", "list_as_key",
                              "bad_utf8", "too_deep"])
def test_payload_not_msgpack(tmp_path: Path, data: bytes) -> None:
    path = raw_bundle(tmp_path / "model.aicf", data=data)
    with pytest.raises(RunError, match="not valid msgpack|not a map"):
        read_bundle(path)


# --- the schema: each violation names its field ---


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation setting the field at a dotted path with [i] indices, e.g. "kernels[0].grid"."""
    def mutate(payload: dict) -> None:
        keys = [int(k) if k.isdigit() else k
                for k in path.replace("[", ".").replace("]", "").split(".")]
        target = payload
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return mutate


def _short_weight(payload: dict) -> None:
    data = payload["weights"][0]["data"][:-4]
    payload["weights"][0].update(data=data, sha256=sha(data))


SCHEMA_CASES: list[tuple[str, Callable[[dict], None], str]] = [
    ("bad_grid", _set("kernels[0].grid", [0, 1, 1]), "kernels[0].grid"),
    ("grid_not_three", _set("kernels[0].grid", [1, 1]), "kernels[0].grid"),
    ("grid_y_too_big", _set("kernels[0].grid", [1, 70000, 1]), "kernels[0].grid"),
    ("block_too_many_threads", _set("kernels[0].block", [1024, 2, 1]), "kernels[0].block"),
    ("arg_buffer_out_of_range", _set("kernels[0].args", [0, 9, 1]), "kernels[0].args[1]"),
    ("input_buffer_out_of_range", _set("inputs[0].buffer", 7), "inputs[0].buffer"),
    ("weight_length_mismatch", _short_weight, "weights[0].data"),
    ("weight_sha_mismatch", _set("weights[0].sha256", sha("other")), "weights[0].sha256"),
    ("cubin_sha_mismatch", _set("modules[0].cubin", b"\x7fELF other"), "modules[0].cubin_sha256"),
    ("missing_key", lambda p: p.pop("ir"), "field ir: is missing"),
    ("buffer_ids_out_of_order", _set("buffers[1].id", 2), "buffers[1].id"),
    ("buffer_past_arena", _set("buffers[1].offset", 760), "buffers[1]:"),
    ("nbytes_mismatch", _set("buffers[0].nbytes", 20), "buffers[0].nbytes"),
    ("bool_is_not_int", _set("kernels[0].smem_bytes", True), "kernels[0].smem_bytes"),
    ("module_index", _set("kernels[0].module", 1), "kernels[0].module"),
    ("weights_buffer_without_data", _set("weights", []), "buffers[2]"),
    ("input_in_weights_region", _set("inputs[0].buffer", 2), "inputs[0].buffer"),
    ("payload_version", _set("format_version", 1), "format_version"),
    ("bad_dtype", _set("buffers[0].dtype", "object"), "buffers[0].dtype"),
    ("bad_arch", _set("target.arch", "gfx90a"), "target.arch"),
    ("nvcc_not_a_str", _set("compiler.nvcc", 13), "compiler.nvcc"),
    ("bad_registers", _set("kernels[0].registers", "many"), "kernels[0].registers"),
    ("bad_param", _set("kernels[0].params.vec", 1.5), "kernels[0].params"),
    ("kernel_not_a_map", _set("kernels[0]", [1, 2]), "kernels[0]:"),
    ("kernels_not_a_list", _set("kernels", {"0": 1}), "kernels:"),
    ("duplicate_input_name", _set("outputs", [{"name": "y", "dtype": "float32", "shape": [2, 3],
                                               "buffer": 1}] * 2), "outputs[1].name"),
]


@pytest.mark.parametrize("mutate,field", [(m, f) for _, m, f in SCHEMA_CASES],
                         ids=[case_id for case_id, _, _ in SCHEMA_CASES])
def test_schema_violation(payload: dict[str, Any], mutate: Callable, field: str) -> None:
    mutate(payload)
    with pytest.raises(RunError) as info:
        validate_payload(payload)
    message = str(info.value)
    assert message.startswith("bad bundle field ") and field in message, message
    assert "\n" not in message


def test_schema_violation_through_the_reader(tmp_path: Path, payload: dict[str, Any]) -> None:
    payload["kernels"][0]["grid"] = [0, 1, 1]
    path = raw_bundle(tmp_path / "model.aicf", payload)
    with pytest.raises(RunError, match=r"model\.aicf: bad bundle field kernels\[0\]\.grid"):
        read_bundle(path)


def _junk(rng: random.Random) -> Any:
    return rng.choice([None, True, -1, 0, 2**70, 1.5, "", "sm_90", b"\x00", [], [1, 2, 3],
                       {}, {"a": 1}, {1: 2}, [[]], [{"x": None}]])


def _replace_random_field(value: Any, rng: random.Random) -> Any:
    """Walk down to a random container and replace one of its entries with junk."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        value[key] = _replace_random_field(value[key], rng)
        return value
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        value[i] = _replace_random_field(value[i], rng)
        return value
    return _junk(rng)


def test_fuzzed_payloads_raise_only_run_error() -> None:
    rng = random.Random(1234)
    base = make_payload(two_inputs=True)
    for _ in range(400):
        payload = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            payload = _replace_random_field(payload, rng)
        try:
            validate_payload(payload)
        except RunError as err:
            assert "\n" not in str(err)


def test_fuzzed_files_raise_only_run_error(tmp_path: Path) -> None:
    rng = random.Random(99)
    data = msgpack.packb(make_payload(), use_bin_type=True)
    path = tmp_path / "model.aicf"
    for _ in range(150):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        raw_bundle(path, data=bytes(corrupt))  # checksum forged to match the corruption
        try:
            read_bundle(path)
        except RunError as err:
            assert "\n" not in str(err)
