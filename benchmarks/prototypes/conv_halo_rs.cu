// A 3x3 convolution with its A operand in registers (issue 17, session 30): what image tiles buy when the taps'
// shifted reads cost the tensor cores nothing. No product code depends on this file.
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/conv_halo_rs benchmarks/prototypes/conv_halo_rs.cu -lcuda
//   /tmp/conv_halo_rs [N]        # ResNet-50 stage 1: N x 56 x 56 x 64 -> 64 channels, stride 1, pad 1; default N = 32
// One CTA an SM, persistent: a producer thread and two consumer warpgroups that take whole tiles in turn (each
// warpgroup's epilogue runs while the other's products are on the tensor cores). A tile is 8x8 output pixels of one
// image (m64); its 10x10 image pixels (64 channels, 128-byte rows, 128-byte swizzle) land by one TMA copy with zeros
// outside the image, and every tap reads them through ldmatrix at its own shift, the swizzle undone per row, into
// registers for wgmma (A from registers, m64n64k16); the filter (64 x 576) stays in shared memory for the whole run.
// Epilogue: + bias, ReLU (a folded BatchNorm's), fp16, staged in shared memory, 16-byte stores of whole pixels.
// The im2col kernel of the compiler pulls 9 rows through the TMA per output pixel, this one 100/64.
// Compile-time variants: NB (images a tile), NCONS (consumer warpgroups), AREGS (register sets of A), TMA_OUT (the epilogue
// through one TMA store a tile), PP / OFFSET (warpgroups taking turns), NO_EPI / NO_LDM (timing only: wrong results).
// Measured (H200, benchmarks/results/conv_halo_rs_session30_h200.txt), N = 32, 20 launches in one CUDA graph: the best,
// -DNCONS=3 -DTMA_OUT -DAREGS=1, 15.0 us (49.8% of 989 TFLOP/s) against the compiler's im2col kernel's 20.2-20.7 us;
// two warpgroups 15.4-15.9; turns (PP) slower (16.2-18.1); without the epilogue 12.9, without the A loads 13.5.
// At N = 1 (49 tiles) 3.7-3.9 us, about what the compiler's picks run.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include "proto.cuh"

constexpr int C = 64, KO = 64, H = 56, W = 56, T = 8, HALO = T + 2, KTOT = 9 * C;
#ifndef NB
#define NB 1      // images a tile (m64 blocks a warpgroup): 8x8 pixels of each
#endif
#ifndef NCONS
#define NCONS 2   // consumer warpgroups (each takes whole tiles in turn)
#endif
constexpr int THREADS = 128 * (NCONS + 1);
constexpr int SLOTS = 2 * NCONS, SLOT_BYTES = (NB * 100 * 128 + 1023) / 1024 * 1024;   // NB x 100 rows of 128 bytes, whole atoms
constexpr int B_BYTES = 9 * KO * 128;                        // the filter: one 64 x 64 box a tap
constexpr int LDS = C + 8;                                   // staging row, halves (144 bytes: no bank conflicts)
#ifdef TMA_OUT
constexpr int STAGE_BYTES = NB * 64 * 128;                   // NB x 64 pixel rows of 128 bytes, 128-byte swizzle (the store's map)
#else
constexpr int STAGE_BYTES = 64 * LDS * 2;
#endif
constexpr int SMEM = 1024 + B_BYTES + SLOTS * SLOT_BYTES + NCONS * STAGE_BYTES;
#ifndef AREGS
#define AREGS 2   // register sets of A: AREGS - 1 taps' products in flight while the next tap's rows load
#endif

__device__ __forceinline__ uint64_t desc(uint32_t addr) {   // 128-byte swizzle, K-major, 8-row groups 1024 bytes apart
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void ldm4(uint32_t (&a)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}
__device__ __forceinline__ void hold(float (&d)[32]) {
  asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) :: "memory");
}
// D (64 x 64 fp32) += A (64 x 16 from registers) x B (16 x 64 by descriptor); scale_d = 0 starts the sums
__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d) : "memory");
}

