"""The compute-sanitizer target for the Hopper GEMM engine: each wgmma variant run once on fresh
random inputs (ping-pong and cooperative with an erf-GELU epilogue, split-k, partial edge tiles, 2-CTA
clusters with TMA multicast, k-splits as a cluster in GEMMs and convolutions, stream-k, tile widths between the
standard ones, the taps unit, the pool unit), and the gemv's
tensor-core steps (splits by cluster and by scratch), and the split decode attention's chunks merged
as a cluster, its output checked finite. Run it under the sanitizer on a GPU machine:

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_gemm.py
    compute-sanitizer --tool racecheck --racecheck-report analysis python3 benchmarks/sanitize_gemm.py

Words after the script keep the cases whose name holds one: `... sanitize_gemm.py cluster` runs the
2-CTA cluster cases alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aicfc  # noqa: E402
from benchmarks.gemm import matmul_model  # noqa: E402
from tests.onnx_builders import conv_model  # noqa: E402
from tests.test_attention_split import decode_attention, inputs_at  # noqa: E402
from tests.test_gemm_gpu import b_transposed_input  # noqa: E402
from tests.test_cost_wgmma import _gelu as gelu_model  # noqa: E402  (BERT's FFN1: MatMul + bias + erf-GELU)


def main() -> int:
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    rng = np.random.default_rng(0)
    dev = open_device()
    cases = [("gelu 512x768x3072 ping-pong", gelu_model(512, 768, 3072), {"unit": "wgmma", "PP": 1}),
             ("gelu 512x768x3072 cooperative", gelu_model(512, 768, 3072), {"unit": "wgmma", "PP": 0}),
             ("split-k 128x3072x768", matmul_model(128, 3072, 768, rng.standard_normal((3072, 768)).astype(np.float32)),
              {"unit": "wgmma", "SPLITK": 4}),
             ("edges 300x520x392 ping-pong", matmul_model(300, 520, 392, rng.standard_normal((520, 392)).astype(np.float32)),
              {"unit": "wgmma", "PP": 1}),
             # 2-CTA clusters with B multicast: 5 tile rows of 64 (the last pair's second tile past M), both
             # schedules, and the GELU epilogue
             ("cluster edges 300x520x392 ping-pong", matmul_model(300, 520, 392, rng.standard_normal((520, 392)).astype(np.float32)),
              {"unit": "wgmma", "PP": 1, "CLUSTER": 2}),
             ("cluster edges 300x520x392 cooperative", matmul_model(300, 520, 392, rng.standard_normal((520, 392)).astype(np.float32)),
              {"unit": "wgmma", "PP": 0, "NWG": 2, "MI": 1, "CLUSTER": 2}),
             ("cluster gelu 512x768x3072", gelu_model(512, 768, 3072), {"unit": "wgmma", "CLUSTER": 2}),
             # k-splits as a cluster ([Note: k-splits as a cluster] in codegen/gemm_wgmma.py): the splits add through
             # distributed shared memory, two and four a cluster, one and two consumer warpgroups
             ("split cluster 2x2wg 200x1024x1000", matmul_model(200, 1024, 1000, rng.standard_normal((1024, 1000)).astype(np.float32)),
              {"unit": "wgmma", "SPLITK": 2, "CL": 1, "NWG": 2, "PP": 0}),
             ("split cluster 4x2wg 200x1024x1000", matmul_model(200, 1024, 1000, rng.standard_normal((1024, 1000)).astype(np.float32)),
              {"unit": "wgmma", "SPLITK": 4, "CL": 1, "NWG": 2, "PP": 0}),
             ("split cluster 2x1wg 128x3072x768", matmul_model(128, 3072, 768, rng.standard_normal((3072, 768)).astype(np.float32)),
              {"unit": "wgmma", "SPLITK": 2, "CL": 1, "NWG": 1}),
             ("split cluster conv 8x512x7x7 3x3", conv_model((8, 512, 7, 7), (512, 512, 3, 3), bn=True, act="relu",
                                                           follow="pool", pads=[1, 1, 1, 1]),
              {"unit": "wgmma", "SPLITK": 2, "CL": 1, "NWG": 2, "BM": 128, "BN": 128, "A": "tma"}),
             ("split cluster conv gather 16x64x15x15 3x3/2", conv_model((16, 64, 15, 15), (136, 64, 3, 3), bn=True, act="relu",
                                                                      follow="pool", strides=[2, 2], pads=[1, 1, 1, 1]),
              {"unit": "wgmma", "SPLITK": 2, "CL": 1, "NWG": 2, "BM": 128, "BN": 128, "A": "gather"}),
             # stream-k, each block's last unit first ([Note: stream-k in step] in codegen/gemm_wgmma.py): tiles cut
             # among blocks, in a GEMM and an im2col convolution
             ("stream-k 1568x2048x512", matmul_model(1568, 2048, 512, rng.standard_normal((2048, 512)).astype(np.float32)),
              {"unit": "wgmma", "STREAM": 1}),
             ("stream-k conv 8x512x7x7 3x3", conv_model((8, 512, 7, 7), (512, 512, 3, 3), bn=True, act="relu",
                                                       follow="pool", pads=[1, 1, 1, 1]),
              {"unit": "wgmma", "STREAM": 1, "A": "tma"}),
             # the taps unit ([Note: taps in registers] in codegen/conv_taps.py): image tiles with zeros outside, three
             # consumer warpgroups, the TMA-store epilogue
             ("taps conv 4x64x16x24 3x3", conv_model((4, 64, 16, 24), (64, 64, 3, 3), bn=True, act="relu",
                                                     follow="pool", pads=[1, 1, 1, 1]),
              {"unit": "taps"}),
             # the pool unit ([Note: pooled tiles] in codegen/conv_pool.py): tiles cut by the image's edges, values of
             # both signs against the -inf padding, two and three consumer warpgroups
             ("pool conv 3x64x15x17 3x3 maxpool/2", conv_model((3, 64, 15, 17), (64, 64, 3, 3), follow="pool_s2",
                                                               pads=[1, 1, 1, 1]),
              {"unit": "pool", "pooled": 1, "TPH": 4, "TPW": 8, "NCONS": 3}),
             ("pool conv 2x64x30x34 1x3 maxpool/2", conv_model((2, 64, 30, 34), (64, 64, 1, 3), follow="pool_s2",
                                                               pads=[0, 1, 0, 1]),
              {"unit": "pool", "pooled": 1, "TPH": 7, "TPW": 8, "NCONS": 2}),
             # tile widths between the standard ones ([Note: widths that fill the SMs] in codegen/gemm_wgmma.py): 5 column
             # tiles of 104 over 512 channels (208 over 2048), the last one narrower, in a convolution and GEMMs
             ("fill width conv 32x64x7x7 3x3", conv_model((32, 64, 7, 7), (512, 64, 3, 3), bn=True, act="relu",
                                                         follow="pool", pads=[1, 1, 1, 1]),
              {"unit": "wgmma", "BN": 104, "A": "tma"}),
             ("fill width gemm 1560x320x512 ping-pong", b_transposed_input(1560, 320, 512, rng), {"unit": "wgmma", "BN": 104, "PP": 1}),
             ("fill width gemm 1560x320x2048 cooperative", b_transposed_input(1560, 320, 2048, rng),
              {"unit": "wgmma", "BN": 208, "NWG": 2, "PP": 0}),
             # the gemv on tensor cores ([Note: the gemv on tensor cores] in codegen/gemm_gemv.py): 8 and 5 rows,
             # K not a multiple of a step, splits through a cluster and through scratch
             ("gemv tensor cores cluster 8x1000x520", matmul_model(8, 1000, 520, rng.standard_normal((1000, 520)).astype(np.float32)),
              {"unit": "gemv", "TC": 1, "SPLITK": 4, "CL": 1}),
             ("gemv tensor cores scratch 5x1000x520", matmul_model(5, 1000, 520, rng.standard_normal((1000, 520)).astype(np.float32)),
              {"unit": "gemv", "TC": 1, "SPLITK": 3, "CL": 0, "BN": 128})]
    cases = [(*case, None) for case in cases] + [
        # the split attention's chunks as a cluster ([Note: split attention as a cluster] in
        # codegen/attention_split.py): tensor-core and SIMT bodies, live lengths (the last item) that leave
        # chunks empty, NaN in the dead slots
        ("attention cluster 32/8 heads live 300", decode_attention(1, 32, 8, 768, 64),
         {"unit": "split", "CL": 1, "MMA": 1, "BN": 128, "warps": 4, "STAGES": 2, "SPLITS": 6}, 300),
        ("attention cluster simt 8/1 heads sq 4 live 37", decode_attention(1, 8, 1, 768, 64, sq=4),
         {"unit": "split", "CL": 1, "MMA": 0, "BN": 32, "warps": 4, "SPLITS": 8}, 37)]
    only = sys.argv[1:]   # words: run the cases whose name holds one of them (e.g. `cluster`)
    bad = 0
    for name, model, pin, live in cases:
        if only and not any(w in name for w in only):
            continue
        payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin)
        ex = Executor(Bundle.from_payload(payload), dev, graph=False)
        feeds = (inputs_at(model, live, seed=live) if live else
                 {i["name"]: rng.standard_normal(i["shape"]).astype(np.float32) for i in payload["inputs"]})
        y = list(ex.run(feeds).values())[0]
        ex.close()
        finite = bool(np.isfinite(y).all())
        bad += not finite
        params = next(k["params"] for k in payload["kernels"] if k["params"].get("unit") == pin["unit"])
        print(f"{name}: {params} finite {finite}", flush=True)
    dev.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
