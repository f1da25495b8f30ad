"""Prototype (issue 19, session 61): the decode step's split attention and the O projection after it as
one kernel of two block roles, made by rewriting a compiled bundle's decode plan (not by the compiler).

    python3 benchmarks/prototypes/fuse_attention_o.py BASE.aicf OUT.aicf [--blocks 128]

The question it answers: does the O projection's boundary after the attention, and its weight read after
the attention's output exists, cost the chain the ~1.2 us a layer the 2-layer timelines suggest (the
attention's done to the O's go 0.4 us, the O's go to its done 1.8 us, mostly its slice from L2)?

Each (split attention, K-major O gemv) pair of the decode plan becomes one launch:
- blocks 0 .. A-1 run the attention's body as compiled (a device function now), then publish: every
  thread's stores fenced, one atomic add on a counter of the module's own (`fuse_count`, zero at load);
- the next `--blocks` blocks are the O: each takes O / blocks whole columns of the K-major weight (its rows
  contiguous) into shared memory with cp.async and triggers the next kernel's launch at its entry (the O's
  TF = 1 as before), requests the gate/up head into L2 as the O did, reads its epilogue's residual, then
  waits until the counter says every attention block has published (acquire), reads the attention's
  output past L1 (`ld.global.cg`), and adds each column's k-rows in the order the O gemv's warps did
  (lane l: vectors l, 32 + l, ... 224 + l, then a butterfly over the lanes), so the outputs are the same
  bits; the last O block to finish puts the counter back to zero for the next replay;
- a few idle blocks round the grid up to the attention's cluster size.

Status (session 61): built and compiled here (96 registers, no spill, for both block counts), not run: no GPU was
lent that session. Session 62 (no GPU either) put the same launch into the compiler, `aicfc compile --pin joino=1`
(passes/join_launches.py, codegen/join.py; its role blocks also wait for the launch before, griddepcontrol.wait, before
their epilogue reads and the counter); `bash benchmarks/join_round.sh ab` times this rewrite beside it. The A/B to run (one call, about 5 minutes), the same tokens expected (the O's adds are in the
O gemv's order):

    python3 benchmarks/decode_ab.py --layers 4 --compile-only --folder /tmp/ab --variant base:
    python3 benchmarks/prototypes/fuse_attention_o.py /tmp/ab/base.aicf /tmp/ab/f128.aicf --blocks 128
    python3 benchmarks/prototypes/fuse_attention_o.py /tmp/ab/base.aicf /tmp/ab/f64.aicf --blocks 64
    python3 benchmarks/decode_ab.py --layers 4 --rounds 9 --folder /tmp/ab \
        --bundle base=/tmp/ab/base.aicf --bundle f128=/tmp/ab/f128.aicf --bundle f64=/tmp/ab/f64.aicf

(`--gate` and `--no-fill` are two more forms to time beside them.) Where the chain should be seen, the same on a
2-layer `--timeline` build (the attention blocks stamp as before, the O blocks do not; the gate/up's go says when
the O's outputs were complete):

    python3 benchmarks/decode_ab.py --layers 2 --compile-only --timeline --folder /tmp/tl --variant base:
    python3 benchmarks/prototypes/fuse_attention_o.py /tmp/tl/base.aicf /tmp/tl/f128.aicf
    python3 benchmarks/decode_ab.py --layers 2 --rounds 3 --folder /tmp/tl --timeline --timeline-busy \
        --bundle base=/tmp/tl/base.aicf --bundle f128=/tmp/tl/f128.aicf
 Then the 20-layer step of the faster one against
the bandwidth limit and the peer (`generate.py` rewritten bundle in place, loaded with `--reuse`):

    python3 benchmarks/generate.py --batch 1 --compile-only
    python3 benchmarks/prototypes/fuse_attention_o.py /tmp/aicf-gen/model_b1.aicf /tmp/aicf-gen/model_b1.aicf
    python3 benchmarks/generate.py --batch 1 --reuse

Do not `--profile` a rewritten bundle: there one fused kernel follows itself, and the next launch's O blocks (which
trigger at their entry) may land and read the counter before this launch's last O block has put it back to zero. In
a plan a fused kernel follows itself only a whole step later, each layer's pair with a counter of its own module.

Only the O form the 1 B Llama's plan has is handled (K = 2048, BN 4, U 4, one warp a column, KS 1); any
other is refused. Every block needs the attention's shared memory, so all of them land only where the
QKV's blocks have left, as the attention's do now.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicf_run.bundle import HEADER  # noqa: E402
from aicfc.codegen.nvcc import build  # noqa: E402

SIG = re.compile(r'extern "C" __global__ void ((?:__\w+__\([^)]*\) )*)(\w+)\(([^)]*)\) \{')


def function(source: str, symbol: str) -> tuple[int, int, re.Match]:
    """(start, end) of kernel `symbol`'s text in `source` (its closing brace at column 0) and its signature."""
    for m in SIG.finditer(source):
        if m.group(2) == symbol:
            end = source.index("\n}\n", m.end()) + 3
            return m.start(), end, m
    raise SystemExit(f"kernel {symbol} not found in its module")


