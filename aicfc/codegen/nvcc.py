"""Build one CUDA module to a cubin with nvcc, behind a content-hash cache.

The cache key is the SHA-256 of the source, the target, the flags and nvcc's version, so an
unchanged model recompiles without running nvcc. Register counts come from ptxas's own
resource report (`-Xptxas -v`) and are cached with the cubin.

A kernel that uses an architecture-specific feature (Hopper's wgmma needs `sm_90a`) says so in
a line `// aicf: needs sm_90a` of its source; a module holding one is built for that target
when it is the plain target's own (sm_90 -> sm_90a), and such a cubin runs on that GPU only.
Modules without the line build for the plain target, as before.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aicfc.errors import AicfError

FLAGS = ("-O3", "-std=c++17", "-Xptxas", "-v")
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
    cubin_path, meta_path = folder / f"{key}.cubin", folder / f"{key}.json"
    if cubin_path.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            return Built(cubin_path.read_bytes(), meta["registers"], meta["spills"], True)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is rebuilt
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
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp_path = cubin_path.with_suffix(".tmp")
        tmp_path.write_bytes(cubin)
        os.replace(tmp_path, cubin_path)
        meta_path.write_text(json.dumps({"registers": regs, "spills": spills}))
    except OSError:
        pass  # caching is an optimization; a read-only home still compiles
    return Built(cubin, regs, spills, False)
