// Prototype, not product code (issue 19, session 53): a decode step's MLP (RMSNorm -> gate/up + silu*mul ->
// down + residual) of benchmarks/generate.py's 1 B Llama (hidden 2048, FFN 5632, fp16, batch 1) as ONE kernel
// with no grid-wide wait inside it, against the same work as two kernels (the plan's form), in one process.
//
// fused: block b owns intermediate columns [c0, c1) (F split evenly over the grid). A producer warp streams, in
// groups of 8 columns, the gate/up rows of 4 columns (32 KB), the next 4, then the 8 columns' rows of the down
// weight stored [F, H] (32 KB), through a ring of NSLOT 32 KB shared-memory slots (1-D bulk copies), starting
// before the dependent-launch wait. The consumer warps turn each column into h = silu(gate)·up and multiply it
// into their 2048 partial outputs at once (the down projection split along its k by the block's columns): no
// block waits for another's h (session 23's persistent prototype, decode_mlp_chain.cu, waited for all of h
// before the down rows and lost). The partials meet in an fp32 buffer by float4 atomics (block 0 adds the
// residual); three rotating buffers, the one two layers ahead zeroed by block 0 after its wait.
// two: the gate/up kernel (the same chunks, h stored fp16) then the down kernel (rows of W_d [H, F], 2 rows a
// chunk, h in registers), both with the same ring and dependent launches.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/mlp benchmarks/prototypes/decode_mlp_splitk.cu
//   /tmp/mlp 16 [blocks]   # checks layer 0 of both against float64, then times 16 layers of distinct weights
// -DNOATOM=1 stores the fused partials instead of adding them (wrong values: the atomics' cost by difference);
// -DPURE=1 skips the consumers' arithmetic (the ring's own rate); freg is the fused form over register loads.
// Measured on an H200 (benchmarks/results/mlp_splitk_session53_h200.txt): fused 20.96 us a layer, two 20.88, freg
// 21.28, a plain read of the same 69 MB 15.8: one kernel a layer is no faster than two at the same machinery, and
// all three stream at ~3.3 TB/s, below the plan's own gate/up + down (18.1 us in session 52's timeline).
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_fp16.h>
#include "proto.cuh"

constexpr int H = 2048, F = 5632;
#ifndef CW
#define CW 4
#endif
#ifndef NSLOT
#define NSLOT 3
#endif
#ifndef NOATOM
#define NOATOM 0
#endif
constexpr int NT = 32 * (CW + 1);
#ifndef SLOT
#define SLOT 32768
#endif
#ifndef PURE
#define PURE 0                          // 1: the consumers only take and release the chunks (the ring's own rate)
#endif
constexpr int GUC = SLOT / (4 * H);     // gate/up columns a chunk: 4 (a column is its gate row then its up row)
constexpr int DC = SLOT / (2 * H);      // down columns a chunk: 8 (rows of W_d^T, 4 KB each)
constexpr int DR = SLOT / (2 * F);      // the two-kernel form's down rows a chunk (2 x 11 KB in 32 KB)
constexpr int MAXC = 64;                // columns a block may own
constexpr int PER = H / (CW * 32);      // outputs a consumer thread accumulates: 16

enum { END = 0, GU = 1, DN = 2, DROW = 3 };
struct Info { int kind, col, n; };
// shared memory: the slots' Info, then the mbarriers, then h of the block's columns, then the ring
constexpr int BAR_OFF = 16 * (NSLOT + 1), HS_OFF = BAR_OFF + 16 * NSLOT, RING_OFF = (HS_OFF + MAXC * 4 + 127) / 128 * 128;
constexpr int SMEM = RING_OFF + NSLOT * SLOT;

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" :: "n"(CW * 32) : "memory"); }
__device__ __forceinline__ float r16(float v) { return __half2float(__float2half(v)); }

