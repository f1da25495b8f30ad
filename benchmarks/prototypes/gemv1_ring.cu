// Prototype, not product code (issue 19, session 66): does a one-row gemv stream its weight at a plain read's rate
// when the bytes in flight live in shared memory instead of registers?
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/gemv1_ring benchmarks/prototypes/gemv1_ring.cu
//   /tmp/gemv1_ring          # prints one line a variant: us, TB/s, bytes in flight an SM, registers, max error
// Why: the B1 decode step's gate/up gemv streams its 44 MiB at about 3.9 TB/s where a plain read reaches 4.45
// (sessions 53 and 64), and the cost model's Little's-law term puts that on the 43 KB an SM it keeps in flight; more
// steps in registers cost registers (U 8: 115 a thread, two blocks an SM, no room for the next kernel's blocks).
// Here every thread keeps D steps of 16 bytes in flight through its own slots of a shared-memory ring (cp.async,
// LDGSTS): it waits for its oldest step (cp.async.wait_group), reads it back, and refills the slot. A thread reads only
// what it copied itself, so no barrier and no mbarrier is needed, and the ring holds no registers.
// Shape: the 1 B Llama's gate/up at one row, W stored [N, K] (K-major, as the product's QKV / O / down gemvs read it),
// N = 11264, K = 2048, fp16; x fp16 in shared memory (4 KB, one 16-byte read a step), y fp32.
// Work: the N·K/256 warp steps (512 bytes: 32 lanes x 16 bytes of one row) are shared evenly over every warp of the
// grid in contiguous ranges; a warp adds its lanes' products of one row by shuffles when the row ends (8 steps a row)
// or its range does, and lane 0 adds the row's sum into y (atomicAdd: ranges may split a row).
// Variants: REG (U steps in registers), RING (D steps in the ring), both at 1-4 blocks of 256 threads an SM, the
// same two over W stored [K, N] (64-column blocks: 128-byte runs of each k-row, as the product's gate/up reads it),
// and a plain read of the same bytes (the stream's ceiling). Weights past the L2 (copies rotated, > 200 MB); timed as
// 20 back-to-back launches between CUDA events, median of 7.
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "proto.cuh"

constexpr int N = 11264, K = 2048, CH = K / 256;   // CH steps a row (a step: 32 lanes x 8 halves)
constexpr int NT = 256;

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __half2* a = reinterpret_cast<const __half2*>(&w);
  const __half2* b = reinterpret_cast<const __half2*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __half22float2(a[i]), fb = __half22float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int P>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(P) : "memory"); }

// x (K halves) into the block's shared memory, one 16-byte vector a thread at a time, then a barrier
__device__ __forceinline__ void stage_x(uint4* xs, const __half* x) {
  for (int i = threadIdx.x; i < K / 8; i += NT) xs[i] = reinterpret_cast<const uint4*>(x)[i];
  __syncthreads();
}

// the step range [s0, s1) of warp gw out of nw: even shares of every step
__device__ __forceinline__ void range(int gw, int nw, int& s0, int& s1) {
  const long long total = (long long)N * CH;
  s0 = (int)(total * gw / nw);
  s1 = (int)(total * (gw + 1) / nw);
}

__device__ __forceinline__ void flush(float& acc, int row, float* y, int lane) {
#pragma unroll
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) atomicAdd(y + row, acc);
  acc = 0.f;
}

template <int U>
__global__ void __launch_bounds__(NT) gemv_reg(const __half* __restrict__ w, const __half* __restrict__ x,
                                               float* __restrict__ y) {
  const int lane = threadIdx.x & 31, gw = blockIdx.x * (NT / 32) + (threadIdx.x >> 5);
  int s0, s1;
  range(gw, gridDim.x * (NT / 32), s0, s1);
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  __shared__ uint4 xs[K / 8];
  stage_x(xs, x);
  uint4 buf[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (s0 + u < s1) buf[u] = __ldcs(wv + (size_t)(s0 + u) * 32 + lane);
  float acc = 0.f;
  int row = s0 / CH;
  for (int s = s0; s < s1; s += U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = s + u;
      if (st < s1) {
        const int r = st / CH, c = st % CH;
        if (r != row) { flush(acc, row, y, lane); row = r; }
        const uint4 xc = xs[c * 32 + lane];
        acc += dot8(buf[u], xc);
        if (st + U < s1) buf[u] = __ldcs(wv + (size_t)(st + U) * 32 + lane);
      }
    }
  }
  flush(acc, row, y, lane);
}

