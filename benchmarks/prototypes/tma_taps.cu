// TMA load rates of a 3x3 convolution's A operand (issue 17, session 30): no arithmetic, only the
// producer's copies into a STAGES-deep ring that one consumer warp frees as soon as each stage lands.
//   nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/tma_taps benchmarks/prototypes/tma_taps.cu -lcuda
//   /tmp/tma_taps [N H W C]      # default ResNet-50 B32 stage 1: 32 56 56 64
// Image NHWC fp16, a 3x3 stride-1 pad-1 convolution's k-blocks (one tap x 64 channels each), 132 persistent CTAs:
//   im2col   cuTensorMapEncodeIm2col, 128 output pixels a copy (what codegen/conv_wgmma.py's A = tma loads)
//   slots    tiled box (64 c, 64 w, 2 h, 1 n) a tap at (0, kw - 1, oh0 + kh - 1, n): rows of 64 slots, OOB zeros
//   blocks   tiled box (64 c, 8 w, 8 h, 2 n) a tap: 8x8 pixels of two images, OOB zeros
//   rows     a 2-D box of 128 consecutive pixels (16 KB contiguous) shifted by the tap (borders wrong: rates only)
//   fresh    a 2-D box of 128 new pixels every k-block (no re-reads: a GEMM's A)
// then three of them at 3 and 12 stages and on half and a quarter of the SMs; then a second path, plain loads
// (ld.global.cg) by 4-14 warps, alone and beside the TMA's walk.
// Found (H200, benchmarks/results/tma_taps_session30_h200.txt): every mode moves a 16 KB box of the image in 0.30-0.40
// us an SM (320-430 rows of 128 bytes a us), whatever the mode, the ring's depth (3-12 stages) or the grid (33-132 CTAs):
// a per-SM rate, not latency and not the whole L2. So tiled boxes buy a 3x3 convolution nothing over im2col; only
// fewer rows through the TMA do (an image tile read once, [Note: halo tiles] in codegen/conv_wgmma.py). The filter's
// box, read by every CTA at the same k-block, costs a sixth as much a row. Plain loads beside the TMA add nothing.
// each with and without the filter's 64x64 box a k-block (+B). No product code depends on this file.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include "proto.cuh"

__device__ __forceinline__ void im2col(uint32_t dst, const CUtensorMap* m, uint32_t bar, int c, int w, int h, int n,
                                       unsigned short ow, unsigned short oh) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};\n"
               :: "r"(dst), "l"(m), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(n), "h"(ow), "h"(oh) : "memory");
}

constexpr int A_BYTES = 128 * 128, B_BYTES = 64 * 128;
struct Geo { int N, H, W, C; };

