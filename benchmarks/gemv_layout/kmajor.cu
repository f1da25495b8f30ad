// Experiment (session 47, issue 19): a chain of one-row gemvs over K-major weights (W stored [N][K]: a column's
// k-rows contiguous), a column's k-range over a few warps of one block, no split across blocks, under programmatic
// dependent launch in a CUDA graph. Compared with aicf's own plan of the same chain (chain_onnx.py: MatMuls
// 2048 -> 5632 -> 2048 -> 2048, L times, compiled with --precision fp16, `aicf-run --bench`), whose gemvs read the
// ONNX [K, N] weight and merge k-splits across the blocks of a cluster.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o kmajor benchmarks/gemv_layout/kmajor.cu && ./kmajor 4 && ./kmajor 2
// Per-gemv time: the difference of the L = 4 and L = 2 replays over 6 gemvs (the chain's ends cancel).
// Results: benchmarks/results/gemv_kmajor_session47_h200.txt.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ void dot8(const uint4& w, const uint4& x, float& acc) {
  const __half2* a = reinterpret_cast<const __half2*>(&w);
  const __half2* b = reinterpret_cast<const __half2*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fa = __half22float2(a[i]), fb = __half22float2(b[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
}

// y[n] = sum_k x[k] W[n][k]. Block: WARPS warps, CB columns; a column's K split over S = WARPS / CB warps.
template <int CB, int WARPS, int U>
__global__ void __launch_bounds__(WARPS * 32) gemv_kmajor(const half* __restrict__ W, const half* x, half* y, int K) {
  asm volatile("griddepcontrol.launch_dependents;");
  constexpr int S = WARPS / CB;
  const int VEC = K / 8, PER = (VEC + S - 1) / S;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = blockIdx.x * CB + warp % CB, part = warp / CB;
  const int v0 = part * PER, v1 = min(v0 + PER, VEC);
  const uint4* w = reinterpret_cast<const uint4*>(W + (size_t)col * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  uint4 wb[U];
#pragma unroll
  for (int u = 0; u < U; ++u) { const int v = v0 + lane + 32 * u; if (v < v1) wb[u] = ld_stream(w + v); }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc = 0.f;
  for (int base = v0; base < v1; base += 32 * U) {
    uint4 nb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) { const int v = base + 32 * U + lane + 32 * u; if (v < v1) nb[u] = ld_stream(w + v); }
#pragma unroll
    for (int u = 0; u < U; ++u) { const int v = base + lane + 32 * u; if (v < v1) dot8(wb[u], xv[v], acc); }
#pragma unroll
    for (int u = 0; u < U; ++u) wb[u] = nb[u];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if constexpr (S == 1) {
    if (lane == 0) y[col] = __float2half(acc);
  } else {
    __shared__ float red[WARPS];
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    if (threadIdx.x < CB) {
      float s = 0.f;
      for (int p = 0; p < S; ++p) s += red[p * CB + threadIdx.x];
      y[blockIdx.x * CB + threadIdx.x] = __float2half(s);
    }
  }
}

struct Cfg { int cb, warps, u; };
typedef void (*Kern)(const half*, const half*, half*, int);
static Kern pick(Cfg c) {
#define P(CB, W, U) if (c.cb == CB && c.warps == W && c.u == U) return gemv_kmajor<CB, W, U>;
  P(1, 4, 4) P(1, 4, 8) P(1, 8, 4) P(1, 8, 8) P(2, 8, 4) P(2, 8, 8) P(4, 8, 4) P(4, 8, 8) P(8, 8, 4) P(8, 8, 8)
  P(2, 4, 4) P(2, 4, 8) P(4, 4, 4) P(4, 4, 8) P(1, 16, 4) P(2, 16, 4) P(4, 16, 4) P(8, 16, 4) P(16, 16, 4)
#undef P
  return nullptr;
}

int main(int argc, char** argv) {
  const int L = argc > 1 ? atoi(argv[1]) : 4;
  // one repeat: 2048 -> 5632 -> 2048 -> 2048 (an up, a down, a square projection)
  const int dims[4] = {2048, 5632, 2048, 2048};
  std::vector<half*> Ws; std::vector<int> Ks, Ns;
  size_t total = 0;
  srand(1);
  std::vector<half> host;
  for (int l = 0; l < L; ++l)
    for (int j = 0; j < 3; ++j) {
      const int K = dims[j], N = dims[j + 1];
      host.resize((size_t)N * K);
      const float sc = 1.0f / sqrtf((float)K) * 1.7f;
      for (auto& h : host) h = __float2half(((rand() / (float)RAND_MAX) * 2.f - 1.f) * sc);
      half* d; CK(cudaMalloc(&d, host.size() * 2)); CK(cudaMemcpy(d, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
      Ws.push_back(d); Ks.push_back(K); Ns.push_back(N); total += host.size() * 2;
    }
  std::vector<half> x0(2048);
  for (auto& h : x0) h = __float2half((rand() / (float)RAND_MAX) * 2.f - 1.f);
  half *xa, *xb; CK(cudaMalloc(&xa, 8192 * 2)); CK(cudaMalloc(&xb, 8192 * 2));
  CK(cudaMemcpy(xa, x0.data(), 4096, cudaMemcpyHostToDevice));
  // check the first gemv of every config against a float64 reference
  std::vector<half> w0((size_t)5632 * 2048); CK(cudaMemcpy(w0.data(), Ws[0], w0.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> ref(5632);
  for (int n = 0; n < 5632; ++n) { double s = 0; for (int k = 0; k < 2048; ++k) s += (double)__half2float(w0[(size_t)n * 2048 + k]) * __half2float(x0[k]); ref[n] = s; }
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  printf("L=%d, %d gemvs, %.1f MB of weights\n", L, 3 * L, total / 1e6);
  Cfg cfgs[] = {{1, 4, 4}, {1, 4, 8}, {1, 8, 4}, {1, 8, 8}, {2, 8, 4}, {2, 8, 8}, {4, 8, 4}, {4, 8, 8}, {8, 8, 4}, {8, 8, 8},
                {2, 4, 4}, {2, 4, 8}, {4, 4, 4}, {4, 4, 8}, {1, 16, 4}, {2, 16, 4}, {4, 16, 4}, {8, 16, 4}, {16, 16, 4}};
  for (Cfg c : cfgs) {
    Kern k = pick(c);
    auto launch = [&](int i, const half* in, half* out) {
      cudaLaunchConfig_t lc = {};
      lc.gridDim = dim3(Ns[i] / c.cb); lc.blockDim = dim3(c.warps * 32); lc.stream = st;
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
      lc.attrs = at; lc.numAttrs = 1;
      CK(cudaLaunchKernelEx(&lc, k, (const half*)Ws[i], in, out, Ks[i]));
    };
    // correctness of the first gemv (x restored: the previous config's chain overwrote it)
    CK(cudaMemcpy(xa, x0.data(), 4096, cudaMemcpyHostToDevice));
    launch(0, xa, xb); CK(cudaStreamSynchronize(st));
    std::vector<half> got(5632); CK(cudaMemcpy(got.data(), xb, 5632 * 2, cudaMemcpyDeviceToHost));
    double err = 0, mx = 0;
    for (int n = 0; n < 5632; ++n) { err = std::max(err, std::fabs(__half2float(got[n]) - ref[n])); mx = std::max(mx, std::fabs(ref[n])); }
    CK(cudaMemcpy(xa, x0.data(), 4096, cudaMemcpyHostToDevice));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 3 * L; ++i) launch(i, (i % 2) ? xb : xa, (i % 2) ? xa : xb);
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 30; ++i) CK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < 25; ++r) {
      CK(cudaEventRecord(e0, st));
      for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms * 100.f);  // us per replay
    }
    std::sort(ts.begin(), ts.end());
    const float med = ts[ts.size() / 2];
    printf("CB %2d warps %2d U %d: replay %.1f us (%.2f us a gemv, %.0f GB/s), first gemv max err %.2e of %.2e\n",
           c.cb, c.warps, c.u, med, med / (3 * L), total / (med * 1e3), err, mx);
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  }
  return 0;
}