struct Ring {
  unsigned char* buf; Info* info; uint32_t buf_s, full0, empty0;
  __device__ void init(unsigned char* smem) {
    buf = smem + RING_OFF; info = (Info*)smem;
    uint64_t* bars = (uint64_t*)(smem + BAR_OFF);
    buf_s = (uint32_t)__cvta_generic_to_shared(buf);
    full0 = (uint32_t)__cvta_generic_to_shared(bars); empty0 = full0 + 8 * NSLOT;
    if (threadIdx.x == 0) {
      for (int s = 0; s < NSLOT; ++s) { mb_init(full0 + 8 * s, 1); mb_init(empty0 + 8 * s, CW); }
      asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
  }
  // producer (one thread): chunk q into slot q % NSLOT once the consumers freed it
  __device__ void issue(int q, Info in, const void* src, uint32_t bytes) {
    const int s = q % NSLOT;
    if (q >= NSLOT) mb_wait(empty0 + 8 * s, ((q / NSLOT) - 1) & 1);
    info[s] = in;
    if (in.kind == END) { mb_arrive(full0 + 8 * s); return; }
    mb_expect(full0 + 8 * s, bytes);
    bulk_load(buf_s + s * SLOT, src, bytes, full0 + 8 * s);
  }
  __device__ Info take(int q) { const int s = q % NSLOT; mb_wait(full0 + 8 * s, (q / NSLOT) & 1); return info[s]; }
  __device__ const unsigned char* slot(int q) const { return buf + (q % NSLOT) * SLOT; }
  __device__ void release(int q) { __syncwarp(); if (threadIdx.x % 32 == 0) mb_arrive(empty0 + 8 * (q % NSLOT)); }
};


// the normalized activations a lane multiplies: lane l holds elements (l + 32 j) * 8 .. + 7, j < 8
__device__ void norm_x(const float* __restrict__ x, const __half* __restrict__ g, uint4 xa[H / 256]) {
  const int lane = threadIdx.x % 32;
  float v[H / 32];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < H / 256; ++j) {
    const float4 a = ((const float4*)x)[(lane + 32 * j) * 2], b = ((const float4*)x)[(lane + 32 * j) * 2 + 1];
    const float e[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) { v[8 * j + i] = r16(e[i]); ss += v[8 * j + i] * v[8 * j + i]; }
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  const float rstd = rsqrtf(ss / H + 1e-5f);
#pragma unroll
  for (int j = 0; j < H / 256; ++j) {
    const uint4 gv = ((const uint4*)g)[lane + 32 * j];
    const __half* gh = (const __half*)&gv;
    __half* d = (__half*)&xa[j];
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = __float2half(r16(v[8 * j + i] * rstd) * __half2float(gh[i]));
  }
}

__device__ __forceinline__ float dot_row(const uint4* w, const uint4 xa[H / 256]) {
  const int lane = threadIdx.x % 32;
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int j = 0; j < H / 256; ++j) {
    const uint4 q = w[lane + 32 * j];
    const __half2* hw = (const __half2*)&q; const __half2* hx = (const __half2*)&xa[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) { const float2 a = __half22float2(hw[e]), b = __half22float2(hx[e]); a0 += a.x * b.x; a1 += a.y * b.y; }
  }
  float s = a0 + a1;
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  return s;
}

__device__ __forceinline__ void span(int b, int G, int total, int& lo, int& hi) {
  lo = (int)((long long)total * b / G); hi = (int)((long long)total * (b + 1) / G);
}

// the gate/up chunks of one block (and, fused, the down chunks); the producer's order is the consumers'
__device__ void produce_gu(Ring& r, const __half* wgu, const __half* wdt, int c0, int c1, bool fused) {
  int q = 0;
  for (int c = c0; c < c1; c += DC) {
    const int ce = min(c + DC, c1);
    for (int a = c; a < ce; a += GUC) {
      const int n = min(GUC, ce - a);
      r.issue(q++, Info{GU, a, n}, wgu + (size_t)a * 2 * H, n * 4 * H);
    }
    if (fused) r.issue(q++, Info{DN, c, ce - c}, wdt + (size_t)c * H, (ce - c) * 2 * H);
  }
  r.issue(q, Info{END, 0, 0}, nullptr, 0);
}

