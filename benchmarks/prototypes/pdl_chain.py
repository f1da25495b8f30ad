"""Prototype (issue 19): where a one-block kernel's time goes in a chain of dependent launches.

In the decode step's timeline a one-block kernel spends about 2 us from its go (its griddepcontrol.wait
returning) to its exit: the cos table reads 32 floats the kernel before it wrote, takes cosf and stores 64 halves
in 2.3 us, where the same work on data written long before takes 0.35 us (cold_code.py). Here a producer of one
block writes 64 floats and a consumer launched dependent on it (cuLaunchKernelEx with programmatic
serialization, as aicf_run/pdl.py launches a plan's kernels) waits, then does one of:

- copy: reads the producer's floats and stores them;
- cos: reads them, stores their cosf;
- const cos: reads floats no kernel wrote (an input) and stores their cosf;
- none: stores a constant (no load).

Each kernel stamps %globaltimer at its thread 0's start, after its wait (go) and as it leaves; prints the
medians of the consumer's go -> exit and of the producer's exit -> the consumer's go, dependent and plain.

    python3 benchmarks/prototypes/pdl_chain.py [--rounds 50]

Measured on an H200 (session 54, call 8 of benchmarks/results/prologue_session54_h200.txt): in a graph, the
consumer's go -> exit 0.19 (copy), 0.26 (cos, either input), 0.03 us (no load); the producer's exit -> the
consumer's go 0.35-0.38 us, whether the consumer landed 30 us early or not (0.58-0.61 launched from a stream).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SOURCE = r"""
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t;
}
__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

extern "C" __global__ void producer(float* out, unsigned long long* st, int spin_ns) {
  if (threadIdx.x == 0) st[0] = now();
  wait(); trigger();
  const unsigned long long t0 = now();
  if (threadIdx.x == 0) st[1] = t0;
  out[threadIdx.x] = 0.5f * threadIdx.x + 700.0f;
  while (now() < t0 + spin_ns) {}   // the consumer lands and waits meanwhile (as in a plan's chain)
  __syncthreads();
  if (threadIdx.x == 0) st[2] = now();
}
#define CONSUMER(NAME, BODY) \
extern "C" __global__ void NAME(float* out, const float* in, const float* input, unsigned long long* st) { \
  if (threadIdx.x == 0) st[3] = now(); \
  wait(); trigger(); \
  if (threadIdx.x == 0) st[4] = now(); \
  BODY; \
  __syncthreads(); \
  if (threadIdx.x == 0) st[5] = now(); \
}
CONSUMER(copy, out[threadIdx.x] = in[threadIdx.x])
CONSUMER(cos_, out[threadIdx.x] = cosf(in[threadIdx.x]))
CONSUMER(const_cos, out[threadIdx.x] = cosf(input[threadIdx.x]))
CONSUMER(none, out[threadIdx.x] = 1.0f)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv
    from aicf_run.graph import Graph
    from aicf_run.pdl import DependentLaunch, Modules
    from aicfc.codegen.nvcc import build
    cubin = build(SOURCE, "sm_90").cubin
    modules = Modules([cubin])
    buf, out, inp = drv.mem_alloc(256), drv.mem_alloc(256), drv.to_device(np.linspace(600, 760, 64, dtype=np.float32))
    st = drv.mem_alloc(8 * 6)
    stream = drv.Stream()
    what = "prototype"

    def launcher(name: str, pointers: tuple) -> DependentLaunch:
        # every argument goes as a 64-bit word; the producer's int spin reads the low 4 bytes (little-endian)
        return DependentLaunch(modules, modules.function(0, name, 0, what), (1, 1, 1), (64, 1, 1), 0, pointers, what)

    for spin in (0, 30000):
        prod = launcher("producer", (int(buf), int(st), spin))
        for name in ("copy", "cos_", "const_cos", "none"):
            cons = launcher(name, (int(out), int(buf), int(inp), int(st)))
            for mode in ("stream", "graph"):
                graph = None
                if mode == "graph":   # captured as a plan's kernels are (aicf_run/graph.py)
                    graph = Graph.capture(stream, lambda: (prod(stream.handle), cons(stream.handle)))
                    graph.upload(stream)
                go_exit, gap, early = [], [], []
                for _ in range(args.rounds):
                    if graph is None:
                        prod(stream.handle)
                        cons(stream.handle)
                    else:
                        graph.launch(stream)
                    stream.synchronize()
                    s = np.empty(6, np.uint64)
                    drv.memcpy_dtoh(s, st)
                    s = s.astype(np.int64)
                    go_exit.append((s[5] - s[4]) / 1e3)
                    gap.append((s[4] - s[2]) / 1e3)
                    early.append((s[2] - s[3]) / 1e3)
                if graph is not None:
                    graph.close()
                print(f"producer spin {spin:5d} ns  {name:10} {mode:6} consumer go->exit median {np.median(go_exit):5.2f} us;"
                      f" producer exit -> consumer go {np.median(gap):5.2f} us; consumer landed {np.median(early):6.2f} us"
                      f" before the producer's exit", flush=True)


if __name__ == "__main__":
    main()
