// An 8-row gemv on tensor cores over a K-major weight with the k axis permuted (issue 19, session 64): what the
// 8-row decode projections could stream at without the shuffles and byte permutes of the product's [K, N] form.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/gemv_tc_kmajor benchmarks/prototypes/gemv_tc_kmajor.cu
//   /tmp/gemv_tc_kmajor
// The product's tensor-core gemv ([Note: the gemv on tensor cores], codegen/gemm_gemv.py) reads W as [K, N]: a lane's
// 16-byte vector holds 8 columns of one k-row, so the A fragment of mma.m16n8k16 (two k-rows of one column a register)
// is gathered by shuffles and byte permutes. Over W stored [N, K] a lane's 16-byte vector holds 8 k of one column,
// and since the contraction sums over k, the mma's logical k (2q, 2q+1, 2q+8, 2q+9 for quad q) may be any 4 physical
// k of the lane's vector as long as the activations (the B fragment) take the same 4: here physical 8q..8q+3 for one
// product and 8q+4..8q+7 for the next. Each lane then loads its fragments directly: W rows g and g+8, x row g.
// Block: T tiles of 16 columns, WARPS warps each over its own contiguous part of k, U steps of 32 k a warp in flight;
// the warps' partial sums meet in shared memory in warp order. Every weight byte is read once from past the L2
// (copies rotated, COPIES x the weight > 50 MB); timed as 20 back-to-back launches between CUDA events, median of 7.
// No product code depends on this file.
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "proto.cuh"

template <int T, int WARPS, int U>
__global__ void __launch_bounds__(WARPS * 32) gemv8(const __half* __restrict__ w, const __half* __restrict__ x,
                                                    float* __restrict__ y, int n, int k) {
  __shared__ float red[WARPS][8][16 * T];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * 16 * T;
  const int kpart = k / WARPS, kb0 = warp * kpart;             // k a multiple of 32 x WARPS here
  float acc[T][4];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  uint4 wa[U][T][2], xa[U];
  auto load = [&](int s, int kb) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      wa[s][t][0] = __ldcs(reinterpret_cast<const uint4*>(w + (size_t)(n0 + 16 * t + g) * k + kb + 8 * q));
      wa[s][t][1] = __ldcs(reinterpret_cast<const uint4*>(w + (size_t)(n0 + 16 * t + g + 8) * k + kb + 8 * q));
    }
    xa[s] = *reinterpret_cast<const uint4*>(x + (size_t)g * k + kb + 8 * q);
  };
#pragma unroll
  for (int s = 0; s < U; ++s)
    if (32 * s < kpart) load(s, kb0 + 32 * s);
  for (int kb = kb0; kb < kb0 + kpart; kb += 32 * U) {
#pragma unroll
    for (int s = 0; s < U; ++s) {
      if (kb + 32 * s >= kb0 + kpart) break;   // the part's last, partial round of steps
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint4 r0 = wa[s][t][0], r1 = wa[s][t][1], xv = xa[s];
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[t][0]), "+f"(acc[t][1]), "+f"(acc[t][2]), "+f"(acc[t][3])
                     : "r"(r0.x), "r"(r1.x), "r"(r0.y), "r"(r1.y), "r"(xv.x), "r"(xv.y));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(acc[t][0]), "+f"(acc[t][1]), "+f"(acc[t][2]), "+f"(acc[t][3])
                     : "r"(r0.z), "r"(r1.z), "r"(r0.w), "r"(r1.w), "r"(xv.z), "r"(xv.w));
      }
      const int next = kb + 32 * (U + s);
      if (next < kb0 + kpart) load(s, next);
    }
  }
  // C[n][m]: lane (g, q) holds columns n0 + 16t + g (+8) of rows 2q, 2q + 1
#pragma unroll
  for (int t = 0; t < T; ++t) {
    red[warp][2 * q][16 * t + g] = acc[t][0];
    red[warp][2 * q + 1][16 * t + g] = acc[t][1];
    red[warp][2 * q][16 * t + g + 8] = acc[t][2];
    red[warp][2 * q + 1][16 * t + g + 8] = acc[t][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 8 * 16 * T; i += WARPS * 32) {
    const int m = i / (16 * T), c = i % (16 * T);
    float v = red[0][m][c];
#pragma unroll
    for (int ww = 1; ww < WARPS; ++ww) v += red[ww][m][c];
    y[(size_t)m * n + n0 + c] = v;
  }
}


template <int T, int WARPS, int U>
static void run(const char* name, int n, int k) {
  const size_t wn = (size_t)n * k;
  const int copies = std::max(2, (int)(200e6 / (wn * 2)) + 1);
  std::vector<__half> hw(wn), hx(8 * (size_t)k);
  srand(n + k);
  for (auto& v : hw) v = __float2half((rand() % 2001 - 1000) / 8000.f);
  for (auto& v : hx) v = __float2half((rand() % 2001 - 1000) / 1000.f);
  __half *dw, *dx; float *dy, *sink;
  CK(cudaMalloc(&dw, wn * 2 * copies)); CK(cudaMalloc(&dx, hx.size() * 2));
  CK(cudaMalloc(&dy, 8 * (size_t)n * 4)); CK(cudaMalloc(&sink, 4));
  for (int c = 0; c < copies; ++c) CK(cudaMemcpy(dw + c * wn, hw.data(), wn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  const int blocks = n / (16 * T);
  gemv8<T, WARPS, U><<<blocks, WARPS * 32>>>(dw, dx, dy, n, k);
  CK(cudaDeviceSynchronize());
  std::vector<float> hy(8 * (size_t)n);
  CK(cudaMemcpy(hy.data(), dy, hy.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0, scale = 0;
  for (int m = 0; m < 8; ++m)
    for (int j = 0; j < n; j += 7) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk) ref += (double)__half2float(hx[(size_t)m * k + kk]) * __half2float(hw[(size_t)j * k + kk]);
      worst = std::max(worst, std::abs(ref - hy[(size_t)m * n + j]));
      scale = std::max(scale, std::abs(ref));
    }
  const float t = time_us([&](int c) { gemv8<T, WARPS, U><<<blocks, WARPS * 32>>>(dw + c * wn, dx, dy, n, k); }, copies);
  const float tp = time_us([&](int c) { plain<<<132 * 4, 256>>>(reinterpret_cast<const uint4*>(dw + c * wn), wn / 8, sink); }, copies);
  printf("%-8s N %5d K %5d  T %d warps %d U %d: %4d blocks  %6.2f us  %5.2f TB/s   plain read %6.2f us %5.2f TB/s   max err %.1e of %.1e\n",
         name, n, k, T, WARPS, U, blocks, t, wn * 2 / t / 1e6, tp, wn * 2 / tp / 1e6, worst, scale);
  CK(cudaFree(dw)); CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(sink));
}

int main() {
  // the 1 B Llama's 8-row decode projections; the product's kernels alone, weights cold (session 64's profile):
  // gate/up 15.3 us, down 9.43, QKV 6.47, O 5.21-5.45
  run<2, 4, 4>("gate/up", 11264, 2048);
  run<2, 8, 2>("gate/up", 11264, 2048);
  run<1, 4, 4>("gate/up", 11264, 2048);
  run<1, 8, 4>("down", 2048, 5632);
  run<1, 16, 2>("down", 2048, 5632);
  run<1, 4, 4>("qkv", 3072, 2048);
  run<1, 8, 2>("qkv", 3072, 2048);
  run<1, 4, 4>("o", 2048, 2048);
  run<1, 8, 2>("o", 2048, 2048);
  return 0;
}
