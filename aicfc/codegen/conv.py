"""Schedule family `conv`: an `implicit_gemm` contraction (a convolution) as a tiled GEMM whose
operand tiles are gathered from the image on the fly (im2col never stored).

C[batch, m, n] = epilogue(sum_k A[m, k] · B[k, n]) with m = (n, oh, ow), n = the output channel
and k = (c, kh, kw), each flattened row-major (`properties.ImplicitGemm`). A tile loader splits
a flat m or k back into its variables by division and forms the lowered access from them; a
guarded access reads 0 in the padding ([Note: Lowered IR]). So the GEMM's ideas carry over
unchanged: block tiles through shared memory, a per-thread register tile (SIMT, fp32), or the
`gemm_mma` tensor-core template (fp16/bf16), which is rendered with the image operand staged by
synchronous gathered loads (`AicfGather`: a negative offset stands for the padding and reads 0)
and the filter operand, contiguous along k, by the same `cp.async` tile loader as any GEMM.

Parameter space: the `gemm` family's SIMT tiles; under fp16/bf16 also `gemm_mma`'s tiles
without split-k and, for a convolution of few input channels (C·KH·KW <= 64: an image network's
first layer), unit `stem` (`conv_stem`: tensor cores fed from an image patch in shared memory); on
sm_90a the Hopper engine's (`conv_wgmma`, unit `wgmma`) and, for 3x3 convolutions of 64 channels to
64, unit `taps` (`conv_taps`). A kernel that ends in the max pool over its convolution's
result (passes/pool_epilogue.py) has unit `pool` alone (`conv_pool`). Constraints: the planner's (threads,
shared memory, registers).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_band, conv_pool, conv_stem, conv_taps, conv_wgmma, gemm, gemm_mma
from aicfc.codegen.cexpr import Emitter, c_affine, flat_offset, guard_condition
from aicfc.codegen.common import CTYPES, decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load
from aicfc.ir.properties import ImplicitGemm, implicit_gemm
from aicfc.ir.types import ITEMSIZE, TensorType
from aicfc.planner.hardware import load_profile

GATHER = """#ifndef AICF_GATHER
#define AICF_GATHER
// A gathered operand element: offset -1 is the padding of a guarded access and reads 0.
template <typename T>
struct AicfGather {
  const T* p;
  __device__ __forceinline__ T operator[](long long i) const { return i < 0 ? T(0.0f) : p[i]; }
};
#endif
"""


def dims(k: Kernel) -> tuple[ImplicitGemm, int, int, int, list[tuple[str, int]]]:
    """(roles, M, N, K, batch variables with extents)."""
    op = k.ops[0]
    g = implicit_gemm(op)
    assert g is not None, f"kernel {k.name} is not an implicit GEMM"
    ext = op.extents()
    return (g, math.prod(ext[v] for v in g.m), math.prod(ext[v] for v in g.n), math.prod(op.reduce),
            [(v, ext[v]) for v in g.batch])


def mma_type(k: Kernel, types: Mapping[str, TensorType], precision: str) -> str | None:
    g = dims(k)[0]
    dts = {types[g.a.buffer].dtype, types[g.b.buffer].dtype}
    if dts == {"f16"} and precision == "fp16":
        return "f16"
    if dts == {"bf16"} and precision == "bf16":
        return "bf16"
    return None


def space(k: Kernel, plan: Plan) -> list[dict]:
    if conv_pool.is_pooled(k):
        hw = load_profile(plan.target)
        return conv_pool.space(k, plan, hw.sm_count, hw.smem_per_block_optin)
    dtype = mma_type(k, plan.types(), plan.precision)
    if not dtype:
        return gemm.simt_space(prefetched=False)
    _, m, n, kk, batch = dims(k)
    mma = [p for p in gemm_mma.space(dtype, m, n, kk, math.prod(e for _, e in batch)) if p["SPLITK"] == 1]
    mma += conv_stem.space(k, plan)
    wg = []
    if conv_wgmma.why_not(k, plan) is None:
        hw = load_profile(plan.target)
        wg = (conv_wgmma.space(k, plan, hw.sm_count, hw.smem_per_block_optin) + conv_taps.space(k, plan, hw.sm_count)
              + conv_band.space(k, plan, hw.sm_count, hw.smem_per_block_optin))
    return gemm.simt_space(prefetched=False) + mma + wg


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    if conv_pool.is_pooled(k):
        why = conv_pool.why_not(k, plan)
        return ([({"unit": "wgmma"}, "the kernel ends in a max pool, which only unit pool computes")]
                + ([({"unit": "pool"}, why)] if why else []))
    if mma_type(k, plan.types(), plan.precision):
        why, stem = conv_wgmma.why_not(k, plan), conv_stem.why_not(k, plan)
        return ([({"unit": "mma", "SPLITK": 2}, "split-k is not offered for implicit GEMM")]
                + ([({"unit": "wgmma"}, why)] if why and plan.target == conv_wgmma.TARGET else [])
                + ([({"unit": "stem"}, stem)] if stem else []))
    return [({"unit": "mma"}, f"--precision {plan.precision} does not allow tensor cores for this convolution "
             "(fp16/bf16 only)")]


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    _, m, n, _, batch = dims(k)
    nb = math.prod(e for _, e in batch)
    if p["unit"] == "wgmma":
        return (p["CTAS"], 1, 1), (conv_wgmma.threads(p), 1, 1), conv_wgmma.smem_bytes(p)
    if p["unit"] == "taps":
        return (p["CTAS"], 1, 1), (conv_taps.threads(p), 1, 1), conv_taps.smem_bytes(p)
    if p["unit"] == "band":
        return (p["CTAS"], 1, 1), (conv_band.threads(p), 1, 1), conv_band.smem_bytes(p)
    if p["unit"] == "stem":
        return conv_stem.launch(k, p)
    if p["unit"] == "pool":
        return (p["CTAS"], 1, 1), (conv_pool.threads(p), 1, 1), conv_pool.smem_bytes(p, conv_pool.window(k))
    if p["unit"] == "mma":
        tiles = math.ceil(m / p["BM"]) * math.ceil(n / p["BN"])
        return (tiles, 1, nb), (gemm_mma.threads(p), 1, 1), gemm_mma.smem_bytes(p)
    return (math.ceil(n / p["BN"]), math.ceil(m / p["BM"]), nb), (gemm.threads(p), 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    if p["unit"] == "wgmma":
        return conv_wgmma.static_smem(p)
    if p["unit"] == "taps":
        return conv_taps.static_smem(p)
    if p["unit"] == "band":
        return conv_band.static_smem(p)
    if p["unit"] == "stem":
        return conv_stem.static_smem(k, p)
    if p["unit"] == "pool":
        return conv_pool.static_smem(p)
    if p["unit"] == "mma":
        return 0
    return 4 * p["BK"] * (p["BM"] + 1 + p["BN"] + 1)


def tensor_maps(k: Kernel, p: Mapping, types: Mapping[str, TensorType]) -> list:
    """The TMA descriptors the schedule takes (codegen/tma.py): the Hopper engine's filter."""
    if p.get("unit") == "taps":
        return conv_taps.tensor_maps(k, p, types)
    if p.get("unit") == "band":
        return conv_band.tensor_maps(k, p, types)
    if p.get("unit") == "pool":
        return conv_pool.tensor_maps(k, p, types)
    return conv_wgmma.tensor_maps(k, p, types) if p.get("unit") == "wgmma" else []


