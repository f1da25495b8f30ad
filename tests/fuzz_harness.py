"""Fuzz targets for the two readers of untrusted files: `.aicf` bundles and ONNX models.

Each target mutates a valid seed (its bytes, or its decoded structure: msgpack maps and lists,
protobuf fields) and feeds the result to the code a user's file reaches. A run may succeed or
raise the project's own error (AicfError, RunError: one line, exit 2 in the CLIs); anything
else is a failure: another exception, a hang (over `TIME_LIMIT_S`), or unbounded memory (an
allocation past `MEMORY_LIMIT_BYTES` above what the process already uses fails with
MemoryError under RLIMIT_AS).

The same targets run two ways:
- tests/test_fuzz_*.py: a short, derandomized hypothesis run inside `make test`;
- `make fuzz` (`python3 -m tests.fuzz_harness --seconds N`): each target in its own process
  for N seconds, reporting executions and distinct failures, a failure being (exception type,
  innermost project frame). The reproducer of each is saved under `fuzz-out/<target>/`.

The bundle targets stop at what aicf-run does before its first CUDA call (read_bundle, the
inputs, the tensor-map records) plus `aicfc explain`, which reads bundles too; the ONNX targets
run `aicfc check`'s and `aicfc compile`'s path up to the schedule plan (no nvcc).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import onnx
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from aicf_run.bundle import FORMAT_VERSION, HEADER, MAGIC, read_bundle
from aicf_run.errors import RunError
from aicfc.errors import AicfError

TIME_LIMIT_S = 20
MEMORY_LIMIT_BYTES = 3 << 30
OUR_ERRORS = (AicfError, RunError)
ROOT = Path(__file__).resolve().parent.parent


class Hang(Exception):
    """Raised in the fuzzed code when it runs past TIME_LIMIT_S."""


@contextlib.contextmanager
def guard(seconds: float = TIME_LIMIT_S, memory: int = MEMORY_LIMIT_BYTES) -> Iterator[None]:
    """Bound one execution in time (SIGALRM) and address space (RLIMIT_AS above the current)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + memory if hard == resource.RLIM_INFINITY else min(used + memory, hard)

    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def call(check: Callable[[], None]) -> None:
    """Run one execution under `guard`; the project's errors are a pass, anything else raises."""
    try:
        with guard():
            check()
    except OUR_ERRORS as err:
        message = str(err)
        assert message and "\n" not in message, f"not one line: {message!r}"


