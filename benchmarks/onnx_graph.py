"""A small onnx.helper graph builder shared by the Llama graph writers (benchmarks/decoder_graph.py,
tests/llama_graph.py): initializers and nodes named from one running count, in the order made."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper


class GraphBuilder:
    """`const(array)` adds an initializer (made by `store(array, name)`, default: in the model)
    and returns its name; `node(op, inputs, **attrs)` adds a node of one output and returns the
    output's name. Names: `c<n>` and `<op>_<n>`, n counting both."""

    def __init__(self, store: Callable[[np.ndarray, str], onnx.TensorProto] | None = None) -> None:
        self.store = store or (lambda array, name: numpy_helper.from_array(array, name))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        self.count += 1
        name = name or f"c{self.count}"
        self.inits.append(self.store(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"node_{out}", **attrs))
        return out