def helpers(source: str) -> str:
    """The module's text without its kernels: the prelude and helper blocks they share."""
    out, at = [], 0
    for m in SIG.finditer(source):
        out.append(source[at:m.start()])
        at = source.index("\n}\n", m.end()) + 3
    out.append(source[at:])
    return "".join(out)


def names(params: str) -> list[str]:
    return [p.strip().split()[-1] for p in params.split(",")]


def renamed(params: str, prefix: str) -> str:
    return ", ".join(" ".join(p.strip().split()[:-1] + [prefix + p.strip().split()[-1]]) for p in params.split(","))


def o_body(o_src: str, sym: str, params: str, j: int, blocks: int, n_attn: int, gate: bool,
           fill_next: bool) -> tuple[int, str]:
    """The O role as a device function of the O kernel's own parameters and the block's index among the O's, and
    the columns a block takes."""
    for need in ("k_hi = min(2048", "p2 + (2048 * gn + gk)", "p1 + (2048 * gm + gk)", "const int vv = 128 + u * 32 + lane", "aicf_gemv_unpack(cur[u], w, __half())"):
        if need not in o_src:
            raise SystemExit(f"{sym}: not the O form this prototype handles ({need!r} missing)")
    n = int(re.search(r"if \(gn < (\d+)\) \{", o_src).group(1))
    if n % blocks or (n // blocks) % 8:
        raise SystemExit(f"{sym}: {n} columns over {blocks} blocks is not whole groups of 8")
    cols = n // blocks
    # the epilogue's residual: a gathered row (layer 0) or the residual stream read before the wait
    if m := re.search(r"const float v0 = static_cast<float>\((.*)\);\n", o_src):
        v0 = m.group(1)
        v2 = re.search(r"const float v2 = static_cast<float>\((.*)\);\n", o_src).group(1)
        residual = f"r0 = static_cast<float>({v0}); r1 = static_cast<float>({v2});"
    else:
        e = re.search(r"epre0 = (.*);\n", o_src).group(1)
        residual = f"{{ const __half2 e = {e}; r0 = __low2float(e); r1 = __high2float(e); }}"
    wait_tiles = ""
    if gate:   # the weight requests wait until every attention block's first tile has landed (or it has none)
        wait_tiles = f"""  if (tid == 0) {{
    unsigned v;
    do {{ asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(&fuse_count[{j}][2]) : "memory"); }} while (v < {n_attn}u);
  }}
  __syncthreads();
"""
    fill = ""
    if fill_next and (m := re.search(r"  // \[Note: L2 fill\]: this block's share.*?\n(  if \(tid == 0\) \{.*?\n  \}\n)", o_src, re.S)):
        fill = (m.group(1)
                .replace("blockIdx.x + (unsigned long long)blockIdx.y * gridDim.x", "(unsigned long long)ob")
                .replace("(unsigned long long)gridDim.x * gridDim.y", f"(unsigned long long){blocks}"))
    pairs = cols // 2
    return cols, f"""
__device__ __forceinline__ void fo_unpack(const uint4& v, float (&f)[8]) {{
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {{ const float2 t = __half22float2(h[q]); f[2 * q] = t.x; f[2 * q + 1] = t.y; }}
}}
__device__ __forceinline__ void {sym}_o({params}, const int ob) {{
  extern __shared__ __align__(128) unsigned char aicf_smem[];
  aicf_pdl_trigger();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = ob * {cols};
  float* red = reinterpret_cast<float*>(aicf_smem + {cols * 4096});
  const unsigned sw = (unsigned)__cvta_generic_to_shared(aicf_smem);
  const char* wsrc = reinterpret_cast<const char*>(p2 + (long long)n0 * 2048);
{wait_tiles}  for (int c = tid; c < {cols * 256}; c += 128)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sw + c * 16), "l"(wsrc + (long long)c * 16) : "memory");
  asm volatile("cp.async.commit_group;" ::: "memory");
{fill}  float r0 = 0.0f, r1 = 0.0f;
  if (tid < {pairs}) {{
    const int gn = n0 + 2 * tid, gn1 = gn + 1;
    (void)gn1;
    {residual}
  }}
  if (tid == 0) {{
    unsigned v;
    do {{ asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(&fuse_count[{j}][0]) : "memory"); }} while (v < {n_attn}u);
  }}
  __syncthreads();
  uint4 xv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) xv[e] = __ldcg(reinterpret_cast<const uint4*>(p1 + ((e >> 2) * 128 + (e & 3) * 32 + lane) * 8));
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
#pragma unroll 1
  for (int j = 0; j < {cols // 4}; ++j) {{
    const int c = warp * {cols // 4} + j;
    float acc = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {{
      const int vv = (e >> 2) * 128 + (e & 3) * 32 + lane;
      float w[8], x[8];
      fo_unpack(*reinterpret_cast<const uint4*>(aicf_smem + (c * 2048 + vv * 8) * 2), w);
      fo_unpack(xv[e], x);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc = fmaf(w[q], x[q], acc);
    }}
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) red[c] = acc;
  }}
  __syncthreads();
  if (tid < {pairs}) {{
    const int c = 2 * tid;
    *reinterpret_cast<__half2*>(p0 + (n0 + c)) = __floats2half2_rn(r0 + red[c], r1 + red[c + 1]);
  }}
  if (tid == 0 && atomicAdd(&fuse_count[{j}][1], 1u) == {blocks - 1}u) {{ fuse_count[{j}][0] = 0u; fuse_count[{j}][1] = 0u; fuse_count[{j}][2] = 0u; }}
}}
"""


def gated(attn: str) -> str:
    """The attention body counting, once a block, that its first tile has landed (or that it has no tile)."""
    loop = "#pragma unroll 1\n  for (int jt = 0; jt < n_tiles; ++jt) {"
    landed = "    // [Note: timeline] phase 1: tile landed"
    if attn.count(loop) != 1 or attn.count(landed) != 1:
        raise SystemExit("the attention's key loop is not the form --gate handles")
    attn = attn.replace(loop, "  if (n_tiles == 0 && tid == 0) atomicAdd(&fuse_count[0][2], 1u);\n" + loop)
    return attn.replace(landed, "    if (jt == 0 && tid == 0) atomicAdd(&fuse_count[0][2], 1u);\n" + landed)


def fuse(plan: dict, arch: str, blocks: int, gate: bool, fill_next: bool) -> int:
    kernels, modules = plan["kernels"], plan["modules"]
    out, j, i = [], 0, 0
    while i < len(kernels):
        a = kernels[i]
        o = kernels[i + 1] if i + 1 < len(kernels) else None
        if not (a["params"].get("unit") == "split" and o is not None and o["params"].get("unit") == "gemv"
                and o["params"].get("KM") == 1):
            out.append(a)
            i += 1
            continue
        a_src, o_src = modules[a["module"]]["source"], modules[o["module"]]["source"]
        s0, s1, am = function(a_src, a["symbol"])
        t0, t1, om = function(o_src, o["symbol"])
        cluster = int(re.search(r"__cluster_dims__\((\d+)", am.group(1)).group(1))
        n_attn = a["grid"][0]
        total = -(-(n_attn + blocks) // cluster) * cluster
        attn = a_src[s0:s1].replace(am.group(0), f"__device__ __forceinline__ void {a['symbol']}_attn({am.group(3)}) {{", 1)
        if gate:
            attn = gated(attn)
        sym = f"fused_{a['symbol']}_{o['symbol']}"
        ap, op = am.group(3), om.group(3)
        cols, o_role = o_body(o_src[t0:t1], o["symbol"], op, 0, blocks, n_attn, gate, fill_next)
        source = (helpers(a_src) + "\n__device__ unsigned int fuse_count[1][3];\n" + attn + o_role + f"""
extern "C" __global__ void {am.group(1)}{sym}({renamed(ap, 'a_')}, {renamed(op, 'o_')}) {{
  if (blockIdx.x < {n_attn}) {{
    {a['symbol']}_attn({', '.join('a_' + n for n in names(ap))});
    __syncthreads();
    if (threadIdx.x == 0) {{ __threadfence(); atomicAdd(&fuse_count[0][0], 1u); }}
  }} else if (blockIdx.x < {n_attn + blocks}) {{
    {o['symbol']}_o({', '.join('o_' + n for n in names(op))}, (int)blockIdx.x - {n_attn});
  }}
}}
""")
        built = build(source, arch)
        print(f"{sym}: {total} blocks ({n_attn} attention, {blocks} O, {total - n_attn - blocks} idle), "
              f"registers {built.registers.get(sym)}, spills {built.spills.get(sym)}", flush=True)
        modules.append({"name": f"module_{sym}", "arch": arch, "cubin": built.cubin,
                        "cubin_sha256": hashlib.sha256(built.cubin).hexdigest(),
                        "source_sha256": hashlib.sha256(source.encode()).hexdigest(), "source": source})
        fused = dict(a)   # a --timeline build's record too: the attention blocks stamp as before, the O's do not
        fused.update(name=a["name"], symbol=sym, module=len(modules) - 1, grid=[total, 1, 1],
                     smem_bytes=max(a["smem_bytes"], cols * 4096 + 4 * cols),
                     args=a["args"] + o["args"], trigger_from=0,
                     onnx_nodes=a["onnx_nodes"] + o["onnx_nodes"], stores=a["stores"] + o["stores"])
        out.append(fused)
        j += 1
        i += 2
    plan["kernels"] = out
    return j


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--gate", action="store_true", help="the O's weight requests wait for the attention's first tiles")
    ap.add_argument("--no-fill", action="store_true", help="the O blocks leave the gate/up's head out of L2")
    args = ap.parse_args()
    raw = Path(args.base).read_bytes()
    magic, version, zero, length, digest = HEADER.unpack_from(raw)
    payload = msgpack.unpackb(raw[HEADER.size:HEADER.size + length], raw=False, strict_map_key=False)
    section = raw[HEADER.size + length:]
    arch = payload["target"]["arch"]
    decode = [p for p in payload["plans"] if p["inputs"][0]["shape"][1] == 1]
    for plan in decode:
        print(f"decode plan: {fuse(plan, arch, args.blocks, args.gate, not args.no_fill)} attention + O pairs fused, "
              f"{len(plan['kernels'])} kernels", flush=True)
    data = msgpack.packb(payload, use_bin_type=True)
    header = HEADER.pack(magic, version, zero, len(data), hashlib.sha256(data).digest())
    Path(args.out).write_bytes(header + data + section)


if __name__ == "__main__":
    main()