# --- byte mutations -------------------------------------------------------------------------

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**63 - 1, 2**64 - 1]


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, start: int = 0) -> bytes:
    """`data` with 1-8 edits at or after `start`: flips, overwrites with boundary integers
    (msgpack and protobuf lengths), insertions, deletions, duplicated spans, truncation."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        if len(buf) <= start:
            break
        pos = draw(st.integers(start, len(buf) - 1))
        kind = draw(st.sampled_from(["flip", "byte", "int", "insert", "delete", "dup", "cut"]))
        if kind == "flip":
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            buf[pos] = draw(st.integers(0, 255))
        elif kind == "int":
            width = draw(st.sampled_from([1, 2, 4, 8]))
            value = draw(st.sampled_from(INTERESTING)) % (1 << 8 * width)
            order = draw(st.sampled_from(["big", "little"]))
            buf[pos:pos + width] = value.to_bytes(width, order)
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del buf[pos:pos + draw(st.integers(1, 64))]
        elif kind == "dup":
            span = bytes(buf[pos:pos + draw(st.integers(1, 64))])
            where = draw(st.integers(start, len(buf)))
            buf[where:where] = span
        else:
            del buf[pos:]
    return bytes(buf)


# --- msgpack structure mutations ------------------------------------------------------------

BOUNDARY_INTS = [0, 1, -1, 2, 3, 255, 256, 1023, 1024, 1025, 65535, 65536, 2**31 - 1, 2**31,
                 2**32 - 1, 2**32, 2**40, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, -(2**31)]
WORDS = ["", "a", "float32", "float16", "bfloat16", "int64", "bool", "arena", "weights", "sm_90",
         "sm_90a", "sm_80", "fp16", "f16", "f32", "add", "time_us", "0" * 64, "x", "y", "../x"]
leaves = st.one_of(
    st.none(), st.booleans(), st.sampled_from(BOUNDARY_INTS), st.integers(-(2**63), 2**64 - 1),
    st.floats(), st.sampled_from(WORDS), st.text(max_size=12), st.binary(max_size=32))
values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=6) | st.integers(-2, 2), inner,
                      max_size=4), max_leaves=8)


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _paths(value, prefix + (i,))


def _at(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def mutated_tree(draw: st.DrawFn, tree: Any) -> Any:
    """A deep copy of a decoded msgpack `tree` with 1-4 edits: values replaced (other types,
    boundary ints, nested containers), keys deleted or added, list items removed, repeated or
    multiplied (nested sizes), containers nested deeply."""
    tree = msgpack.unpackb(msgpack.packb(tree, use_bin_type=True), raw=False,
                           strict_map_key=False)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(list(_paths(tree))[1:]))
        parent, key = _at(tree, path[:-1]), path[-1]
        value = parent[key]
        kind = draw(st.sampled_from(["replace", "replace", "tweak", "delete", "add", "grow",
                                     "deep", "retype"]))
        if kind == "replace":
            parent[key] = draw(values)
        elif kind == "tweak" and isinstance(value, int) and not isinstance(value, bool):
            parent[key] = draw(st.sampled_from([value + 1, value - 1, -value, value * 2**20,
                                                value * 2**33, 0]))
        elif kind == "delete":
            del parent[key]
        elif kind == "add" and isinstance(value, dict):
            value[draw(st.sampled_from(WORDS) | st.integers(-1, 1))] = draw(values)
        elif kind == "grow" and isinstance(value, list) and value:
            # Nested sizes, bounded to about 1 MB packed so one execution stays fast.
            size = len(msgpack.packb(value[0], use_bin_type=True))
            count = draw(st.sampled_from([1, 2, 100, 10_000]))
            value.extend(value[:1] * max(1, min(count, (1 << 20) // size)))
        elif kind == "deep":
            parent[key] = _deep(draw(st.sampled_from([10, 100, 400])))
        elif kind == "retype":
            if isinstance(value, str):
                parent[key] = value.encode()
            elif isinstance(value, bytes):
                parent[key] = value.decode("latin-1")
            elif isinstance(value, int) and not isinstance(value, bool):
                parent[key] = float(value)
            elif isinstance(value, (list, dict)):
                parent[key] = list(value.values()) if isinstance(value, dict) else dict(enumerate(value))
    return tree


def pack_bundle(payload: Any, section: bytes = b"") -> bytes:
    """A bundle file's bytes with a correct header for `payload` (so the checks past the
    checksum are reached), followed by the weights section `section`."""
    data = msgpack.packb(payload, use_bin_type=True)
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(data), hashlib.sha256(data).digest()) + data + section


def split_bundle(raw: bytes) -> tuple[bytes, bytes]:
    """(payload, weights section) of a valid bundle file."""
    length = HEADER.unpack(raw[:HEADER.size])[3]
    return raw[HEADER.size:HEADER.size + length], raw[HEADER.size + length:]


def reseal(raw: bytes) -> bytes:
    """`raw` with its header's checksum recomputed over the payload the header's length names
    (clamped to the file), or over all that follows the header when the length is unreadable."""
    length = min(HEADER.unpack(raw[:HEADER.size])[3], len(raw) - HEADER.size)
    data = raw[HEADER.size:HEADER.size + length]
    return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(data), hashlib.sha256(data).digest()) + raw[HEADER.size + length:]


def check_bundle_bytes(raw: bytes, folder: Path) -> None:
    """Everything a bundle file reaches before the GPU: aicf-run's reading and inputs, the
    tensor-map records, and `aicfc explain` (text and --json)."""
    path = folder / "fuzz.aicf"
    path.write_bytes(raw)

    def run() -> None:
        from aicf_run import tensormap
        from aicf_run.inputs import check_inputs, random_inputs
        from aicfc.explain import explain_json, explain_text

        bundle = read_bundle(path)
        check_inputs(random_inputs(bundle), bundle)
        for kernel in bundle.kernels:
            for record in kernel.get("tensor_maps", ()):
                assert tensormap.problem(record) is None, tensormap.problem(record)
        json.dumps(explain_json(bundle.payload))
        explain_text(bundle.payload)
    call(run)


# --- protobuf (ONNX) mutations --------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
}
PROTO_INTS = [0, 1, -1, 2, 3, 7, 64, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, -(2**31), -(2**63),
              2**63 - 1]
PATHS = ["../outside.bin", "/etc/passwd", "weights.bin", "missing.bin", "sub/../../x", "",
         "weights.bin\0x", ".", "..", "a" * 300]


def _fields(msg: Any) -> Iterator[tuple[Any, Any, int | None]]:
    """Every (message, field, index) of a protobuf tree; index None for the whole field."""
    for fd in msg.DESCRIPTOR.fields:
        if fd.is_repeated:
            seq = getattr(msg, fd.name)
            yield msg, fd, None
            for i, item in enumerate(seq):
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    yield from _fields(item)
                else:
                    yield msg, fd, i
        else:
            yield msg, fd, None
            if fd.type == FieldDescriptor.TYPE_MESSAGE and msg.HasField(fd.name):
                yield from _fields(getattr(msg, fd.name))


def _scalar(draw: st.DrawFn, fd: Any, names: list[str]) -> Any:
    if fd.type in _INT_RANGES:
        low, high = _INT_RANGES[fd.type]
        return draw(st.sampled_from([v for v in PROTO_INTS if low <= v <= high])
                    | st.integers(low, high))
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return draw(st.sampled_from([v.number for v in fd.enum_type.values]))
    if fd.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return draw(st.floats(width=32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64))
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return draw(st.binary(max_size=64))
    return draw(st.sampled_from(names + PATHS) | st.text(max_size=12))


@st.composite
def mutated_model(draw: st.DrawFn, model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with 1-4 edits: any field (attributes, shapes, dtypes, names, so
    dangling inputs, opsets) set, cleared, repeated or removed; plus the edits a random walk
    rarely makes: huge or negative dims, external-data paths, a dangling node input."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    names = sorted({n for node in g.node for n in [*node.input, *node.output]}
                   | {t.name for t in g.initializer} | {"dangling"})
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["field", "field", "field", "dim", "external", "dangling"]))
        try:
            if kind == "dim":
                values_info = [*g.input, *g.output, *g.value_info]
                dims = [d for v in values_info for d in v.type.tensor_type.shape.dim]
                if dims:
                    draw(st.sampled_from(dims)).dim_value = draw(
                        st.sampled_from([0, -1, 2**31, 2**40, 2**62]))
            elif kind == "external" and len(g.initializer):
                tensor = draw(st.sampled_from(list(g.initializer)))
                tensor.data_location = onnx.TensorProto.EXTERNAL
                tensor.ClearField("raw_data")
                del tensor.external_data[:]
                for key, value in [("location", draw(st.sampled_from(PATHS))),
                                   ("offset", draw(st.sampled_from(["0", "-1", "8", "x", str(2**40)]))),
                                   ("length", draw(st.sampled_from(["4", "16", "-4", str(2**62)])))]:
                    if draw(st.booleans()) or key == "location":
                        entry = tensor.external_data.add()
                        entry.key, entry.value = key, value
            elif kind == "dangling" and len(g.node):
                node = draw(st.sampled_from(list(g.node)))
                node.input.append(draw(st.sampled_from(["dangling", ""] + names)))
            else:
                _edit_field(draw, model, names)
        except (ValueError, TypeError, OverflowError):
            pass   # protobuf refused the value (out of range for the field); keep the model
    return model


def _edit_field(draw: st.DrawFn, model: onnx.ModelProto, names: list[str]) -> None:
    msg, fd, index = draw(st.sampled_from(list(_fields(model))))
    if fd.is_repeated:
        seq = getattr(msg, fd.name)
        op = draw(st.sampled_from(["add", "remove", "set"] if len(seq) else ["add"]))
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if op == "remove":
                del seq[draw(st.integers(0, len(seq) - 1))]
            elif len(seq):
                seq.add().CopyFrom(seq[draw(st.integers(0, len(seq) - 1))])
            else:
                seq.add()
        elif op == "remove":
            del seq[draw(st.integers(0, len(seq) - 1))]
        elif op == "set" and index is not None:
            seq[index] = _scalar(draw, fd, names)
        else:
            seq.append(_scalar(draw, fd, names))
    elif fd.type == FieldDescriptor.TYPE_MESSAGE or draw(st.integers(0, 4)) == 0:
        msg.ClearField(fd.name)
    else:
        setattr(msg, fd.name, _scalar(draw, fd, names))


def check_model_bytes(raw: bytes, folder: Path, precision: str = "fp32") -> None:
    """`aicfc check` and `aicfc compile` up to the schedule plan, on a model file of `raw`."""
    path = folder / "model.onnx"
    path.write_bytes(raw)
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 4)

    def run() -> None:
        from aicfc.frontend.onnx_import import find_unsupported, import_model, load_model
        from aicfc.passes.pipeline import Options, run_pipeline
        from aicfc.planner.hardware import load_profile

        proto = load_model(path)
        if find_unsupported(proto):
            return
        graph = import_model(proto, {})
        run_pipeline(graph, Options("sm_90", load_profile("sm_90", None), precision))
    call(run)


# --- seeds ----------------------------------------------------------------------------------


def seed_models() -> dict[str, onnx.ModelProto]:
    """Small valid models covering the importer's paths: GEMM + GELU, norms, attention with
    shape arithmetic, convolution with BatchNorm folding, and a Reshape/Expand/Slice graph."""
    from tests import onnx_builders as ob
    return {
        "gelu": ob.gelu_bias_model((4, 32)),
        "layer_norm": ob.layer_norm_model((4, 32)),
        "attention": ob.attention_model(1, 2, 16, 8, causal=True),
        "bert_attention": ob.bert_attention_model(1, 8, 2, 8),
        "conv": ob.conv_model((1, 3, 8, 8), (4, 3, 3, 3), bn=True, act="relu"),
        "softmax": ob.decomposed_softmax_model((4, 16)),
    }


def seed_bundles(folder: Path) -> dict[str, bytes]:
    """Valid bundles: a hand-made one (tests/test_bundle_format.py) and two compiled with nvcc
    (fp32 GELU, fp16 attention), cached in `folder` for the process."""
    from aicfc.artifact import write_bundle
    from aicfc.driver import compile_model
    from tests.test_bundle_format import make_payload

    seeds = {"handmade": pack_bundle(make_payload(two_inputs=True))}
    models = seed_models()
    for name, precision in [("gelu", "fp32"), ("attention", "fp16")]:
        path = folder / f"{name}-{precision}.aicf"
        if not path.exists():
            payload = compile_model(models[name], precision=precision, check_registers=False, jobs=1)
            write_bundle(payload, path)
        seeds[f"{name}-{precision}"] = path.read_bytes()
    return seeds


# --- targets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    strategy: Callable[[], st.SearchStrategy]   # built lazily: seeds need nvcc and onnx
    check: Callable[[Any, Path], None]


def _bundle_bytes_strategy(seeds: dict[str, bytes]) -> st.SearchStrategy:
    def one(raw: bytes) -> st.SearchStrategy:
        # Half the time the header is resealed so the mutation reaches msgpack and the schema.
        return st.tuples(mutated_bytes(raw), st.booleans()).map(
            lambda pair: reseal(pair[0]) if pair[1] and len(pair[0]) >= HEADER.size else pair[0])
    return st.sampled_from(sorted(seeds)).flatmap(lambda k: one(seeds[k]))


def _bundle_tree_strategy(seeds: dict[str, bytes]) -> st.SearchStrategy:
    parts = {k: split_bundle(v) for k, v in seeds.items()}
    trees = {k: msgpack.unpackb(payload, raw=False) for k, (payload, _) in parts.items()}
    return st.sampled_from(sorted(trees)).flatmap(
        lambda k: mutated_tree(trees[k]).map(lambda tree: pack_bundle(tree, parts[k][1])))


def _model_bytes_strategy(models: dict[str, onnx.ModelProto]) -> st.SearchStrategy:
    raws = {k: m.SerializeToString() for k, m in models.items()}
    return st.sampled_from(sorted(raws)).flatmap(lambda k: mutated_bytes(raws[k]))


def _model_tree_strategy(models: dict[str, onnx.ModelProto]) -> st.SearchStrategy:
    return st.sampled_from(sorted(models)).flatmap(
        lambda k: mutated_model(models[k])).map(lambda m: m.SerializeToString())


def _cache_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"aicf-fuzz-seeds-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    return folder


def targets() -> dict[str, Target]:
    return {
        "bundle_bytes": Target("bundle_bytes", lambda: _bundle_bytes_strategy(seed_bundles(_cache_folder())),
                               check_bundle_bytes),
        "bundle_tree": Target("bundle_tree", lambda: _bundle_tree_strategy(seed_bundles(_cache_folder())),
                              check_bundle_bytes),
        "onnx_bytes": Target("onnx_bytes", lambda: _model_bytes_strategy(seed_models()), check_model_bytes),
        "onnx_tree": Target("onnx_tree", lambda: _model_tree_strategy(seed_models()), check_model_bytes),
    }


FUZZ_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


def failure_key(err: BaseException) -> str:
    """A failure class: the exception type and the innermost frame of the project's code."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "/aicfc/" in f.filename or "/aicf_run/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(err).__name__} at {where}"