__global__ void __launch_bounds__(THREADS, 1) conv(const __grid_constant__ CUtensorMap img, const __grid_constant__ CUtensorMap filt, const __grid_constant__ CUtensorMap omap,
                                              __half* out, const float* __restrict__ bias, int n_img) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* smem = (unsigned char*)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
  __shared__ __align__(8) uint64_t bars[1 + 2 * SLOTS];
  const uint32_t sb = (uint32_t)__cvta_generic_to_shared(smem), slots = sb + B_BYTES, stage0 = slots + SLOTS * SLOT_BYTES;
  const uint32_t bfull = (uint32_t)__cvta_generic_to_shared(bars), full0 = bfull + 8, empty0 = full0 + 8 * SLOTS;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    mb_init(bfull, 1);
    for (int s = 0; s < SLOTS; ++s) { mb_init(full0 + 8 * s, 1); mb_init(empty0 + 8 * s, 4); }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  const int tiles_x = W / T, tiles_y = H / T, tiles = n_img / NB * tiles_x * tiles_y;
  const int mine = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  if (wg == NCONS) {
#if NCONS > 2
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
#elif NB > 1
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
#endif
    if (tid != 128 * NCONS) return;
    mb_expect(bfull, B_BYTES);
    for (int t = 0; t < 9; ++t) tma2(sb + t * KO * 128, &filt, bfull, t * C, 0);
    for (int j = 0; j < mine; ++j) {
      const int s = j % SLOTS, tile = blockIdx.x + j * gridDim.x;
      if (j >= SLOTS) mb_wait(empty0 + 8 * s, ((j / SLOTS) - 1) & 1);
      const int n = tile / (tiles_x * tiles_y) * NB, r = tile % (tiles_x * tiles_y), y0 = r / tiles_x * T, x0 = r % tiles_x * T;
      mb_expect(full0 + 8 * s, NB * HALO * HALO * 128);
      tma4(slots + s * SLOT_BYTES, &img, full0 + 8 * s, 0, x0 - 1, y0 - 1, n);
    }
    return;
  }
#if NCONS > 2
  asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n");
#elif NB > 1
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
#endif
  const int t128 = tid % 128, warp = t128 / 32, lane = t128 % 32;
  // this lane's ldmatrix row: pixel p of the tile (rows 16 warp .. + 15), k-chunk half
  const int p = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), py = p / T, px = p % T, khalf = lane >> 4;
  const uint32_t stage = stage0 + wg * STAGE_BYTES;
  __half* st = reinterpret_cast<__half*>(smem + B_BYTES + SLOTS * SLOT_BYTES + wg * STAGE_BYTES);
  float bias_r[16];   // this thread's 16 columns' biases, loaded once
#pragma unroll
  for (int jn = 0; jn < 8; ++jn) { bias_r[2 * jn] = bias[8 * jn + 2 * (lane & 3)]; bias_r[2 * jn + 1] = bias[8 * jn + 2 * (lane & 3) + 1]; }
  mb_wait(bfull, 0);
  for (int j = wg; j < mine; j += NCONS) {
    const int s = j % SLOTS, tile = blockIdx.x + j * gridDim.x;
#ifdef OFFSET
    // the second warpgroup starts once the first has issued its first tile's products: the two then run half a tile
    // apart, each one's epilogue under the other's products
    if (j == 1) asm volatile("bar.sync 4, 256;\n" ::: "memory");
#endif
#ifdef PP
    // the mainloops take turns: this one starts once the other warpgroup has issued all of its products, so one
    // warpgroup's epilogue runs under the other's products
    if (j > 0) asm volatile("bar.sync %0, 256;\n" :: "r"(3 + wg) : "memory");
#endif
    mb_wait(full0 + 8 * s, (j / SLOTS) & 1);
    const uint32_t base = slots + s * SLOT_BYTES;
    float d[NB][32];
    uint32_t a[AREGS][NB][4][4];
#pragma unroll
    for (int tap = 0; tap < 9; ++tap) {
      const int kh = tap / 3, kw = tap % 3;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int R = b * HALO * HALO + (py + kh) * HALO + (px + kw);
        const uint32_t row = base + R * 128;
#ifdef NO_LDM
        for (int kk = 0; kk < 4; ++kk) for (int e = 0; e < 4; ++e) a[tap % AREGS][b][kk][e] = 0x3c003c00u ^ (row + kk);
#else
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) ldm4(a[tap % AREGS][b][kk], row + (((2 * kk + khalf) ^ (R & 7)) << 4));
#endif
      }
      if (tap > 0) for (int b = 0; b < NB; ++b) hold(d[b]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int b = 0; b < NB; ++b) mma_rs(d[b], a[tap % AREGS][b][kk], desc(sb + tap * KO * 128 + kk * 32), tap > 0 || kk > 0);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(AREGS - 1) : "memory");   // the oldest set's products are done
    }
#ifdef OFFSET
    if (j == 0 && mine > 1) asm volatile("bar.arrive 4, 256;\n" ::: "memory");
#endif
#ifdef PP
    if (j + 1 < mine) asm volatile("bar.arrive %0, 256;\n" :: "r"(3 + (wg ^ 1)) : "memory");   // the other's turn
#endif
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int b = 0; b < NB; ++b) hold(d[b]);
    __syncwarp();
    if (lane == 0) mb_arrive(empty0 + 8 * s);   // this warp's reads of the image tile are done
