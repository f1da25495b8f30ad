"""Interface casts: the kernels that convert a bundle's inputs and outputs on the GPU.

Under `--precision fp16|bf16` every float tensor is stored in half precision while the bundle's
interface stays float32 (passes/apply_precision.py). The conversion between them is part of the
compiled program, not something the runtime improvises: the compiler emits one grid-stride cast
kernel per (from, to) pair into a module of its own, `<model>_io`, and records on each converted
input and output which kernel converts it and with what grid and block (docs/bundle-format.md,
`cast`). aicf-run launches it on the caller's device tensor or on its own staging buffer, so a
converted tensor never makes a host round trip. Rounding is to nearest even, as numpy's astype
and aicf_run.convert's host path do.
"""
from __future__ import annotations

from dataclasses import dataclass

from aicfc.codegen.common import render
from aicfc.codegen.module import ModuleBuild
from aicfc.codegen.nvcc import build

THREADS = 256
# Enough blocks to fill any current GPU several times over; the loop strides past the rest.
MAX_BLOCKS = 8192
# (from, to) bundle dtypes -> (C source type, C destination type, conversion)
CASTS = {
    ("float32", "float16"): ("float", "__half", "__float2half_rn"),
    ("float32", "bfloat16"): ("float", "__nv_bfloat16", "__float2bfloat16_rn"),
    ("float16", "float32"): ("__half", "float", "__half2float"),
    ("bfloat16", "float32"): ("__nv_bfloat16", "float", "__bfloat162float"),
}


@dataclass(frozen=True)
class Converted:
    """One interface tensor whose host dtype differs from its storage."""

    name: str
    host: str        # the interface dtype (bundle name)
    storage: str     # the buffer's dtype (bundle name)
    numel: int
    is_input: bool

    @property
    def pair(self) -> tuple[str, str]:
        return (self.host, self.storage) if self.is_input else (self.storage, self.host)


def symbol(pair: tuple[str, str]) -> str:
    return f"aicf_cast_{pair[0]}_to_{pair[1]}"


def launch(numel: int) -> tuple[list[int], list[int]]:
    """(grid, block) of a cast over `numel` elements: one element per thread, up to MAX_BLOCKS."""
    blocks = min(max(1, -(-numel // THREADS)), MAX_BLOCKS)
    return [blocks, 1, 1], [THREADS, 1, 1]


def render_casts(model: str, precision: str, pairs: list[tuple[str, str]]) -> str:
    kernels = [{"symbol": symbol(p), "src": CASTS[p][0], "dst": CASTS[p][1], "convert": CASTS[p][2]}
               for p in pairs]
    return render("io_cast.cu.j2", model=model, precision=precision, kernels=kernels, threads=THREADS)


def build_casts(model: str, precision: str, target: str, tensors: list[Converted],
                module_index: int) -> tuple[ModuleBuild | None, dict[str, dict]]:
    """The cast module (None when nothing is converted) and {tensor name: its `cast` record}.

    Empty tensors get no record: there is nothing to convert.
    """
    tensors = [t for t in tensors if t.numel > 0]
    if not tensors:
        return None, {}
    pairs = sorted({t.pair for t in tensors})
    source = render_casts(model, precision, pairs)
    built = build(source, target)
    module = ModuleBuild(f"{model}_io", source, built, tuple(symbol(p) for p in pairs))
    records = {}
    for t in tensors:
        grid, block = launch(t.numel)
        records[t.name] = {"module": module_index, "symbol": symbol(t.pair), "grid": grid, "block": block}
    return module, records