// fused: x (fp32, the residual stream) -> acc_out += (b == 0 ? x : 0) + W_d·h over the block's columns
__global__ void __launch_bounds__(NT, 1)
mlp_fused(const float* __restrict__ x, const __half* __restrict__ g, const __half* __restrict__ wgu,
          const __half* __restrict__ wdt, float* acc_out, float* zero_next) {
  extern __shared__ __align__(128) unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;");
  Ring r; r.init(smem);
  float* hs = (float*)(smem + HS_OFF);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int c0, c1; span(blockIdx.x, gridDim.x, F, c0, c1);
  if (warp == CW) { if (lane == 0) produce_gu(r, wgu, wdt, c0, c1, true); return; }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (blockIdx.x == 0) for (int i = tid; i < H; i += CW * 32) zero_next[i] = 0.f;
  uint4 xa[H / 256];
  norm_x(x, g, xa);
  float acc[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) acc[i] = 0.f;
  for (int q = 0;; ++q) {
    const Info in = r.take(q);
    if (in.kind == END) break;
    const unsigned char* base = r.slot(q);
    if (PURE) {
    } else if (in.kind == GU) {
      for (int c = warp; c < in.n; c += CW) {
        const float gt = r16(dot_row((const uint4*)(base + c * 4 * H), xa));
        const float up = r16(dot_row((const uint4*)(base + c * 4 * H + 2 * H), xa));
        if (lane == 0) hs[in.col - c0 + c] = r16(gt / (1.f + __expf(-gt)) * up);
      }
    } else {
      consumers_sync();                                      // the group's h, written by the gate/up warps
      for (int k = 0; k < in.n; ++k) {
        const float hk = hs[in.col - c0 + k];
        const uint4* row = (const uint4*)(base + k * 2 * H);
#pragma unroll
        for (int part = 0; part < PER / 8; ++part) {
          const uint4 q4 = row[tid + part * CW * 32];
          const __half2* hw = (const __half2*)&q4;
#pragma unroll
          for (int e = 0; e < 4; ++e) { const float2 w2 = __half22float2(hw[e]); acc[8 * part + 2 * e] += hk * w2.x; acc[8 * part + 2 * e + 1] += hk * w2.y; }
        }
      }
    }
    r.release(q);
  }
#pragma unroll
  for (int part = 0; part < PER / 8; ++part) {
    const int o = 8 * (tid + part * CW * 32);
    if (blockIdx.x == 0) for (int e = 0; e < 8; ++e) acc[8 * part + e] += x[o + e];
#if NOATOM
    ((float4*)(acc_out + o))[0] = make_float4(acc[8 * part], acc[8 * part + 1], acc[8 * part + 2], acc[8 * part + 3]);
    ((float4*)(acc_out + o))[1] = make_float4(acc[8 * part + 4], acc[8 * part + 5], acc[8 * part + 6], acc[8 * part + 7]);
#else
    atomicAdd((float4*)(acc_out + o), make_float4(acc[8 * part], acc[8 * part + 1], acc[8 * part + 2], acc[8 * part + 3]));
    atomicAdd((float4*)(acc_out + o + 4), make_float4(acc[8 * part + 4], acc[8 * part + 5], acc[8 * part + 6], acc[8 * part + 7]));
#endif
  }
}

