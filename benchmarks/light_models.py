"""The onnx package's light CNN models (onnx/backend/test/data/light) end to end, against onnxruntime.

    python3 benchmarks/light_models.py                    # compile each model (fp32 and fp16)
    python3 benchmarks/light_models.py --precision fp16 resnet50   # one precision, one model
    python3 benchmarks/light_models.py --cpu squeezenet   # + Lowered IR interpreter vs onnxruntime
    source .gpu/env.sh && python3 benchmarks/light_models.py --gpu   # + GPU runs vs onnxruntime

The light models make every weight with a ConstantOfShape of one value (0.02), which turns
every layer into a near-constant map and the softmax output into 1/1000 everywhere. Each model
is therefore `randomized` first: every such weight becomes a seeded random initializer of the
same shape (He-scaled normals for >= 2-D weights; for BatchNorm, scales in 0.3..0.7 and
variances in 0.5..1.5; small normals for every other 1-D constant: activations stay O(1) through
50 layers, inside fp16's range), and the input of a final Softmax becomes a second graph output
(`<name>:logits`), a much stronger check than the probabilities. The reference is onnxruntime
on CPU at fp32 on the same randomized model and input.

Errors are max|y - ref| / max|ref| per output; limits: fp32 1e-4, fp16 1e-2 (the GPU); the
interpreter (fp32, numpy) is held to 1e-4; it takes 1-30 s a model on CPU (VGG-19 about 90 s).
Measured here (CPU): all nine light models match onnxruntime through the interpreter to
<= 3e-6.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512")
RTOL = {"fp32": 1e-4, "fp16": 1e-2}


def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(LIGHT / f"light_{name}.onnx"))


def randomized(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The model with its ConstantOfShape weights replaced by random initializers (see the
    module docstring) and a final Softmax's input added as an output."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g = m.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    rng = np.random.default_rng(seed)
    # What each 1-D constant feeds: BatchNormalization's (scale, bias, mean, var) or a bias.
    role = {x: ("scale", "bias", "mean", "var")[i - 1] for n in g.node if n.op_type == "BatchNormalization"
            for i, x in enumerate(n.input) if i >= 1}
    nodes, made = [], {}
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in inits[n.input[0]].reshape(-1))
            if len(shape) >= 2:
                fan_in = max(1, math.prod(shape[1:]))
                value = rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
            elif role.get(n.output[0]) in ("scale", "var"):
                # Scales below 1 keep residual sums from growing layer by layer (the logits of
                # a 50-layer ResNet stay O(10), inside fp16's range); variances stay positive.
                value = rng.uniform(0.3, 0.7, shape) if role[n.output[0]] == "scale" else rng.uniform(0.5, 1.5, shape)
            else:
                value = 0.1 * rng.standard_normal(shape)
            made[n.output[0]] = value.astype(np.float32)
            continue
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in made.items())
    # Before IR version 4 every initializer is also a graph input.
    g.input.extend(helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in made.items())
    # ConstantOfShape's shape initializers are no longer read; graph inputs naming them go too.
    used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
    keep_init = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_init)
    keep_in = [i for i in g.input if i.name in used]
    del g.input[:]
    g.input.extend(keep_in)
    last = g.node[-1]
    if last.op_type == "Softmax" and last.output[0] in {o.name for o in g.output}:
        inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(m).graph.value_info}
        if last.input[0] in inferred:
            g.output.append(inferred[last.input[0]])
    onnx.checker.check_model(m)
    return m


def data_inputs(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input if i.name not in inits}


def onnxruntime_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, inputs)))


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if y.shape != ref.shape or not np.isfinite(y).all():
        return math.inf
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


def lowered(model: onnx.ModelProto, precision: str = "fp32"):
    """The model through every Lowered IR stage (the last Program before kernels are formed)."""
    from aicfc.frontend.onnx_import import import_model
    from aicfc.ir.lowered import Program
    from aicfc.passes.pipeline import PIPELINE, Options
    from aicfc.planner.hardware import load_profile
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"), precision=precision)
    last = None
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
        if isinstance(ir, Program):
            last = ir
    return last, ir


def interpret(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from aicfc.ir.interp import evaluate_program
    program, _ = lowered(model)
    return evaluate_program(program, inputs)


def run_gpu(payload: dict, inputs: dict[str, np.ndarray], device) -> dict[str, np.ndarray]:
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        ex.poison()
        return ex.run(inputs)
    finally:
        ex.close()


def worst(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[float, str]:
    errs = {k: rel_err(got[k], r) for k, r in ref.items()}
    k = max(errs, key=errs.get)
    return errs[k], k


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(MODELS)})")
    ap.add_argument("--cpu", action="store_true", help="compare the Lowered IR interpreter with onnxruntime")
    ap.add_argument("--gpu", action="store_true", help="run on GPU 0 at fp32 and fp16 vs onnxruntime")
    ap.add_argument("--target", default=None, help="sm_XX to compile for (default: GPU 0's, else sm_90)")
    ap.add_argument("--precision", choices=tuple(RTOL), action="append", default=None,
                    help="compile (and run) at this precision only; repeat for both (default: fp32 and fp16)")
    args = ap.parse_args(argv)
    import aicfc
    from aicfc.errors import AicfError
    names = args.names or [n for n in MODELS if (LIGHT / f"light_{n}.onnx").is_file()]
    device = None
    if args.gpu:
        from aicf_run.device import open_device
        device = open_device(0)
    target = args.target or (device.arch if device is not None else "sm_90")
    failures = 0
    print(f"{'model':<14} {'stage':<22} {'result':<10} {'detail'}")
    for name in names:
        model = randomized(load(name))
        inputs = data_inputs(model)
        ref = onnxruntime_reference(model, inputs)
        if args.cpu:
            t = time.perf_counter()
            try:
                err, where = worst(interpret(model, inputs), ref)
                ok = err <= RTOL["fp32"]
                failures += not ok
                print(f"{name:<14} {'interpreter fp32':<22} {'ok' if ok else 'MISMATCH':<10} "
                      f"{err:.2e} ({where}), {time.perf_counter() - t:.0f}s", flush=True)
            except Exception as e:
                failures += 1
                print(f"{name:<14} {'interpreter fp32':<22} {'ERROR':<10} {type(e).__name__}: {e}", flush=True)
        for precision in args.precision or tuple(RTOL):
            t = time.perf_counter()
            try:
                payload = aicfc.compile(model, target=target, precision=precision)
            except AicfError as e:
                failures += 1
                print(f"{name:<14} {'compile ' + precision:<22} {'FAILS':<10} {e}", flush=True)
                continue
            print(f"{name:<14} {'compile ' + precision:<22} {'ok':<10} {len(payload['kernels'])} kernels, "
                  f"{time.perf_counter() - t:.0f}s", flush=True)
            if device is None:
                continue
            try:
                err, where = worst(run_gpu(payload, inputs, device), ref)
                ok = err <= RTOL[precision]
                failures += not ok
                print(f"{name:<14} {'gpu ' + precision:<22} {'ok' if ok else 'MISMATCH':<10} {err:.2e} ({where})",
                      flush=True)
            except Exception as e:
                failures += 1
                print(f"{name:<14} {'gpu ' + precision:<22} {'ERROR':<10} {type(e).__name__}: {e}", flush=True)
    if device is not None:
        device.close()
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
