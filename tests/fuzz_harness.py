"""Fuzz targets for the two readers of untrusted files: `.aicf` bundles and ONNX models.

Each target mutates a valid seed (its bytes, or its decoded structure: msgpack maps and lists,
protobuf fields; tests/fuzz_mutate.py) and feeds the result to the code a user's file reaches.
A run may succeed or raise the project's own error (AicfError, RunError: one line, exit 2 in the
CLIs); anything else is a failure: another exception, a hang (over `TIME_LIMIT_S`), or unbounded
memory (an allocation past `MEMORY_LIMIT_BYTES` above what the process already uses fails with
MemoryError under RLIMIT_AS).

The same targets run two ways:
- tests/test_fuzz_*.py: a short, derandomized hypothesis run inside `make test` (decisions
  drawn by hypothesis, so a failure shrinks);
- `make fuzz` (`python3 -m tests.fuzz_harness --seconds N [--execs M]`): each target in its own
  process, a plain loop over a seeded `random.Random` until N seconds or M executions,
  reporting executions and distinct failures, a failure being (exception type, innermost
  project frame). The reproducer of each is saved under `fuzz-out/<target>/`.
Why a plain loop for the long run: profiled with cProfile, hypothesis's engine and draws took
2-10 ms of each 3-13 ms execution (bundle_bytes: 8 of 15 s; bundle_tree: 12 of 17 s), so the
loop gets several times the executions from the same code under test.

The bundle targets stop at what aicf-run does before its first CUDA call (read_bundle, the
inputs, the tensor-map records) plus `aicfc explain`, which reads bundles too; the ONNX targets
run `aicfc check`'s and `aicfc compile`'s path up to the schedule and memory plan (no nvcc).
Two costs that are not the code under test are cut: files are written to /dev/shm where it
exists (a small write to this machine's /tmp took 3 ms, 20 us on tmpfs), and the planner's
ranking of a kernel is computed once per scheduling problem per process (`planner_memo`):
most mutants that reach the planner pose the seeds' problems again, and ranking them took
0.1-0.25 s each, which is the same dedupe plan_schedules does across a model's layers.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
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

from aicf_run.bundle import FORMAT_VERSION, HEADER, MAGIC, read_bundle
from aicf_run.errors import RunError
from aicfc.errors import AicfError
from tests.fuzz_mutate import Choices, DrawChoices, RandomChoices, mutated_bytes, mutated_model, mutated_tree

TIME_LIMIT_S = 20
MEMORY_LIMIT_BYTES = 3 << 30
OUR_ERRORS = (AicfError, RunError)
ROOT = Path(__file__).resolve().parent.parent

Mutator = Callable[[Choices], bytes]


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


def scratch_dir() -> Path:
    """Where executions write their files: tmpfs when there is one (see the module docstring)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


# --- bundles --------------------------------------------------------------------------------


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


def bundle_bytes_mutator(seeds: dict[str, bytes]) -> Mutator:
    names = sorted(seeds)

    def mutate(c: Choices) -> bytes:
        raw = mutated_bytes(c, seeds[c.choice(names)])
        # Half the time the header is resealed so the mutation reaches msgpack and the schema.
        return reseal(raw) if c.boolean() and len(raw) >= HEADER.size else raw
    return mutate


def bundle_tree_mutator(seeds: dict[str, bytes]) -> Mutator:
    parts = {k: split_bundle(v) for k, v in seeds.items()}
    trees = {k: msgpack.unpackb(payload, raw=False) for k, (payload, _) in parts.items()}
    names = sorted(trees)

    def mutate(c: Choices) -> bytes:
        name = c.choice(names)
        return pack_bundle(mutated_tree(c, trees[name]), parts[name][1])
    return mutate


# --- ONNX models ----------------------------------------------------------------------------

_RANKED: dict[Any, tuple[list, list]] = {}


@contextlib.contextmanager
def planner_memo() -> Iterator[None]:
    """plan_schedules's `rank` answered from this process's earlier answers where the scheduling
    problem is the same: `structure` (what rank reads of the kernel and its tensors' types, the
    key plan_schedules itself dedupes layers by) plus the plan's precision and target, the
    profile and the pinned keys (OPT_IN), the rest of what the families' spaces read. A problem not seen before, and every
    one that raised, runs the real `rank`. Restored on exit, so nothing else sees the memo."""
    from aicfc.passes import plan_schedules as ps
    real = ps.rank

    def rank(k: Any, plan: Any, hw: Any, pinned: frozenset[str] = frozenset()) -> tuple[list, list]:
        key = (ps.structure(k, plan.types()), plan.precision, plan.target, repr(sorted(hw.data.items())), pinned)
        if key not in _RANKED:
            _RANKED[key] = real(k, plan, hw, pinned)
        ranked, rejected = _RANKED[key]
        return list(ranked), list(rejected)
    ps.rank = rank
    try:
        yield
    finally:
        ps.rank = real


_PROFILES: dict[str, Any] = {}