template <int D>
__global__ void __launch_bounds__(NT, 4) gemv_ring(const __half* __restrict__ w, const __half* __restrict__ x,
                                                float* __restrict__ y) {
  extern __shared__ uint4 ring[];   // [D][NT]: a thread's slots NT x 16 bytes apart (no bank conflicts)
  const int lane = threadIdx.x & 31, gw = blockIdx.x * (NT / 32) + (threadIdx.x >> 5);
  int s0, s1;
  range(gw, gridDim.x * (NT / 32), s0, s1);
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(ring) + threadIdx.x * 16;
#pragma unroll
  for (int d = 0; d < D; ++d) {   // always D groups committed, empty past the range, so wait_group counts hold
    if (s0 + d < s1) cp16(base + d * NT * 16, wv + (size_t)(s0 + d) * 32 + lane);
    cp_commit();
  }
  __shared__ uint4 xs[K / 8];
  stage_x(xs, x);
  float acc = 0.f;
  int row = s0 / CH;
  for (int s = s0; s < s1; s += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int st = s + d;
      if (st < s1) {
        cp_wait<D - 1>();   // step st (the oldest group) has landed
        const uint4 v = ring[d * NT + threadIdx.x];
        const int r = st / CH, c = st % CH;
        if (r != row) { flush(acc, row, y, lane); row = r; }
        const uint4 xc = xs[c * 32 + lane];
        acc += dot8(v, xc);
        if (st + D < s1) cp16(base + d * NT * 16, wv + (size_t)(st + D) * 32 + lane);
        cp_commit();
      }
    }
  }
  cp_wait<0>();
  flush(acc, row, y, lane);
}

// The same product over W stored [K, N] (the product's gate/up layout): warp gw takes the 64-column block gw / WPC
// (128-byte runs of each k-row, as the product's BN 64) and k-part gw % WPC of its rows; a step is 4 k-rows (8 lanes
// a row, 8 columns a lane). KN_RING = 0: U steps in registers; otherwise KN_RING steps in the shared-memory ring.
constexpr int BNK = 64, CBS = N / BNK;
template <int U, int RING>
__global__ void __launch_bounds__(NT, 1) gemv_kn(const __half* __restrict__ w, const __half* __restrict__ x,
                                              float* __restrict__ y) {
  extern __shared__ uint4 ring[];
  __shared__ __align__(16) __half xs[K];
  const int lane = threadIdx.x & 31, gw = blockIdx.x * (NT / 32) + (threadIdx.x >> 5);
  const int nw = gridDim.x * (NT / 32), wpc = nw / CBS;
  if (gw >= wpc * CBS) return;
  const int cb = gw / wpc, p = gw % wpc;
  const int k0 = K * p / wpc, k1 = K * (p + 1) / wpc, steps = (k1 - k0 + 3) / 4;
  const int kr = lane >> 3, c8 = (lane & 7) * 8;
  const __half* wb = w + (size_t)(k0 + kr) * N + cb * BNK + c8;   // step st: wb + 4·st·N
#define KN_SRC(st) reinterpret_cast<const uint4*>(wb + (size_t)(st) * 4 * N)
#define KN_LIVE(st) (k0 + 4 * (st) + kr < k1)
  constexpr int DEPTH = RING ? RING : U;
  uint4 buf[RING ? 1 : U];
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(ring) + threadIdx.x * 16;
#pragma unroll
  for (int d = 0; d < DEPTH; ++d) {
    if constexpr (RING != 0) {
      if (d < steps && KN_LIVE(d)) cp16(base + d * NT * 16, KN_SRC(d));
      cp_commit();
    } else if (d < steps) {
      buf[RING ? 0 : d] = KN_LIVE(d) ? __ldcs(KN_SRC(d)) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  stage_x(reinterpret_cast<uint4*>(xs), x);
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  for (int s = 0; s < steps; s += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int st = s + d;
      if (st < steps) {
        uint4 v;
        if constexpr (RING != 0) {
          cp_wait<DEPTH - 1>();
          v = KN_LIVE(st) ? ring[d * NT + threadIdx.x] : make_uint4(0u, 0u, 0u, 0u);
        } else {
          v = buf[RING ? 0 : d];
        }
        const float xv = KN_LIVE(st) ? __half2float(xs[k0 + 4 * st + kr]) : 0.f;
        const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(h[j]);
          acc[2 * j] = fmaf(f.x, xv, acc[2 * j]);
          acc[2 * j + 1] = fmaf(f.y, xv, acc[2 * j + 1]);
        }
        if constexpr (RING != 0) {
          if (st + DEPTH < steps && KN_LIVE(st + DEPTH)) cp16(base + d * NT * 16, KN_SRC(st + DEPTH));
          cp_commit();
        } else if (st + DEPTH < steps) {
          buf[RING ? 0 : d] = KN_LIVE(st + DEPTH) ? __ldcs(KN_SRC(st + DEPTH)) : make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  }
  if constexpr (RING != 0) cp_wait<0>();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 8);
    acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 16);
  }
  if (lane < 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) atomicAdd(y + cb * BNK + c8 + j, acc[j]);
  }