// mode 0 im2col, 1 slots, 2 blocks, 3 rows (a 2-D box of 128 pixels shifted by the tap), 4 fresh (128 new pixels a k-block);
// withb: the filter box too
template <int STAGES>
__global__ void __launch_bounds__(64, 1) walk(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b,
                                              Geo g, int mode, int withb, int* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  __shared__ __align__(8) uint64_t bars[2 * STAGES];
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem), full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * STAGES;
  const int stage = STAGES > 6 ? A_BYTES : A_BYTES + B_BYTES;   // 12 stages: A alone
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) { mb_init(full0 + 8 * s, 1); mb_init(empty0 + 8 * s, 1); }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  const int cb = g.C / 64, kbs = 9 * cb;
  int tiles;
  if (mode == 0 || mode >= 3) tiles = (g.N * g.H * g.W + 127) / 128;
  else if (mode == 1) tiles = g.N * ((g.H + 1) / 2) * ((g.W + 63) / 64);
  else tiles = ((g.N + 1) / 2) * ((g.H + 7) / 8) * ((g.W + 7) / 8);
  const int per = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int total = per * kbs;
  if (threadIdx.x == 0) {
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      for (int kb = 0; kb < kbs; ++kb, ++it) {
        const int s = it % STAGES;
        if (it >= STAGES) mb_wait(empty0 + 8 * s, ((it / STAGES) - 1) & 1);
        const uint32_t full = full0 + 8 * s, dst = ring + s * stage;
        mb_expect(full, A_BYTES + (withb ? B_BYTES : 0));
        const int tap = kb / cb, c0 = (kb % cb) * 64, kh = tap / 3, kw = tap % 3;
        if (mode == 0) {
          const int m0 = t * 128, n = m0 / (g.H * g.W), r = m0 % (g.H * g.W), oh = r / g.W, ow = r % g.W;
          im2col(dst, &a, full, c0, ow - 1, oh - 1, n, (unsigned short)kw, (unsigned short)kh);
        } else if (mode == 1) {
          const int wt = (g.W + 63) / 64, ht = (g.H + 1) / 2;
          const int n = t / (ht * wt), r = t % (ht * wt), oh0 = (r / wt) * 2, ow0 = (r % wt) * 64;
          tma4(dst, &a, full, c0, ow0 + kw - 1, oh0 + kh - 1, n);
        } else if (mode == 3) {
          tma2(dst, &a, full, c0, max(0, t * 128 + (kh - 1) * g.W + kw - 1));
        } else if (mode == 4) {
          tma2(dst, &a, full, c0, (int)(((long long)t * kbs + kb) * 128 % ((long long)g.N * g.H * g.W - 128)));
        } else {
          const int wt = (g.W + 7) / 8, ht = (g.H + 7) / 8;
          const int n = (t / (ht * wt)) * 2, r = t % (ht * wt), y0 = (r / wt) * 8, x0 = (r % wt) * 8;
          tma4(dst, &a, full, c0, x0 + kw - 1, y0 + kh - 1, n);
        }
        if (withb) tma2(dst + A_BYTES, &b, full, kb * 64, 0);
      }
    }
  } else if (threadIdx.x >= 32) {
    int acc = 0;
    for (int it = 0; it < total; ++it) {
      const int s = it % STAGES;
      mb_wait(full0 + 8 * s, (it / STAGES) & 1);
      acc += smem[s * stage + (threadIdx.x - 32) * 128];
      __syncwarp();
      if (threadIdx.x == 32) mb_arrive(empty0 + 8 * s);
    }
    if (acc == 0x7fffffff) sink[0] = acc;
  }
}


// The LSU path: `warps` warps of each CTA read 16 KB chunks of the image (ld.global.v4, 8 in flight a thread, kept in
// registers and summed), `chunks` of them a CTA, in the `fresh` order (consecutive chunks a CTA). With tma = 1 the CTA's
// thread 0 also runs the `fresh` TMA walk (chunks of its own, into a 6-stage ring freed by warp 1), so both paths run at once.
__global__ void __launch_bounds__(512, 1) lsu_walk(const __grid_constant__ CUtensorMap a, const uint4* img, long long pixels,
                                                  int chunks, int tma, int* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  __shared__ __align__(8) uint64_t bars[12];
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem), full0 = (uint32_t)__cvta_generic_to_shared(bars), empty0 = full0 + 48;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 6; ++s) { mb_init(full0 + 8 * s, 1); mb_init(empty0 + 8 * s, 1); }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  const long long wrap = pixels - 128;
  if (threadIdx.x < 64) {
    if (!tma) return;
    if (threadIdx.x == 0) {
      for (int it = 0; it < chunks; ++it) {
        const int s = it % 6;
        if (it >= 6) mb_wait(empty0 + 8 * s, ((it / 6) - 1) & 1);
        mb_expect(full0 + 8 * s, A_BYTES);
        tma2(ring + s * A_BYTES, &a, full0 + 8 * s, 0, (int)(((long long)blockIdx.x * chunks * 2 + it) * 128 % wrap));
      }
    } else if (threadIdx.x >= 32) {
      int acc = 0;
      for (int it = 0; it < chunks; ++it) {
        const int s = it % 6;
        mb_wait(full0 + 8 * s, (it / 6) & 1);
        acc += smem[s * A_BYTES + (threadIdx.x - 32) * 128];
        __syncwarp();
        if (threadIdx.x == 32) mb_arrive(empty0 + 8 * s);
      }
      if (acc == 0x7fffffff) sink[0] = acc;
    }
    return;
  }
  // LSU readers: threads 64.. ; each chunk is 1024 16-byte vectors, the readers split it
  const int readers = blockDim.x - 64, r = threadIdx.x - 64;
  uint32_t acc = 0;
  for (int it = 0; it < chunks; it += 1) {
    const long long base = (((long long)blockIdx.x * chunks * 2 + chunks + it) * 128 % wrap) * 8;   // in uint4 (8 a pixel)
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = r + j * readers;
      v[j] = e < 1024 ? __ldcg(img + base + e) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].w;
    if (readers * 8 < 1024) {
      for (int e = r + 8 * readers; e < 1024; e += readers) acc ^= __ldcg(img + base + e).y;
    }
  }
  if (acc == 0x7fffffffu) sink[0] = acc;
}

