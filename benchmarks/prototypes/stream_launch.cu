// Streaming microbenchmark (issue 19, session 23; benchmarks/results/decode_chain_prototype_session23_h200.txt).
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/stream_launch benchmarks/prototypes/stream_launch.cu
//   /tmp/stream_launch          # 14 launches of 8-66 MB each, graph-replayed: what a launch of a pure stream costs
//   /tmp/stream_launch chunks   # 1 GiB through one block an SM: bulk-copy size and bytes in flight
// Every byte is read once from past the L2 (1 GiB buffer); no product code depends on this file.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include "proto.cuh"
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// mode 0: block b streams its own contiguous share; mode 1: chunk i goes to block i % G (the GPU sweeps memory in order)
// SPLIT: each chunk issued as SPLIT bulk copies
__global__ void __launch_bounds__(64, 1) ring(const char* p, size_t bytes, int chunk, int depth, int mode, int split, float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bars = (uint64_t*)(smem + (size_t)chunk * depth);
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(smem);
  const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * depth;
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  if (tid == 0) { for (int s = 0; s < depth; ++s) { mb_init(full0 + 8 * s, 1); mb_init(empty0 + 8 * s, 1); }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory"); }
  __syncthreads();
  const size_t nchunks = bytes / chunk;
  size_t first, step, count;
  if (mode == 0) { size_t c0 = nchunks * b / G, c1 = nchunks * (b + 1) / G; first = c0; step = 1; count = c1 - c0; }
  else { first = b; step = G; count = (nchunks > (size_t)b) ? (nchunks - b + G - 1) / G : 0; }
  if (tid == 0) {
    for (size_t i = 0; i < count; ++i) {
      const int s = i % depth;
      if (i >= (size_t)depth) mb_wait(empty0 + 8 * s, ((i / depth) - 1) & 1);
      mb_expect(full0 + 8 * s, chunk);
      const char* src = p + (first + i * step) * chunk;
      for (int q = 0; q < split; ++q) bulk_load(ring_s + s * chunk + q * (chunk / split), src + q * (chunk / split), chunk / split, full0 + 8 * s);
    }
  } else if (tid == 32) {
    float a = 0.f;
    for (size_t i = 0; i < count; ++i) {
      const int s = i % depth;
      mb_wait(full0 + 8 * s, (i / depth) & 1);
      a += smem[s * chunk];
      mb_arrive(empty0 + 8 * s);
    }
    if (a == 1.2345f) *sink = a;
  }
}
// the same share read with 16-byte loads by 512 threads a block, 4 blocks an SM
__global__ void loads(const uint4* p, size_t n, int mode, float* sink) {
  float a = 0.f;
  if (mode == 1) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
      uint4 v; asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i)); a += __uint_as_float(v.x ^ v.w);
    }
  } else {
    size_t c0 = n * blockIdx.x / gridDim.x, c1 = n * (blockIdx.x + 1) / gridDim.x;
    for (size_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
      uint4 v; asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i)); a += __uint_as_float(v.x ^ v.w);
    }
  }
  if (a == 1.2345f) *sink = a;
}
int main(int argc, char** argv) {
  (void)argv;
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t total = (size_t)1 << 30;
  char* d; float* sink; CK(cudaMalloc(&d, total)); CK(cudaMemset(d, 1, total)); CK(cudaMalloc(&sink, 4));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  CK(cudaFuncSetAttribute(ring, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024 + 1024));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  // 1 GiB through one block a SM: the chunk size of a bulk copy and the bytes in flight
  if (argc > 1) {
    for (int mode = 0; mode < 2; ++mode)
      for (int chunk : {4096, 8192, 16384, 32768})
        for (int inflight : {64 * 1024, 128 * 1024, 192 * 1024})
          for (int split : {1, 4}) {
            if (chunk / split < 1024) continue;
            const int depth = inflight / chunk;
            cudaGraph_t gr; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            ring<<<sms, 64, chunk * depth + 16 * depth, st>>>(d, total, chunk, depth, mode, split, sink);
            CK(cudaStreamEndCapture(st, &gr)); CK(cudaGraphInstantiate(&ge, gr, 0));
            CK(cudaGraphLaunch(ge, st));
            float best = 1e9;
            for (int r = 0; r < 7; ++r) { CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
              float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); best = best < ms ? best : ms; }
            printf("tma  mode %d chunk %6d depth %3d (%3d KB) split %d: %6.0f GB/s\n", mode, chunk, depth, inflight / 1024, split, total / (best * 1e-3) / 1e9);
          }
    return 0;
  }
  // short streams: 16 launches of `per` bytes each, distinct regions, captured as one graph
  for (size_t per : {(size_t)8 << 20, (size_t)22 << 20, (size_t)44 << 20, (size_t)66 << 20}) {
    for (int kind = 0; kind < 3; ++kind) {
      cudaGraph_t gr; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int l = 0; l < 14; ++l) {
        const char* p = d + l * per;
        if (kind == 0) ring<<<sms, 64, 6 * 32768 + 96, st>>>(p, per, 32768, 6, 0, 1, sink);
        else if (kind == 1) ring<<<sms, 64, 6 * 32768 + 96, st>>>(p, per, 32768, 6, 1, 1, sink);
        else loads<<<sms * 4, 512, 0, st>>>((const uint4*)p, per / 16, 1, sink);
      }
      CK(cudaStreamEndCapture(st, &gr)); CK(cudaGraphInstantiate(&ge, gr, 0));
      for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
      float best = 1e9;
      for (int r = 0; r < 10; ++r) { CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st)); CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); best = best < ms ? best : ms; }
      const char* nm[3] = {"tma contiguous", "tma interleaved", "ld.v4 4x512"};
      printf("%-16s %3zu MB a launch: %7.2f us a launch, %5.0f GB/s\n", nm[kind], per >> 20, best * 1e3 / 14, per / (best * 1e-3 / 14) / 1e9);
    }
  }
  CK(cudaGetLastError());
}
