"""A kernel that reads a slice of a tensor is charged the slice's bytes, not the tensor's
(planner/cost._io_bytes): a decoder's final norm reads the last position of the hidden state."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import aicfc
from tests import onnx_builders as B


def _last_row_norm(rows: int, cols: int) -> onnx.ModelProto:
    """y = x[:, -1:, :] / sqrt(mean(x[:, -1:, :]^2) + eps): an RMS norm of the last row only."""
    inits = [helper.make_tensor(n, onnx.TensorProto.INT64, (1,), [v]) for n, v in
             (("st", rows - 1), ("en", rows), ("ax", 1))]
    inits.append(helper.make_tensor("two", onnx.TensorProto.FLOAT, (), [2.0]))
    inits.append(helper.make_tensor("eps", onnx.TensorProto.FLOAT, (), [1e-6]))
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
             helper.make_node("Pow", ["s", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["s", "rms"], ["y"])]
    graph = helper.make_graph(nodes, "last_row_norm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, rows, cols))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, 1, cols))], inits)
    model = B.make_model(graph)
    model.opset_import[0].version = 17
    return model


def test_a_slice_is_charged_its_bytes():
    payload = aicfc.compile(_last_row_norm(512, 2048), target="sm_90", precision="fp32", check_registers=False)
    (kern,) = payload["kernels"]
    row = 2048 * 4
    assert kern["predicted"]["bytes"] <= 4 * row, kern["predicted"]["bytes"]      # the row read, the row written
    assert kern["predicted"]["time_us"] < 20.0, kern["predicted"]["time_us"]     # it was 512 rows' worth on one block
    assert np.isfinite(kern["predicted"]["time_us"])