int main(int argc, char** argv) {
  Geo g{32, 56, 56, 64};
  if (argc >= 5) g = Geo{atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4])};
  CU(cuInit(0));
  CK(cudaFree(0));
  const size_t img = (size_t)g.N * g.H * g.W * g.C, filt = (size_t)64 * 9 * g.C;
  std::vector<uint16_t> h(img);
  for (size_t i = 0; i < img; ++i) h[i] = (uint16_t)(0x3c00 | (i * 2654435761u >> 22 & 0x3ff));
  void *dimg, *dfilt; int* sink;
  CK(cudaMalloc(&dimg, img * 2)); CK(cudaMalloc(&dfilt, filt * 2)); CK(cudaMalloc(&sink, 4));
  CK(cudaMemcpy(dimg, h.data(), img * 2, cudaMemcpyHostToDevice)); CK(cudaMemset(dfilt, 0, filt * 2));
  cuuint64_t dims[4] = {(cuuint64_t)g.C, (cuuint64_t)g.W, (cuuint64_t)g.H, (cuuint64_t)g.N};
  cuuint64_t strides[3] = {(cuuint64_t)g.C * 2, (cuuint64_t)g.W * g.C * 2, (cuuint64_t)g.H * g.W * g.C * 2};
  cuuint32_t es[4] = {1, 1, 1, 1};
  CUtensorMap m_im2col, m_slots, m_blocks, m_b;
  int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  CU(cuTensorMapEncodeIm2col(&m_im2col, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, dimg, dims, strides, lower, upper, 64, 128, es,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  cuuint32_t box_s[4] = {64, 64, 2, 1}, box_b[4] = {64, 8, 8, 2};
  CU(cuTensorMapEncodeTiled(&m_slots, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, dimg, dims, strides, box_s, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  CU(cuTensorMapEncodeTiled(&m_blocks, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, dimg, dims, strides, box_b, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  cuuint64_t fd[2] = {(cuuint64_t)9 * g.C, 64}, fs[1] = {(cuuint64_t)9 * g.C * 2};
  cuuint32_t fb[2] = {64, 64}, fe[2] = {1, 1};
  CU(cuTensorMapEncodeTiled(&m_b, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, dfilt, fd, fs, fb, fe, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  CUtensorMap m_rows;
  cuuint64_t rd[2] = {(cuuint64_t)g.C, (cuuint64_t)g.N * g.H * g.W}, rs[1] = {(cuuint64_t)g.C * 2};
  cuuint32_t rb[2] = {64, 128}, re[2] = {1, 1};
  CU(cuTensorMapEncodeTiled(&m_rows, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, dimg, rd, rs, rb, re, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  const int smem6 = 6 * (A_BYTES + B_BYTES) + 1024, smem12 = 12 * A_BYTES + 1024, smem3 = 3 * (A_BYTES + B_BYTES) + 1024;
  CK(cudaFuncSetAttribute(walk<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem6));
  CK(cudaFuncSetAttribute(walk<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem3));
  CK(cudaFuncSetAttribute(walk<12>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem12));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const char* names[5] = {"im2col", "slots ", "blocks", "rows  ", "fresh "};
  const CUtensorMap* maps[5] = {&m_im2col, &m_slots, &m_blocks, &m_rows, &m_rows};
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  printf("image %dx%dx%dx%d fp16 NHWC (%.1f MB), 3x3 taps, 16 KB of A (+8 KB B) a k-block\n", g.N, g.H, g.W, g.C, img * 2 / 1e6);
  struct Case { int mode, withb, stages, grid; };
  std::vector<Case> cases;
  for (int mode = 0; mode < 5; ++mode) for (int withb = 0; withb < 2; ++withb) cases.push_back({mode, withb, 6, sms});
  for (int mode : {0, 3, 4}) { cases.push_back({mode, 0, 3, sms}); cases.push_back({mode, 0, 12, sms});
                               cases.push_back({mode, 0, 6, sms / 2}); cases.push_back({mode, 0, 6, sms / 4}); }
  const int only = argc == 6 ? atoi(argv[5]) : -1;   // 5th argument: start at case `only`
  for (size_t ci = only < 0 ? 0 : only; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    auto launch = [&]() {
      if (c.stages == 6) walk<6><<<c.grid, 64, smem6>>>(*maps[c.mode], m_b, g, c.mode, c.withb, sink);
      else if (c.stages == 3) walk<3><<<c.grid, 64, smem3>>>(*maps[c.mode], m_b, g, c.mode, c.withb, sink);
      else walk<12><<<c.grid, 64, smem12>>>(*maps[c.mode], m_b, g, c.mode, c.withb, sink);
    };
    for (int i = 0; i < 3; ++i) launch();
    CK(cudaEventRecord(e0));
    const int reps = 20;
    for (int i = 0; i < reps; ++i) launch();
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = ms * 1e3 / reps;
    const int mode = c.mode;
    int tiles = (mode == 0 || mode >= 3) ? (g.N * g.H * g.W + 127) / 128 : mode == 1 ? g.N * ((g.H + 1) / 2) * ((g.W + 63) / 64)
                                                                          : ((g.N + 1) / 2) * ((g.H + 7) / 8) * ((g.W + 7) / 8);
    const double kbs = (double)tiles * 9 * (g.C / 64), per_sm = (double)((tiles + c.grid - 1) / c.grid) * 9 * (g.C / 64);
    printf("%s%s stages %2d CTAs %3d  %8.2f us a launch  tiles %4d  k-blocks a busiest CTA %5.0f: %.3f us each, %.0f A rows/us a CTA, %.2f TB/s from L2\n",
           names[mode], c.withb ? " +B" : "   ", c.stages, c.grid, us, tiles, per_sm, us / per_sm, per_sm * 128 / us,
           kbs * (A_BYTES + (c.withb ? B_BYTES : 0)) / us / 1e6);
  }

  {
    CK(cudaFuncSetAttribute(lsu_walk, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * A_BYTES + 1024));
    const long long pixels = (long long)g.N * g.H * g.W;
    const int chunks = 54;
    struct L { int threads, tma; const char* what; };
    for (L l : {L{64, 1, "TMA alone (2 warps)     "}, L{64 + 128, 0, "LSU alone, 4 warps      "}, L{64 + 256, 0, "LSU alone, 8 warps      "},
                L{64 + 448, 0, "LSU alone, 14 warps     "}, L{64 + 128, 1, "TMA + LSU 4 warps       "}, L{64 + 256, 1, "TMA + LSU 8 warps       "}}) {
      auto launch = [&]() { lsu_walk<<<sms, l.threads, 6 * A_BYTES + 1024>>>(m_rows, (const uint4*)dimg, pixels, chunks, l.tma, sink); };
      for (int i = 0; i < 3; ++i) launch();
      CK(cudaEventRecord(e0));
      for (int i = 0; i < 20; ++i) launch();
      CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / 20;
      const int paths = (l.tma ? 1 : 0) + (l.threads > 64 ? 1 : 0);
      printf("%s %3d CTAs x %d chunks of 16 KB a path: %7.2f us, %.0f GB/s an SM, %.2f TB/s in all\n", l.what, sms, chunks, us,
             paths * chunks * 16384.0 / us / 1e3, paths * (double)sms * chunks * 16384.0 / us / 1e6);
    }
  }
  return 0;
}
