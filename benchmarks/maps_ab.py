"""A/B in one process ([Note: TMA maps in constant memory], aicfc/codegen/tma.py): the same GEMMs with
their tensor maps in constant memory (as compiled) or in global memory behind fences (CONST_BUDGET = 0),
each graph-replayed 20 back to back, 5 alternating rounds, the median printed.

    source .gpu/env.sh && python3 benchmarks/maps_ab.py
"""
import statistics
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import aicfc
from aicfc.codegen import tma
from aicf_run.device import open_device
from aicf_run.bundle import Bundle
from aicf_run.executor import Executor
from benchmarks.timing import aicf_graph_us

def mm(m, k, n):
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((k, n)) * 0.05).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

dev = open_device(0)
budget = tma.CONST_BUDGET
for shape in [(4096, 64, 768), (4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072)]:
    exs = {}
    for name, b in (("constant", budget), ("global", 0)):
        tma.CONST_BUDGET = b
        p = aicfc.compile(mm(*shape), target="sm_90", precision="fp16")
        assert ("maps_symbol" in p["kernels"][0]) == (b > 0)
        ex = Executor(Bundle.from_payload(p), dev)
        ex.run({"x": np.random.default_rng(1).standard_normal((shape[0], shape[1])).astype(np.float32)})
        exs[name] = ex
    t = {n: [] for n in exs}
    for _ in range(5):
        for n, ex in exs.items():
            t[n].append(aicf_graph_us(ex, 20, 50))
    c, g = statistics.median(t["constant"]), statistics.median(t["global"])
    print(f"{'x'.join(map(str, shape))}: constant {c:.2f} us, global+fences {g:.2f} us, saved {g - c:+.2f} us "
          f"(rounds constant {min(t['constant']):.2f}-{max(t['constant']):.2f}, global {min(t['global']):.2f}-{max(t['global']):.2f})", flush=True)
    for ex in exs.values():
        ex.close()
tma.CONST_BUDGET = budget
