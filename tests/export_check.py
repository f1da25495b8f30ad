"""One comparison of a committed real export against onnxruntime, shared by the fixture tests
(tests/test_families.py): fresh random inputs of the right kind per input name, onnxruntime's
output in float64, and the error of the compiler's result relative to the output's max
(`tests.test_pipeline.rel_err`: a non-finite value never passes).

    inputs = feeds(model, seed)
    ref = reference(model, inputs)
    assert interpreter_error(model, inputs, ref) <= 1e-5                   # the fp32 plan, on the CPU
    assert gpu_error(model, inputs, ref, "fp16", device) <= 1e-2           # compiled, on the GPU

`fp16_floor(model, inputs, ref)` is the error of the network itself when every weight and every
node's output is stored in fp16 (onnxruntime, a Cast pair after each node): what any fp16
implementation that stores its tensors in fp16 pays on these inputs, whatever its kernels.
"""
from __future__ import annotations

import os

import numpy as np
import onnx

import aicfc
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload
from tests.test_pipeline import evaluate_ir, rel_err, stages

# Token ids are drawn below this (the fixtures' vocabularies are 64 or 100 tokens), so pads
# (RoBERTa's and BART's id 1) occur among them.
VOCAB = 64


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Fresh inputs (the seed mixed with os.urandom): float inputs standard normal; integer
    inputs token ids, except `attention_mask`, ones with the last sequence's second half
    padding (0)."""
    rng = np.random.default_rng(seed + int.from_bytes(os.urandom(2), "little"))
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "attention_mask":
            out[i.name] = np.ones(shape, np.int64)
            out[i.name][-1, shape[-1] // 2:] = 0
        elif i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out[i.name] = rng.integers(0, VOCAB, shape).astype(np.int64)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray], output: str = "y") -> np.ndarray:
    return onnxruntime_reference(model, inputs)[output].astype(np.float64)


def fp16_floor(model: onnx.ModelProto, inputs: dict[str, np.ndarray], ref: np.ndarray, output: str = "y") -> float:
    from onnx import TensorProto, helper, numpy_helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[:]
    for n in model.graph.node:
        node = m.graph.node.add()
        node.CopyFrom(n)
        if n.op_type == "Constant":
            continue
        for i, out in enumerate(n.output):
            node.output[i] = out + "__f32"
            m.graph.node.append(helper.make_node("Cast", [out + "__f32"], [out + "__f16"], to=TensorProto.FLOAT16))
            m.graph.node.append(helper.make_node("Cast", [out + "__f16"], [out], to=TensorProto.FLOAT))
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(a.astype(np.float16).astype(np.float32), init.name))
    rounded = {k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v for k, v in inputs.items()}
    return rel_err(onnxruntime_reference(m, rounded)[output], ref)


def interpreter_error(model: onnx.ModelProto, inputs: dict[str, np.ndarray], ref: np.ndarray,
                      precision: str = "fp32", output: str = "y") -> float:
    """The planned program (plan_memory) through the interpreter: fp32 evaluates every compute
    in float32; fp16 runs the fp16 plan (its weights and stored tensors rounded to fp16)."""
    return rel_err(evaluate_ir(stages(model, precision)["plan_memory"], inputs)[output], ref)


def gpu_error(model: onnx.ModelProto, inputs: dict[str, np.ndarray], ref: np.ndarray, precision: str, device,
              output: str = "y") -> float:
    """Compiled for the device and run once on it, the arena poisoned with NaN first."""
    payload = aicfc.compile(model, target=device.arch, precision=precision)
    return rel_err(run_payload(payload, inputs, device)[output], ref)