#ifdef NO_EPI
    if (d[0][0] == 12345.f) out[tile] = __float2half(d[NB - 1][1]);
    continue;
#endif
    // epilogue: fp16 into this warpgroup's staging (row = pixel), then 16-byte stores of whole pixels, an image at a time
    const int n0 = tile / (tiles_x * tiles_y) * NB, r = tile % (tiles_x * tiles_y), y0 = r / tiles_x * T, x0 = r % tiles_x * T;
#ifdef TMA_OUT
    // or: every image's rows staged in the store map's 128-byte swizzle, then one TMA store of the tile's box, which
    // writes while this warpgroup goes on; its reads of the staging are waited for before the next tile's writes
    if (t128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int g = lane >> 2;
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
        const int col = 8 * jn + 2 * (lane & 3), r0 = b * 64 + 16 * warp + g, r1 = r0 + 8;
        const float b0 = bias_r[2 * jn], b1 = bias_r[2 * jn + 1];
        *reinterpret_cast<__half2*>(st + r0 * 64 + ((jn ^ (r0 & 7)) << 3) + 2 * (lane & 3)) =
            __floats2half2_rn(fmaxf(d[b][4 * jn] + b0, 0.f), fmaxf(d[b][4 * jn + 1] + b1, 0.f));
        *reinterpret_cast<__half2*>(st + r1 * 64 + ((jn ^ (r1 & 7)) << 3) + 2 * (lane & 3)) =
            __floats2half2_rn(fmaxf(d[b][4 * jn + 2] + b0, 0.f), fmaxf(d[b][4 * jn + 3] + b1, 0.f));
        (void)col;
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // the writes, visible to the TMA
    asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");
    if (t128 == 0) {
      asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                   :: "l"(&omap), "r"(stage), "r"(0), "r"(x0), "r"(y0), "r"(n0) : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
    continue;
#endif
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");   // the last copy-out has read the staging
      const int g = lane >> 2;
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
        const int col = 8 * jn + 2 * (lane & 3), r0 = 16 * warp + g;
        const float b0 = bias_r[2 * jn], b1 = bias_r[2 * jn + 1];
        *reinterpret_cast<__half2*>(st + r0 * LDS + col) = __floats2half2_rn(fmaxf(d[b][4 * jn] + b0, 0.f), fmaxf(d[b][4 * jn + 1] + b1, 0.f));
        *reinterpret_cast<__half2*>(st + (r0 + 8) * LDS + col) = __floats2half2_rn(fmaxf(d[b][4 * jn + 2] + b0, 0.f), fmaxf(d[b][4 * jn + 3] + b1, 0.f));
      }
      asm volatile("bar.sync %0, 128;\n" :: "r"(1 + wg) : "memory");
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int ch = t128 + 128 * i, pr = ch / 8, c8 = ch % 8;
        const int y = y0 + pr / T, x = x0 + pr % T;
        const uint4 v = *reinterpret_cast<const uint4*>(st + pr * LDS + c8 * 8);
        *reinterpret_cast<uint4*>(out + (((size_t)(n0 + b) * H + y) * W + x) * KO + c8 * 8) = v;
      }
    }
  }
#ifdef TMA_OUT
  if (t128 == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
  (void)stage;
}