def _split(k: Kernel, flat: str, variables: tuple[str, ...], idx: str) -> list[str]:
    ext = k.ops[0].extents()
    return decompose(flat, [(v, ext[v]) for v in variables], idx)


def _gather_lines(k: Kernel, ld: Load, flat: str, variables: tuple[str, ...], types: Mapping[str, TensorType],
                  params: Mapping[str, str], idx: str, as_offset: bool) -> list[str]:
    """Lines that split (flat, gk) into loop variables and return the element (SIMT: its value
    as float) or its offset (mma: -1 in the padding)."""
    op = k.ops[0]
    lines = _split(k, flat, variables, idx) + _split(k, "gk", op.reduce_vars, idx)
    names = {v: v for v in op.domain_vars + op.reduce_vars}
    if not as_offset:
        return lines + [f"return {Emitter(params, types).load(ld, names)};"]
    off = c_affine(flat_offset(ld.index, types[ld.buffer]), names)
    guard = guard_condition(ld, types[ld.buffer], names)
    return lines + [f"return {f'({guard}) ? ({idx})({off}) : ({idx})-1' if guard else off};"]


def _epilogue(k: Kernel, g: ImplicitGemm, types: Mapping[str, TensorType], params: Mapping[str, str],
              idx: str) -> list[str]:
    op = k.ops[0]
    names = {v: v for v in op.domain_vars}
    lines = _split(k, "gm", g.m, idx) + _split(k, "gn", g.n, idx)
    if len(k.ops) == 2:
        em = Emitter(params, types, prefix="v")
        value = em.emit(k.ops[1].body, names, {op.out: "accv"})
        return lines + em.take() + [store_line(k.ops[1], dict(k.binds[1]), value, params, names)]
    return lines + [store_line(op, {v: Affine.var(v) for v in op.domain_vars}, "accv", params, names)]


