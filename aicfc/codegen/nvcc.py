"""Build one CUDA module to a cubin with nvcc, behind a content-hash cache.

The cache key is the SHA-256 of the source, the target, the flags and nvcc's version, so an
unchanged model recompiles without running nvcc. Register counts come from ptxas's own
resource report (`-Xptxas -v`) and are cached with the cubin.

[Note: cubin cache entry] One file per key, `<key>.entry`: a 4-byte little-endian length, a
JSON header {registers, spills, size, sha256} and the cubin. Several `aicfc compile`
processes may share the cache, and any may be killed at any point, so an entry is written to
a temporary file of a unique name in the cache folder and renamed over `<key>.entry`
(os.replace, atomic within a filesystem): a reader sees no entry or a whole one. A reader
still verifies the cubin's size and SHA-256 against the header (a disk error, or a hand-edited
file) and rebuilds an entry that fails, never loading it. Two processes building the same key
both run nvcc; the last rename wins, and either entry is whole.

A kernel that uses an architecture-specific feature (Hopper's wgmma needs `sm_90a`) says so in
a line `// aicf: needs sm_90a` of its source; a module holding one is built for that target
when it is the plain target's own (sm_90 -> sm_90a), and such a cubin runs on that GPU only.
Modules without the line build for the plain target, as before.

`AICF_NVCC_LINEINFO=1` adds `-lineinfo` (a new cache key): compute-sanitizer and Nsight then name the
line of the module's source (the bundle keeps each module's source) behind a report; the SASS is unchanged.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aicfc.errors import AicfError

FLAGS = ("-O3", "-std=c++17", "-Xptxas", "-v") + (("-lineinfo",) if os.environ.get("AICF_NVCC_LINEINFO") == "1" else ())
NEEDS = re.compile(r"^// aicf: needs (sm_\d+a)$", re.MULTILINE)


@dataclass(frozen=True)
class Built:
    cubin: bytes
    registers: dict[str, int]
    spills: dict[str, int]
    cached: bool


def cache_dir() -> Path:
    root = os.environ.get("AICF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "aicf")
    return Path(root) / "cubin"


@functools.cache
def nvcc_path() -> str:
    found = os.environ.get("AICF_NVCC") or shutil.which("nvcc")
    if not found:
        for guess in ("/usr/local/cuda/bin/nvcc",):
            if os.path.exists(guess):
                return guess
        raise AicfError("nvcc not found; install the CUDA toolkit or set AICF_NVCC to nvcc's path")
    return found


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def _resources(log: str) -> tuple[dict[str, int], dict[str, int]]:
    regs, spills, current = {}, {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and current:
            spills[current] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            regs[current] = int(m.group(1))
    return regs, spills


def effective_arch(source: str, arch: str) -> str:
    """`arch`, or its architecture-specific variant (sm_90 -> sm_90a) where the source needs it."""
    needed = set(NEEDS.findall(source))
    return f"{arch}a" if f"{arch}a" in needed else arch


def build(source: str, arch: str) -> Built:
    arch = effective_arch(source, arch)
    key = hashlib.sha256("\0".join([source, arch, nvcc_version(), *FLAGS]).encode()).hexdigest()
    folder = cache_dir()
    entry = folder / f"{key}.entry"
    cached = read_entry(entry)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="aicf-nvcc-") as tmp:
        src, out = Path(tmp) / "module.cu", Path(tmp) / "module.cubin"
        src.write_text(source)
        cmd = [nvcc_path(), "-cubin", f"-arch={arch}", *FLAGS, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise AicfError("nvcc took over 10 minutes; the model is too large for one module") from None
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise AicfError(f"nvcc failed on the generated module (a compiler bug; please report it): {first}")
        cubin = out.read_bytes()
    regs, spills = _resources(proc.stderr)
    write_entry(entry, cubin, regs, spills)
    return Built(cubin, regs, spills, False)


_LENGTH = struct.Struct("<I")


def read_entry(path: Path) -> Built | None:
    """The cached build at `path`, or None when it is missing or fails verification
    ([Note: cubin cache entry])."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        (n,) = _LENGTH.unpack_from(data)
        header = json.loads(data[_LENGTH.size:_LENGTH.size + n])
        cubin = data[_LENGTH.size + n:]
        if (len(cubin) != header["size"] or hashlib.sha256(cubin).hexdigest() != header["sha256"]
                or not isinstance(header["registers"], dict) or not isinstance(header["spills"], dict)):
            return None
        return Built(cubin, header["registers"], header["spills"], True)
    except (struct.error, ValueError, TypeError, KeyError):
        return None


def write_entry(path: Path, cubin: bytes, regs: dict[str, int], spills: dict[str, int]) -> None:
    """Store a build at `path` atomically ([Note: cubin cache entry]); best effort, since
    caching is an optimization (a read-only cache folder still compiles)."""
    header = json.dumps({"registers": regs, "spills": spills, "size": len(cubin),
                         "sha256": hashlib.sha256(cubin).hexdigest()}).encode()
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "xb") as f:
            f.write(_LENGTH.pack(len(header)) + header + cubin)
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)
    except BaseException:   # interrupted (Ctrl-C): leave no temporary file behind
        temp.unlink(missing_ok=True)
        raise