def long_run(name: str, seconds: float, out: Path) -> dict[str, Any]:
    """Run target `name` for `seconds`; count executions and distinct failures, saving one
    reproducer (the mutated file) per failure class under `out`."""
    target = targets()[name]
    strategy = target.strategy()
    failures: dict[str, int] = {}
    executions = 0
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="aicf-fuzz-") as tmp:
        folder = Path(tmp)

        @settings(max_examples=500, phases=[Phase.generate], **FUZZ_SETTINGS)
        @given(strategy)
        def batch(raw: bytes) -> None:
            nonlocal executions
            if time.monotonic() > deadline:
                return
            executions += 1
            try:
                target.check(raw, folder)
            except Exception as err:   # noqa: BLE001: every other exception is a finding
                key = failure_key(err)
                if key not in failures:
                    out.mkdir(parents=True, exist_ok=True)
                    stem = hashlib.sha256(key.encode()).hexdigest()[:12]
                    (out / f"{stem}.bin").write_bytes(raw)
                    (out / f"{stem}.txt").write_text(
                        key + "\n" + "".join(traceback.format_exception(err)))
                failures[key] = failures.get(key, 0) + 1

        while time.monotonic() < deadline:
            batch()
    return {"target": name, "executions": executions, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="per target")
    parser.add_argument("--target", action="append", help="one target (repeatable); default all")
    parser.add_argument("--out", default="fuzz-out", help="folder for reproducers")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.target or list(targets())
    if args.child:
        print(json.dumps(long_run(names[0], args.seconds, Path(args.out) / names[0])), flush=True)
        return
    # Each target in its own process, so a hang inside C code (protobuf, msgpack) that SIGALRM
    # cannot interrupt is still caught, and reported, by the wall-clock limit.
    bad = 0
    for name in names:
        cmd = [sys.executable, "-m", "tests.fuzz_harness", "--child", "--target", name,
               "--seconds", str(args.seconds), "--out", args.out]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.seconds + 300)
            lines = proc.stdout.strip().splitlines()
            report = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "target": name, "executions": "?",
                "failures": {f"process exited {proc.returncode}: {proc.stderr.strip()[-300:]}": 1}}
        except subprocess.TimeoutExpired:
            report = {"target": name, "executions": "?", "failures": {"hang (whole process)": 1}}
        failures = report["failures"]
        bad += len(failures)
        print(f"{name}: {report['executions']} executions, {len(failures)} distinct failure(s)")
        for key, count in sorted(failures.items()):
            print(f"    {count:>6} x {key}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