#undef KN_SRC
#undef KN_LIVE
}


struct Data {
  size_t wn = (size_t)N * K;
  int copies = 0;
  __half *dw = nullptr, *dx = nullptr;
  float *dy = nullptr, *sink = nullptr;
  std::vector<double> ref;
};

static void check(const char* name, const Data& d, float us, int g, int sms, int inflight, int regs) {
  std::vector<float> hy(N);
  CK(cudaMemcpy(hy.data(), d.dy, N * 4, cudaMemcpyDeviceToHost));
  double worst = 0, scale = 0;
  bool nan = false;
  for (int j = 0; j < N; ++j) {
    if (hy[j] != hy[j]) nan = true;
    worst = std::max(worst, std::abs(d.ref[j] - hy[j]));
    scale = std::max(scale, std::abs(d.ref[j]));
  }
  printf("%-14s %4d blocks (%.2f an SM): %6.2f us %5.2f TB/s  %3d KB in flight an average SM  %3d registers  err %.1e of %.1e %s\n",
         name, g, (double)g / sms, us, d.wn * 2 / us / 1e6, inflight / 1024, regs, worst, scale,
         (!nan && worst <= 1e-3 * scale) ? "PASS" : "FAIL");
}

template <int U>
static void run_reg(Data& d, int sms, int bps, int grid = 0) {
  const int g = grid ? grid : sms * bps;
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, gemv_reg<U>));
  const float t = time_us([&](int c) { gemv_reg<U><<<g, NT>>>(d.dw + c * d.wn, d.dx, d.dy); }, d.copies);
  CK(cudaMemset(d.dy, 0, N * 4));
  gemv_reg<U><<<g, NT>>>(d.dw, d.dx, d.dy);
  CK(cudaDeviceSynchronize());
  char name[32]; snprintf(name, sizeof name, "reg U%d", U);
  check(name, d, t, g, sms, g * NT * U * 16 / sms, fa.numRegs);
}

template <int D>
static void run_ring(Data& d, int sms, int bps, int grid = 0) {
  const int g = grid ? grid : sms * bps, smem = D * NT * 16;
  CK(cudaFuncSetAttribute(gemv_ring<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, gemv_ring<D>));
  int fit = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, gemv_ring<D>, NT, smem));
  if (fit < bps) { printf("ring D%d: %d blocks an SM do not fit (%d)\n", D, bps, fit); return; }
  const float t = time_us([&](int c) { gemv_ring<D><<<g, NT, smem>>>(d.dw + c * d.wn, d.dx, d.dy); }, d.copies);
  CK(cudaMemset(d.dy, 0, N * 4));
  gemv_ring<D><<<g, NT, smem>>>(d.dw, d.dx, d.dy);
  CK(cudaDeviceSynchronize());
  char name[32]; snprintf(name, sizeof name, "ring D%d", D);
  check(name, d, t, g, sms, g * smem / sms, fa.numRegs);
}