// two kernels, 1: h = silu(x_n·W_g)·(x_n·W_u), stored fp16
__global__ void __launch_bounds__(NT, 1)
mlp_gate_up(const float* __restrict__ x, const __half* __restrict__ g, const __half* __restrict__ wgu, __half* h) {
  extern __shared__ __align__(128) unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;");
  Ring r; r.init(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int c0, c1; span(blockIdx.x, gridDim.x, F, c0, c1);
  if (warp == CW) { if (lane == 0) produce_gu(r, wgu, nullptr, c0, c1, false); return; }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint4 xa[H / 256];
  norm_x(x, g, xa);
  for (int q = 0;; ++q) {
    const Info in = r.take(q);
    if (in.kind == END) break;
    const unsigned char* base = r.slot(q);
    for (int c = warp; c < in.n && !PURE; c += CW) {
      const float gt = r16(dot_row((const uint4*)(base + c * 4 * H), xa));
      const float up = r16(dot_row((const uint4*)(base + c * 4 * H + 2 * H), xa));
      if (lane == 0) h[in.col + c] = __float2half(gt / (1.f + __expf(-gt)) * up);
    }
    r.release(q);
  }
}

// two kernels, 2: out = x + W_d·h, rows of W_d [H, F] a block
__global__ void __launch_bounds__(NT, 1)
mlp_down(const float* __restrict__ x, const __half* __restrict__ h, const __half* __restrict__ wd, float* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;");
  Ring r; r.init(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int n0, n1; span(blockIdx.x, gridDim.x, H, n0, n1);
  if (warp == CW) {
    if (lane == 0) {
      int q = 0;
      for (int n = n0; n < n1; n += DR) r.issue(q++, Info{DROW, n, min(DR, n1 - n)}, wd + (size_t)n * F, min(DR, n1 - n) * 2 * F);
      r.issue(q, Info{END, 0, 0}, nullptr, 0);
    }
    return;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint4 hb[F / 256];
#pragma unroll
  for (int j = 0; j < F / 256; ++j) hb[j] = ((const uint4*)h)[lane + 32 * j];
  int seen = 0;
  for (int q = 0;; ++q) {
    const Info in = r.take(q);
    if (in.kind == END) break;
    const unsigned char* base = r.slot(q);
    const int u = (warp - seen % CW + CW) % CW;
    for (int k = u; k < in.n && !PURE; k += CW) {
      const uint4* w = (const uint4*)(base + k * 2 * F);
      float a0 = 0.f, a1 = 0.f;
#pragma unroll
      for (int j = 0; j < F / 256; ++j) {
        const uint4 qw = w[lane + 32 * j];
        const __half2* hw = (const __half2*)&qw; const __half2* hx = (const __half2*)&hb[j];
#pragma unroll
        for (int e = 0; e < 4; ++e) { const float2 a = __half22float2(hw[e]), b = __half22float2(hx[e]); a0 += a.x * b.x; a1 += a.y * b.y; }
      }
      float a = a0 + a1;
      for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(~0u, a, o);
      if (lane == 0) out[in.col + k] = x[in.col + k] + r16(a);
    }
    seen += in.n;
    r.release(q);
  }
}

// fused_reg: the same split, the gate/up rows streamed into registers by every warp (half a column's k a unit:
// lane l holds 4 vectors of the gate row and 4 of the up row), the block's down rows brought into shared memory
// by bulk copies issued before the dependent-launch wait (they do not depend on x)
constexpr int RT = 256, RW = RT / 32, MAXR = 48;
__global__ void __launch_bounds__(RT, 1)
mlp_fused_reg(const float* __restrict__ x, const __half* __restrict__ g, const __half* __restrict__ wgu,
              const __half* __restrict__ wdt, float* acc_out, float* zero_next) {
  extern __shared__ __align__(128) unsigned char smem[];
  asm volatile("griddepcontrol.launch_dependents;");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int c0, c1; span(blockIdx.x, gridDim.x, F, c0, c1);
  const int n = c1 - c0;
  const uint32_t bar = (uint32_t)__cvta_generic_to_shared(smem);
  float* hs = (float*)(smem + 16);                 // MAXR
  float* part = hs + MAXR;                         // [MAXR][2 halves][gate, up]
  const uint4* down = (const uint4*)(smem + 1024);
  if (tid == 0) {
    mb_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    mb_expect(bar, n * 2 * H);
    for (int c = 0; c < n; c += 8) {
      const int m = min(8, n - c);
      bulk_load(bar - 0 + 1024 + c * 2 * H, wdt + (size_t)(c0 + c) * H, m * 2 * H, bar);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (blockIdx.x == 0) for (int i = tid; i < H; i += RT) zero_next[i] = 0.f;
  uint4 xa[H / 256];
  norm_x(x, g, xa);
  // phase A: unit u = (column u / 2, k-half u % 2); warp w takes units w, w + RW, ..., two at a time
  for (int u = warp; u < 2 * n; u += 2 * RW) {
    const int u2 = u + RW;
    uint4 wg[2][4], wu[2][4];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int uu = min(k ? u2 : u, 2 * n - 1);     // a unit past the end reloads the last (not used)
      const uint4* rg = (const uint4*)(wgu + (size_t)(c0 + uu / 2) * 2 * H) + (uu % 2) * (H / 16);
      const uint4* ru = rg + H / 8;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(wg[k][j].x), "=r"(wg[k][j].y), "=r"(wg[k][j].z), "=r"(wg[k][j].w) : "l"(rg + lane + 32 * j));
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(wu[k][j].x), "=r"(wu[k][j].y), "=r"(wu[k][j].z), "=r"(wu[k][j].w) : "l"(ru + lane + 32 * j));
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int uu = k ? u2 : u;
      if (uu >= 2 * n) continue;
      const int half = uu % 2;
      float ga = 0.f, gb = 0.f, ua = 0.f, ub = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // lane's vector lane + 32 j of this half is the row's vector (half * 4 + j) * 32 + lane: xa[half * 4 + j]
        const __half2* hg = (const __half2*)&wg[k][j]; const __half2* hu = (const __half2*)&wu[k][j];
        const uint4 x4 = half ? xa[4 + j] : xa[j];      // (a select: xa stays in registers)
        const __half2* hx = (const __half2*)&x4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 xv = __half22float2(hx[e]), gv = __half22float2(hg[e]), uv = __half22float2(hu[e]);
          ga += gv.x * xv.x; gb += gv.y * xv.y; ua += uv.x * xv.x; ub += uv.y * xv.y;
        }
      }
      float gs = ga + gb, us = ua + ub;
      for (int o = 16; o; o >>= 1) { gs += __shfl_xor_sync(~0u, gs, o); us += __shfl_xor_sync(~0u, us, o); }
      if (lane == 0) { part[(uu / 2) * 4 + half * 2] = gs; part[(uu / 2) * 4 + half * 2 + 1] = us; }
    }
  }
  __syncthreads();
  if (tid < n) {
    const float gt = r16(part[tid * 4] + part[tid * 4 + 2]), up = r16(part[tid * 4 + 1] + part[tid * 4 + 3]);
    hs[tid] = r16(gt / (1.f + __expf(-gt)) * up);
  }
  __syncthreads();
  mb_wait(bar, 0);
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;
  for (int c = 0; c < n; ++c) {
    const float hk = hs[c];
    const uint4 q4 = down[c * (H / 8) + tid];
    const __half2* hw = (const __half2*)&q4;
#pragma unroll
    for (int e = 0; e < 4; ++e) { const float2 w2 = __half22float2(hw[e]); acc[2 * e] += hk * w2.x; acc[2 * e + 1] += hk * w2.y; }
  }
  const int o = 8 * tid;
  if (blockIdx.x == 0) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += x[o + e];
  }
  atomicAdd((float4*)(acc_out + o), make_float4(acc[0], acc[1], acc[2], acc[3]));
  atomicAdd((float4*)(acc_out + o + 4), make_float4(acc[4], acc[5], acc[6], acc[7]));
}