int main(int argc, char** argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 32;
  CU(cuInit(0));
  CK(cudaFree(0));
  const size_t ni = (size_t)N * H * W * C, nf = (size_t)KO * KTOT, no = (size_t)N * H * W * KO;
  std::vector<__half> hi(ni), hf(nf), ho(no);
  uint32_t seed = 12345;
  auto rnd = [&]() { seed = seed * 1664525u + 1013904223u; return ((seed >> 8) & 0xffff) / 65536.0f - 0.5f; };
  for (auto& v : hi) v = __float2half(rnd());
  for (auto& v : hf) v = __float2half(rnd() * 0.25f);
  __half *di, *df, *dout;
  CK(cudaMalloc(&di, ni * 2)); CK(cudaMalloc(&df, nf * 2)); CK(cudaMalloc(&dout, no * 2));
  CK(cudaMemcpy(di, hi.data(), ni * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(df, hf.data(), nf * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xff, no * 2));
  std::vector<float> hb(KO);
  for (auto& v : hb) v = rnd();
  float* dbias; CK(cudaMalloc(&dbias, KO * 4)); CK(cudaMemcpy(dbias, hb.data(), KO * 4, cudaMemcpyHostToDevice));   // NaN: an output never written fails the check
  CUtensorMap mi, mf;
  cuuint64_t dims[4] = {C, W, H, (cuuint64_t)N}, str[3] = {C * 2, W * C * 2, (cuuint64_t)H * W * C * 2};
  cuuint32_t box[4] = {C, HALO, HALO, NB}, es[4] = {1, 1, 1, 1};
  CU(cuTensorMapEncodeTiled(&mi, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, di, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  cuuint64_t fd[2] = {KTOT, KO}, fs[1] = {KTOT * 2};
  cuuint32_t fb[2] = {64, 64}, fe[2] = {1, 1};
  CU(cuTensorMapEncodeTiled(&mf, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, df, fd, fs, fb, fe, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  CUtensorMap mo;
  cuuint32_t obox[4] = {KO, T, T, NB};
  cuuint64_t odims[4] = {KO, W, H, (cuuint64_t)N}, ostr[3] = {KO * 2, W * KO * 2, (cuuint64_t)H * W * KO * 2};
  CU(cuTensorMapEncodeTiled(&mo, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, dout, odims, ostr, obox, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  CK(cudaFuncSetAttribute(conv, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = N / NB * (H / T) * (W / T), grid = tiles < sms ? tiles : sms;
  conv<<<grid, THREADS, SMEM>>>(mi, mf, mo, dout, dbias, N);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(ho.data(), dout, no * 2, cudaMemcpyDeviceToHost));
  // check: every output of two images (the first and the last) and 4096 others against float64 sums of the same halves
  double worst = 0, peak = 0; size_t bad = 0, checked = 0;
  auto ref = [&](int n, int y, int x, int k) {
    double s = 0;
    for (int kh = 0; kh < 3; ++kh) for (int kw = 0; kw < 3; ++kw) {
      const int iy = y + kh - 1, ix = x + kw - 1;
      if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
      for (int c = 0; c < C; ++c)
        s += (double)__half2float(hi[(((size_t)n * H + iy) * W + ix) * C + c]) * (double)__half2float(hf[(size_t)k * KTOT + (kh * 3 + kw) * C + c]);
    }
    return s;
  };
  auto one = [&](int n, int y, int x, int k) {
    const double r = std::fmax(ref(n, y, x, k) + hb[k], 0.0), g = __half2float(ho[(((size_t)n * H + y) * W + x) * KO + k]);
    const double e = std::fabs(g - r);
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
    peak = std::fmax(peak, std::fabs(r)); ++checked;
    if (!(e <= 1e-2 * 4)) ++bad;
  };
  for (int n : {0, N - 1}) for (int y = 0; y < H; ++y) for (int x = 0; x < W; ++x) for (int k = 0; k < KO; k += 7) one(n, y, x, k);
  for (int i = 0; i < 4096; ++i) { seed = seed * 1664525u + 1013904223u; const uint32_t v = seed;
    one(v % N, (v >> 5) % H, (v >> 11) % W, (v >> 17) % KO); }
  printf("N %d: %zu outputs checked, max |err| %.3e, max |ref| %.3e (%.2e of it), %zu over 4e-2: %s\n", N, checked, worst, peak,
         worst / peak, bad, (bad == 0 && std::isfinite(worst)) ? "PASS" : "FAIL");
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) conv<<<grid, THREADS, SMEM>>>(mi, mf, mo, dout, dbias, N);
  const int reps = 50;
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) conv<<<grid, THREADS, SMEM>>>(mi, mf, mo, dout, dbias, N);
  CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
  float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = ms * 1e3 / reps, flop = 2.0 * N * H * W * KO * KTOT;
  printf("N %d: %d tiles of %d x 8x8 on %d CTAs: %.2f us a launch (back to back), %.1f TFLOP/s, %.1f%% of 989\n", N, tiles, NB, grid, us,
         flop / us / 1e6, flop / us / 1e6 / 989.4 * 100);
  // as the compiler's profiles time a kernel: 20 launches captured in one CUDA graph, the replays timed
  cudaStream_t cs; CK(cudaStreamCreate(&cs));
  cudaGraph_t gr; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) conv<<<grid, THREADS, SMEM, cs>>>(mi, mf, mo, dout, dbias, N);
  CK(cudaStreamEndCapture(cs, &gr)); CK(cudaGraphInstantiate(&ge, gr, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, cs));
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    CK(cudaEventRecord(e0, cs)); CK(cudaGraphLaunch(ge, cs)); CK(cudaEventRecord(e1, cs)); CK(cudaEventSynchronize(e1));
    float m; CK(cudaEventElapsedTime(&m, e0, e1)); t.push_back(m * 1e3f / 20);
  }
  std::sort(t.begin(), t.end());
  printf("N %d: %.2f us a launch (graph of 20, median of 15 replays), %.1f%% of 989\n", N, t[7], flop / t[7] / 1e6 / 989.4 * 100);
  return 0;
}
