"""Prototype (issue 19): does a small kernel of a decode step pay for its code's cold instruction fetches?

A decode step streams about 2 GB of weights through a 50 MB L2, so the code of every kernel may be gone from
L2 by the time the kernel runs again one step later. Ten small kernels of distinct code (one block; each
loads 64 floats, takes cosf, stores) run back to back on one stream, each stamping %globaltimer as its
thread 0 starts and as it leaves; three cases:

- hot: the ten run again right after themselves (their code in L2 and in the SMs' instruction caches);
- flushed: a 256 MB read with plain loads runs before them (every L2 line replaced);
- flushed, evict-first: the same read with ld.global.cs (evict-first in L2: streaming weights as the gemv reads them);
- flushed, big code: the plain read, then a kernel of about 256 KB of straight-line code on every SM (the
  instruction caches replaced too, as a decode step's other kernels replace them).

Prints each kernel's median time from its start to its exit, and from one kernel's exit to the next one's start.

    python3 benchmarks/prototypes/cold_code.py [--rounds 30]

Measured on an H200 (session 54, benchmarks/results/cold_code_session54_h200.txt and, with big code, call 7 of
prologue_session54_h200.txt): 0.35-0.38 us from start to exit in every case (the first kernel after a flush
0.48-0.54), so cold code costs a one-block kernel about 0.15 us. (The 2 us such a kernel took in the decode
plan's timeline came from the inputs the timeline ran on: plan_prefix.py.)
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

KERNELS = 10
BIG = 16000   # FFMAs of big_code: about 256 KB of code
SOURCE = r"""
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t;
}
{% for i in range(K) %}
extern "C" __global__ void __launch_bounds__(64) tiny{{ i }}(float* out, const float* in, unsigned long long* st) {
  if (threadIdx.x == 0) st[2 * {{ i }}] = now();
  float v = in[threadIdx.x] * {{ 1.0 + i * 0.37 }}f + {{ i }}.0f;
  out[threadIdx.x + 64 * {{ i }}] = cosf(v) + sinf(v * {{ 0.5 + i }}f);
  __syncthreads();
  if (threadIdx.x == 0) st[2 * {{ i }} + 1] = now();
}
{% endfor %}
// Straight-line code of about 256 KB (16 bytes an FFMA): run on every SM, it replaces what the SMs' instruction
// caches held, as the ~100 other kernels of a decode step do between two runs of one kernel.
extern "C" __global__ void big_code(float* sink, float seed) {
  float x = seed + threadIdx.x;
{% for j in range(BIG) %}  x = x * {{ 1.0 + (j % 97) * 1e-7 }}f + {{ (j % 89) * 1e-6 }}f;
{% endfor %}  if (x == 1234.5f) sink[0] = x;
}
extern "C" __global__ void flush(const int4* buf, unsigned long long n, int* sink, int streaming) {
  int acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    int4 v = streaming ? __ldcs(buf + i) : buf[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) sink[0] = acc;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import jinja2
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv
    from pycuda.compiler import SourceModule
    mod = SourceModule(jinja2.Template(SOURCE).render(K=KERNELS, BIG=BIG), no_extern_c=True, arch="sm_90")
    big = mod.get_function("big_code")
    tiny = [mod.get_function(f"tiny{i}") for i in range(KERNELS)]
    flush = mod.get_function("flush")
    n = 256 * 2**20 // 16
    buf = drv.mem_alloc(n * 16)
    drv.memset_d8(buf, 1, n * 16)
    sink = drv.mem_alloc(4)
    x = drv.to_device(np.random.default_rng(0).standard_normal(64).astype(np.float32))
    out = drv.mem_alloc(4 * 64 * KERNELS)
    st = drv.mem_alloc(8 * 2 * KERNELS)
    stream = drv.Stream()

    def chain() -> np.ndarray:
        for f in tiny:
            f(out, x, st, block=(64, 1, 1), grid=(1, 1), stream=stream)
        stream.synchronize()
        s = np.empty(2 * KERNELS, np.uint64)
        drv.memcpy_dtoh(s, st)
        return s.astype(np.int64)

    cases = {"hot": None, "flushed": 0, "flushed, evict-first": 1, "flushed, big code": 2}
    times: dict[str, list[np.ndarray]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for case, streaming in cases.items():
            chain()   # warm: the code in the instruction caches
            if streaming is not None:
                flush(buf, np.uint64(n), sink, np.int32(streaming == 1), block=(256, 1, 1), grid=(132 * 8, 1), stream=stream)
                if streaming == 2:
                    big(sink, np.float32(1.0), block=(32, 1, 1), grid=(132 * 4, 1), stream=stream)
                stream.synchronize()
            times[case].append(chain())
    for case, rows in times.items():
        s = np.stack(rows)
        run = np.median(s[:, 1::2] - s[:, 0::2], axis=0) / 1e3
        gap = np.median(s[:, 2::2] - s[:, 1:-1:2], axis=0) / 1e3
        print(f"{case:22} start->exit us: {' '.join(f'{v:5.2f}' for v in run)}   (median {statistics.median(run):.2f})")
        print(f"{'':22} exit->next start: {' '.join(f'{v:5.2f}' for v in gap)}   (median {statistics.median(gap):.2f})")


if __name__ == "__main__":
    main()