def check_model_bytes(raw: bytes, folder: Path, precision: str = "fp32") -> None:
    """`aicfc check` and `aicfc compile` up to the schedule and memory plan, on a model file of
    `raw`; the folder holds a weights.bin for external-data mutants to find."""
    from aicfc.frontend.onnx_import import find_unsupported, import_model, load_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile

    path = folder / "model.onnx"
    path.write_bytes(raw)
    weights = folder / "weights.bin"
    if not weights.exists():
        weights.write_bytes(bytes(range(256)) * 4)
    hw = _PROFILES.setdefault("sm_90", load_profile("sm_90", None))

    def run() -> None:
        proto = load_model(path)
        if find_unsupported(proto):
            return
        graph = import_model(proto, {})
        with planner_memo():
            run_pipeline(graph, Options("sm_90", hw, precision))
    call(run)


def model_bytes_mutator(models: dict[str, onnx.ModelProto]) -> Mutator:
    raws = {k: m.SerializeToString() for k, m in models.items()}
    names = sorted(raws)
    return lambda c: mutated_bytes(c, raws[c.choice(names)])


def model_tree_mutator(models: dict[str, onnx.ModelProto]) -> Mutator:
    names = sorted(models)
    return lambda c: mutated_model(c, models[c.choice(names)]).SerializeToString()


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
    mutator: Callable[[], Mutator]   # built lazily: the bundle seeds need nvcc
    check: Callable[[bytes, Path], None]


def _cache_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / f"aicf-fuzz-seeds-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    return folder


def targets() -> dict[str, Target]:
    return {
        "bundle_bytes": Target("bundle_bytes", lambda: bundle_bytes_mutator(seed_bundles(_cache_folder())),
                               check_bundle_bytes),
        "bundle_tree": Target("bundle_tree", lambda: bundle_tree_mutator(seed_bundles(_cache_folder())),
                              check_bundle_bytes),
        "onnx_bytes": Target("onnx_bytes", lambda: model_bytes_mutator(seed_models()), check_model_bytes),
        "onnx_tree": Target("onnx_tree", lambda: model_tree_mutator(seed_models()), check_model_bytes),
    }


def hypothesis_run(mutate: Mutator, check: Callable[[bytes, Path], None], examples: int,
                   folder: Path) -> None:
    """The short in-suite run: `examples` derandomized hypothesis examples of one target."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data: Any) -> None:
        check(mutate(DrawChoices(data)), folder)
    one()


def failure_key(err: BaseException) -> str:
    """A failure class: the exception type and the innermost frame of the project's code."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "/aicfc/" in f.filename or "/aicf_run/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(err).__name__} at {where}"


def long_run(name: str, seconds: float, out: Path, execs: int | None = None,
             seed: int = 0) -> dict[str, Any]:
    """Run target `name` for `seconds` or `execs` executions, whichever ends first; count
    executions and distinct failures, saving one reproducer (the mutated file) per failure
    class under `out`. Execution i mutates with `random.Random(f"{seed}:{i}")`, so any one
    can be made again alone."""
    target = targets()[name]
    mutate = target.mutator()
    failures: dict[str, int] = {}
    executions = 0
    started = time.monotonic()
    deadline = started + seconds
    with tempfile.TemporaryDirectory(prefix="aicf-fuzz-", dir=scratch_dir()) as tmp:
        folder = Path(tmp)
        while time.monotonic() < deadline and (execs is None or executions < execs):
            raw = mutate(RandomChoices(random.Random(f"{seed}:{executions}")))
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
                        f"{key}\nexecution {executions - 1} of seed {seed}\n"
                        + "".join(traceback.format_exception(err)))
                failures[key] = failures.get(key, 0) + 1
    return {"target": name, "executions": executions, "failures": failures,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="per target")
    parser.add_argument("--execs", type=int, default=None, help="per target: stop after this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", action="append", help="one target (repeatable); default all")
    parser.add_argument("--out", default="fuzz-out", help="folder for reproducers")
    parser.add_argument("--report", default=None, help="also write the report here (default OUT/report.txt)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.target or list(targets())
    if args.child:
        report = long_run(names[0], args.seconds, Path(args.out) / names[0], args.execs, args.seed)
        print(json.dumps(report), flush=True)
        return
    report_path = Path(args.report or Path(args.out) / "report.txt")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text("")

    def say(line: str) -> None:
        print(line, flush=True)
        with report_path.open("a") as f:
            f.write(line + "\n")
    say(f"# make fuzz: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, seed {args.seed}, "
        f"limit {args.seconds:g} s" + (f" or {args.execs} executions" if args.execs else "")
        + " per target")
    # Each target in its own process, so a hang inside C code (protobuf, msgpack) that SIGALRM
    # cannot interrupt is still caught, and reported, by the wall-clock limit.
    bad = 0
    for name in names:
        cmd = [sys.executable, "-m", "tests.fuzz_harness", "--child", "--target", name,
               "--seconds", str(args.seconds), "--out", args.out, "--seed", str(args.seed)]
        if args.execs:
            cmd += ["--execs", str(args.execs)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.seconds + 300)
            lines = proc.stdout.strip().splitlines()
            report = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "target": name, "executions": "?", "seconds": "?",
                "failures": {f"process exited {proc.returncode}: {proc.stderr.strip()[-300:]}": 1}}
        except subprocess.TimeoutExpired:
            report = {"target": name, "executions": "?", "seconds": "?",
                      "failures": {"hang (whole process)": 1}}
        failures = report["failures"]
        bad += len(failures)
        say(f"{name}: {report['executions']} executions in {report['seconds']} s, "
            f"{len(failures)} distinct failure(s)")
        for key, count in sorted(failures.items()):
            say(f"    {count:>6} x {key}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