def _flat_filter(k: Kernel, g: ImplicitGemm, t: TensorType) -> Affine | None:
    """The filter's offset as one affine form in (gn, gk, batch) when it is contiguous along the
    flattened k and has one n variable (the usual [M, C, KH, KW] weight), else None."""
    op = k.ops[0]
    off = flat_offset(g.b.index, t)
    if len(g.n) != 1:
        return None
    step = 1
    for r, e in reversed(list(zip(op.reduce_vars, op.reduce))):
        if e > 1 and off.coeff(r) != step:
            return None
        step *= e
    coeffs = {v: c for v, c in off.terms if v not in op.reduce_vars and v != g.n[0]}
    return Affine.of({**coeffs, "gn": off.coeff(g.n[0]), "r0": 1}, off.const)


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    g, m, n, kk, batch = dims(k)
    sig = signature(k, types, p)
    idx = sig.index_type
    if p["unit"] == "pool":
        return conv_pool.render_kernel(k, p, types, name, dict(params=sig.params, idx=idx, signature=sig.text))
    nb = math.prod(e for _, e in batch)
    common = dict(name=name, M=m, N=n, K=kk, batch=nb, idx=idx, signature=sig.text,
                  decompose=decompose("batch", batch, idx), epilogue=_epilogue(k, g, types, sig.params, idx))
    if p["unit"] == "wgmma":
        return conv_wgmma.render_kernel(k, p, types, name, dict(common, params=sig.params))
    if p["unit"] == "taps":
        return conv_taps.render_kernel(k, p, types, name, dict(common, params=sig.params))
    if p["unit"] == "band":
        return conv_band.render_kernel(k, p, types, name, dict(common, params=sig.params))
    if p["unit"] == "stem":
        return conv_stem.render_kernel(k, p, types, name, dict(common, params=sig.params))
    if p["unit"] != "mma":
        return render("conv.cu.j2", threads=gemm.threads(p), **{x: p[x] for x in ("BM", "BN", "BK", "TM", "TN")},
                      m_vars=", ".join(g.m), n_vars=", ".join(g.n), k_vars=", ".join(k.ops[0].reduce_vars),
                      a_lines=_gather_lines(k, g.a, "gm", g.m, types, sig.params, idx, False),
                      b_lines=_gather_lines(k, g.b, "gn", g.n, types, sig.params, idx, False), **common)
    dtype = p["dtype"]
    ta, tb = types[g.a.buffer], types[g.b.buffer]
    esize = ITEMSIZE[ta.dtype]
    T = CTYPES[ta.dtype]
    threads = gemm_mma.threads(p)
    a = gemm_mma.Tile("a", p["BK"], p["BM"], True, 1, False, False, 0, 0, esize, threads)
    a_off = "[&]() -> {} {{ {} }}()".format(idx, " ".join(_gather_lines(k, g.a, "gm", g.m, types, sig.params, idx, True)))
    flat = _flat_filter(k, g, tb)
    if flat is not None:
        names = {v: v for v, _ in batch} | {"gn": "gn", "r0": "gk"}
        b = gemm_mma.tile("b", Load(g.b.buffer, (flat,)), TensorType(tb.dtype, (tb.numel,)), "gn", n, p, kk)
        b_ptr, b_off = sig.params[g.b.buffer], c_affine(flat, names)
    else:
        b = gemm_mma.Tile("b", p["BN"], p["BK"], False, 1, False, False, 0, 0, esize, threads)
        b_ptr = f"AicfGather<{T}>{{{sig.params[g.b.buffer]}}}"
        b_off = "[&]() -> {} {{ {} }}()".format(idx, " ".join(_gather_lines(k, g.b, "gn", g.n, types, sig.params,
                                                                           idx, True)))
    body = render("gemm_mma.cu.j2", dtype=dtype, shape_mnk=f"m16n8k{gemm_mma.KSTEP[dtype]}", T=T, esize=esize,
                  KSTEP=gemm_mma.KSTEP[dtype], BM=p["BM"], BN=p["BN"], BK=p["BK"], WM=p["WM"], WN=p["WN"],
                  STAGES=p["STAGES"], WTM=p["BM"] // p["WM"], WTN=p["BN"] // p["WN"], MI=p["BM"] // p["WM"] // 16,
                  NI=p["BN"] // p["WN"] // 8, threads=threads, GROUP=gemm_mma.GROUP,
                  tiles_m=math.ceil(m / p["BM"]), tiles_n=math.ceil(n / p["BN"]), a=a, b=b,
                  a_ptr=f"AicfGather<{T}>{{{sig.params[g.a.buffer]}}}", b_ptr=b_ptr, a_off=a_off, b_off=b_off,
                  paired=None, SPLITK=1, KT_PER=math.ceil(kk / p["BK"]), partials=None, tickets=None, ROT_D=None,
                  **common)
    return GATHER + body
