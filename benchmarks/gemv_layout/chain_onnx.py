"""The chain of kmajor.cu as ONNX for aicf: x[1, 2048] -> (2048 -> 5632 -> 2048 -> 2048) x L, MatMuls only.

    python benchmarks/gemv_layout/chain_onnx.py L chain.onnx"""
import sys
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto



def main(L: int, out: str) -> None:
    rng = np.random.default_rng(1)
    dims = [2048, 5632, 2048, 2048]
    nodes, inits, cur = [], [], "x"
    for l in range(L):
        for j in range(3):
            k, n = dims[j], dims[j + 1]
            w = ((rng.random((k, n), dtype=np.float32) * 2 - 1) * (1.7 / np.sqrt(k))).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{l}_{j}"))
            nxt = f"h{l}_{j}"
            nodes.append(helper.make_node("MatMul", [cur, f"w{l}_{j}"], [nxt]))
            cur = nxt
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, 2048])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
