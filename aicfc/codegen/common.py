"""What every schedule family's codegen shares: kernel arguments, index decomposition, stores."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

import jinja2

from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import Affine, Compute
from aicfc.ir.types import TensorType

from aicfc.codegen.cexpr import c_affine, flat_offset
from aicfc.codegen.scratch import scratch


# C element type of each IR dtype. Loads convert to float and stores convert back, so f16/bf16
# are storage formats only: arithmetic in a kernel is fp32 (see passes/apply_precision.py).
CTYPES = {"f32": "float", "f16": "__half", "bf16": "__nv_bfloat16", "f64": "double",
          "i64": "long long", "i32": "int", "bool": "bool"}


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("aicfc", "templates"),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def render(template: str, **values) -> str:
    return environment().get_template(template).render(**values)


def kernel_args(k: Kernel, params: Mapping | None = None) -> tuple[str, ...]:
    """Buffers a kernel takes, in argument order: its stores, then what it loads from outside,
    then the scratch buffers its schedule (`params`, default the chosen one) needs, then the weights
    it requests into L2 for a later kernel (`k.prefetch`, passes/l2_fill.py)."""
    reads = dict.fromkeys(ld.buffer for ld in k.loads() if ld.buffer not in k.outs)
    args = (tuple(k.stores) + tuple(r for r in reads if r not in k.stores)
            + tuple(s.name for s in scratch(k, params)))
    return args + tuple(dict.fromkeys(f.buffer for f in k.prefetch if f.buffer not in args))


@dataclass(frozen=True)
class Signature:
    params: dict[str, str]   # buffer -> C parameter name
    text: str
    index_type: str          # "int" when every offset fits, else "long long"


def signature(k: Kernel, types: Mapping[str, TensorType], params: Mapping | None = None) -> Signature:
    extra = scratch(k, params)
    types = {**types, **{s.name: s.type for s in extra}}
    written = set(k.stores) | {s.name for s in extra}
    args = kernel_args(k, params)
    params = {b: f"p{i}" for i, b in enumerate(args)}
    # An in-place pair shares bytes, so neither pointer may promise __restrict__.
    shared = {name for ip in k.inplace for name in (ip.output, ip.reuses)}
    parts = [f"{'' if b in written else 'const '}{CTYPES[types[b].dtype]}*"
             f"{'' if b in shared else ' __restrict__'} {params[b]}" for b in args]
    # Every index a kernel forms is an element offset into one of its tensors (or a loop
    # counter bounded by one), never the product of a reduction's extents.
    biggest = max([types[b].numel for b in args] + [op.type.numel for op in k.ops] + [max(op.reduce, default=1) for op in k.ops])
    return Signature(params, ", ".join(parts), "int" if biggest < 2**31 - 1 else "long long")


def decompose(flat: str, variables: list[tuple[str, int]], idx: str) -> list[str]:
    """C lines splitting a flat index into row-major loop variables (extent-1 ones are 0)."""
    lines, rest = [], flat
    live = [(v, n) for v, n in variables if n > 1]
    for v, n in variables:
        if n == 1:
            lines.append(f"const {idx} {v} = 0;")
    for pos, (v, n) in enumerate(reversed(live)):
        if pos == len(live) - 1:
            lines.append(f"const {idx} {v} = {rest};")
        else:
            lines.append(f"const {idx} {v} = {rest} % {n};")
            nxt = f"q_{v}"
            lines.append(f"const {idx} {nxt} = {rest} / {n};")
            rest = nxt
    return lines


def element_offset(op: Compute, bind: Mapping[str, Affine]) -> Affine:
    """The flat offset of `op`'s own element in its output, its variables placed by `bind` (a
    kernel's binds: the op's variables in terms of the kernel's loop variables)."""
    return flat_offset(tuple(Affine.var(v).substitute(bind) for v in op.domain_vars), op.type)


def store_line(op: Compute, bind: Mapping[str, Affine], value: str, params: Mapping[str, str],
               names: Mapping[str, str]) -> str:
    """`p0[offset] = value;` for an op's own element, its variables placed by `bind`."""
    return f"{params[op.out]}[{c_affine(element_offset(op, bind), names)}] = {value};"