// the ceiling: every weight byte read once
__global__ void stream_read(const uint4* __restrict__ p, size_t n, float* out) {
  float a = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v; asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    a += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
  }
  if (a == 1.2345f) *out = a;
}

static float h2f(__half v) { return __half2float(v); }

int main(int argc, char** argv) {
  const int L = argc > 1 ? atoi(argv[1]) : 16;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int G = argc > 2 ? atoi(argv[2]) : sms;
  if ((F + G - 1) / G > MAXC) { printf("too few blocks for MAXC\n"); return 2; }
  // a layer's weights: W_gu [F][2][H] (gate row, up row of each column), W_d^T [F][H], W_d [H][F]
  const size_t ngu = (size_t)2 * F * H, nd = (size_t)H * F, per = ngu + 2 * nd;
  std::vector<__half> wgu(ngu), wdt(nd), wd(nd), hx(H), hg(H);
  srand(1);
  auto rnd = [] { return (rand() / (float)RAND_MAX - 0.5f); };
  for (auto& v : wgu) v = __float2half(rnd() * 0.05f);
  for (int n = 0; n < H; ++n) for (int c = 0; c < F; ++c) { const __half v = __float2half(rnd() * 0.05f); wd[(size_t)n * F + c] = v; wdt[(size_t)c * H + n] = v; }
  for (auto& v : hx) v = __float2half(rnd() * 2.f);
  for (auto& v : hg) v = __float2half(1.f + rnd() * 0.2f);
  __half *dw, *dg, *dh; float *dx, *dsink;
  CK(cudaMalloc(&dw, per * 2 * L)); CK(cudaMalloc(&dg, H * 2)); CK(cudaMalloc(&dh, F * 2));
  CK(cudaMalloc(&dx, 3 * H * 4)); CK(cudaMalloc(&dsink, 4));
  for (int l = 0; l < L; ++l) {
    CK(cudaMemcpy(dw + l * per, wgu.data(), ngu * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw + l * per + ngu, wdt.data(), nd * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw + l * per + ngu + nd, wd.data(), nd * 2, cudaMemcpyHostToDevice));
  }
  CK(cudaMemcpy(dg, hg.data(), H * 2, cudaMemcpyHostToDevice));
  for (auto k : {mlp_fused}) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  CK(cudaFuncSetAttribute(mlp_gate_up, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  CK(cudaFuncSetAttribute(mlp_down, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  const int rsmem = 1024 + (F + G - 1) / G * 2 * H;   // the block's down rows
  CK(cudaFuncSetAttribute(mlp_fused_reg, cudaFuncAttributeMaxDynamicSharedMemorySize, rsmem));
  if ((F + G - 1) / G > MAXR) { printf("too few blocks for MAXR\n"); return 2; }
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
  auto cfg_for = [&](bool pdl) {
    cudaLaunchConfig_t c = {}; c.gridDim = G; c.blockDim = NT; c.dynamicSmemBytes = SMEM; c.stream = st; c.attrs = at; c.numAttrs = pdl ? 1 : 0; return c;
  };
  auto fused = [&](int l, bool pdl) {
    cudaLaunchConfig_t c = cfg_for(pdl); const __half* w = dw + l * per;
    CK(cudaLaunchKernelEx(&c, mlp_fused, (const float*)(dx + (l % 3) * H), (const __half*)dg, w, w + ngu, dx + ((l + 1) % 3) * H, dx + ((l + 2) % 3) * H));
  };
  auto freg = [&](int l, bool pdl) {
    cudaLaunchConfig_t c = cfg_for(pdl); c.blockDim = RT; c.dynamicSmemBytes = rsmem; const __half* w = dw + l * per;
    CK(cudaLaunchKernelEx(&c, mlp_fused_reg, (const float*)(dx + (l % 3) * H), (const __half*)dg, w, w + ngu, dx + ((l + 1) % 3) * H, dx + ((l + 2) % 3) * H));
  };
  auto two = [&](int l, bool pdl) {
    cudaLaunchConfig_t c = cfg_for(pdl); const __half* w = dw + l * per;
    CK(cudaLaunchKernelEx(&c, mlp_gate_up, (const float*)(dx + (l % 2) * H), (const __half*)dg, w, dh));
    c = cfg_for(true);
    CK(cudaLaunchKernelEx(&c, mlp_down, (const float*)(dx + (l % 2) * H), (const __half*)dh, w + ngu + nd, dx + ((l + 1) % 2) * H));
  };
  // float64 reference of layer 0
  std::vector<double> ref(H);
  {
    double ss = 0; for (int i = 0; i < H; ++i) ss += (double)h2f(hx[i]) * h2f(hx[i]);
    const double rstd = 1.0 / sqrt(ss / H + 1e-5);
    std::vector<double> xn(H), hh(F);
    for (int i = 0; i < H; ++i) xn[i] = h2f(hx[i]) * rstd * h2f(hg[i]);
    for (int c = 0; c < F; ++c) {
      double gt = 0, up = 0;
      for (int k = 0; k < H; ++k) { gt += h2f(wgu[(size_t)c * 2 * H + k]) * xn[k]; up += h2f(wgu[(size_t)c * 2 * H + H + k]) * xn[k]; }
      hh[c] = gt / (1 + exp(-gt)) * up;
    }
    for (int n = 0; n < H; ++n) { double a = 0; for (int c = 0; c < F; ++c) a += h2f(wd[(size_t)n * F + c]) * hh[c]; ref[n] = h2f(hx[n]) + a; }
  }
  std::vector<float> x0(H); for (int i = 0; i < H; ++i) x0[i] = h2f(hx[i]);
  bool ok = true;
  const char* names[3] = {"fused", "two  ", "freg "};
  auto run_form = [&](int form, int l, bool pdl) { if (form == 0) fused(l, pdl); else if (form == 1) two(l, pdl); else freg(l, pdl); };
  for (int form = 0; form < 3; ++form) {
    CK(cudaMemset(dx, 0, 3 * H * 4)); CK(cudaMemcpy(dx, x0.data(), H * 4, cudaMemcpyHostToDevice));
    run_form(form, 0, false);
    CK(cudaStreamSynchronize(st));
    std::vector<float> o(H); CK(cudaMemcpy(o.data(), dx + H, H * 4, cudaMemcpyDeviceToHost));
    double err = 0, mx = 0;
    for (int n = 0; n < H; ++n) { mx = fmax(mx, fabs(ref[n])); err = std::isfinite(o[n]) ? fmax(err, fabs(o[n] - ref[n])) : 1e30; }
    const bool pass = err / mx < 1e-2;
    ok = ok && (pass || NOATOM || PURE);
    printf("%s layer 0 vs float64: max abs err %.3e of max %.3e (rel %.2e) %s\n", names[form], err, mx, err / mx, pass ? "PASS" : "FAIL");
  }
  if (argc > 3) return ok ? 0 : 1;   // the check alone (for compute-sanitizer)
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const double bytes = (ngu + nd) * 2.0;
  for (int round = 0; round < 3; ++round)
    for (int form = 0; form < 3; ++form) {
      cudaGraph_t gr; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int l = 0; l < L; ++l) run_form(form, l, l > 0);
      CK(cudaStreamEndCapture(st, &gr)); CK(cudaGraphInstantiate(&ge, gr, 0));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
      std::vector<float> ts;
      for (int rep = 0; rep < 20; ++rep) {
        CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms);
      }
      std::sort(ts.begin(), ts.end());
      printf("round %d %s G=%d CW=%d NSLOT=%d SLOT=%d PURE=%d: median %.2f us a layer (min %.2f), %.0f GB/s of weights\n", round, names[form],
             G, CW, NSLOT, SLOT, PURE, ts[10] * 1e3 / L, ts[0] * 1e3 / L, bytes * L / (ts[10] * 1e-3) / 1e9);
      CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(gr));
    }
  {
    const size_t n = (ngu + nd) * L / 8;   // the fused form's bytes: W_gu and W_d^T of every layer (strided by `per`: read all)
    for (int i = 0; i < 3; ++i) stream_read<<<sms * 4, 512, 0, st>>>((const uint4*)dw, n, dsink);
    float best = 1e9;
    for (int rep = 0; rep < 10; ++rep) {
      CK(cudaEventRecord(e0, st)); stream_read<<<sms * 4, 512, 0, st>>>((const uint4*)dw, n, dsink); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); best = fmin(best, ms);
    }
    printf("stream read of %.1f MB a layer: %.2f us a layer, %.0f GB/s\n", bytes / 1e6, best * 1e3 / L, n * 16.0 / (best * 1e-3) / 1e9);
  }
  CK(cudaGetLastError());
  return ok ? 0 : 1;
}