template <int U, int RING>
static void run_kn(Data& d, const __half* wkn, int sms, int bps) {
  const int g = sms * bps, smem = RING * NT * 16;
  if (smem) CK(cudaFuncSetAttribute(gemv_kn<U, RING>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, gemv_kn<U, RING>));
  int fit = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, gemv_kn<U, RING>, NT, smem));
  char name[32]; snprintf(name, sizeof name, RING ? "[K,N] ring D%d" : "[K,N] reg U%d", RING ? RING : U);
  if (fit < bps) { printf("%s: %d blocks an SM do not fit (%d)\n", name, bps, fit); return; }
  const float t = time_us([&](int c) { gemv_kn<U, RING><<<g, NT, smem>>>(wkn + c * d.wn, d.dx, d.dy); }, d.copies);
  CK(cudaMemset(d.dy, 0, N * 4));
  gemv_kn<U, RING><<<g, NT, smem>>>(wkn, d.dx, d.dy);
  CK(cudaDeviceSynchronize());
  check(name, d, t, g, sms, g * NT * 16 * (RING ? RING : U) / sms, fa.numRegs);
}

int main() {
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Data d;
  d.copies = std::max(2, (int)(200e6 / (d.wn * 2)) + 1);
  std::vector<__half> hw(d.wn), hx(K);
  srand(7);
  for (auto& v : hw) v = __float2half((rand() % 2001 - 1000) / 8000.f);
  for (auto& v : hx) v = __float2half((rand() % 2001 - 1000) / 1000.f);
  d.ref.assign(N, 0.0);
  for (int j = 0; j < N; ++j)
    for (int k = 0; k < K; ++k) d.ref[j] += (double)__half2float(hw[(size_t)j * K + k]) * __half2float(hx[k]);
  CK(cudaMalloc(&d.dw, d.wn * 2 * d.copies)); CK(cudaMalloc(&d.dx, K * 2));
  CK(cudaMalloc(&d.dy, N * 4)); CK(cudaMalloc(&d.sink, 4));
  for (int c = 0; c < d.copies; ++c) CK(cudaMemcpy(d.dw + c * d.wn, hw.data(), d.wn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.dx, hx.data(), K * 2, cudaMemcpyHostToDevice));
  const float tp = time_us([&](int c) { plain<<<sms * 4, 256>>>(reinterpret_cast<const uint4*>(d.dw + c * d.wn), d.wn / 8, d.sink); },
                           d.copies);
  printf("plain read of %.1f MB: %6.2f us %5.2f TB/s (%d SMs, %d copies)\n", d.wn * 2 / 1e6, tp, d.wn * 2 / tp / 1e6, sms,
         d.copies);
  for (int bps = 2; bps <= 4; ++bps) {
    run_reg<4>(d, sms, bps);
    run_reg<8>(d, sms, bps);
  }
  for (int bps = 1; bps <= 4; ++bps) {
    run_ring<4>(d, sms, bps);
    run_ring<8>(d, sms, bps);
    run_ring<12>(d, sms, bps);
    run_ring<16>(d, sms, bps);
  }
  // the product's B1 gate/up grid: 352 blocks, 3 on 88 SMs and 2 on 44 (equal work a block, not an SM)
  run_reg<4>(d, sms, 0, 352);
  run_ring<8>(d, sms, 0, 352);
  // the same weight stored [K, N]
  {
    std::vector<__half> hkn(d.wn);
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) hkn[(size_t)k * N + j] = hw[(size_t)j * K + k];
    __half* wkn;
    CK(cudaMalloc(&wkn, d.wn * 2 * d.copies));
    for (int c = 0; c < d.copies; ++c) CK(cudaMemcpy(wkn + c * d.wn, hkn.data(), d.wn * 2, cudaMemcpyHostToDevice));
    for (int bps = 2; bps <= 4; ++bps) {
      run_kn<4, 0>(d, wkn, sms, bps);
      run_kn<8, 0>(d, wkn, sms, bps);
      run_kn<1, 8>(d, wkn, sms, bps);
      run_kn<1, 16>(d, wkn, sms, bps);
    }
    CK(cudaFree(wkn));
  }
  printf("plain read again: %6.2f us\n",
         time_us([&](int c) { plain<<<sms * 4, 256>>>(reinterpret_cast<const uint4*>(d.dw + c * d.wn), d.wn / 8, d.sink); },
                 d.copies));
  return 0;
}
