"""Dependent launches ([Note: PDL] in aicfc/codegen/pdl.py, aicf_run/pdl.py): on sm_90 every
kernel starts by waiting for the previous one and letting the next one launch, the bundle
marks each kernel "dependent", and the executor launches those with cuLaunchKernelEx and
programmatic stream serialization. The GPU tests compare a many-kernel model (BART's export,
29 kernels that reuse the arena in place) run with dependent launches against the same model
compiled with --no-pdl and against onnxruntime, over many graph replays."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicf_run.bundle import Bundle
from aicf_run.errors import RunError
from aicfc.codegen import pdl
from aicfc.errors import AicfError
from tests.export_check import feeds, reference

BART = Path(__file__).resolve().parent / "fixtures" / "families" / "bart_ts.onnx"


def chain_model() -> onnx.ModelProto:
    """MatMul, Softmax, MatMul, LayerNormalization, Tanh: an attention-like kernel and a row pass."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((96, 64)).astype(np.float32), "w2")
    g = numpy_helper.from_array(np.ones(64, np.float32), "g")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Softmax", ["a"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "w2"], ["b"]), helper.make_node("Add", ["b", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g"], ["n"], axis=-1),
             helper.make_node("Tanh", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 64])], [w1, w2, g])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_instrument_puts_the_entry_first_in_the_named_kernel():
    source = ('__device__ void helper() { }\n'
              'extern "C" __global__ void __launch_bounds__(128, 1) k7(const AicfTmap* __restrict__ tmaps,\n'
              '    float* __restrict__ p0) {\n  int i = threadIdx.x;\n}\n'
              'extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) k8(float* p) {\n}\n')
    out = pdl.instrument(pdl.instrument(source, "k7"), "k8")
    assert "p0) {\n  aicf_pdl_entry();\n  int i" in out
    assert "k8(float* p) {\n  aicf_pdl_entry();\n}" in out
    assert out.count(pdl.ENTRY) == 2
    with pytest.raises(AicfError, match="no __global__ definition"):
        pdl.instrument(source, "k9")


def test_instrument_puts_the_entry_at_the_kernels_mark():
    """A template's pdl.MARK in the named kernel's body takes the entry; another kernel's mark is left."""
    source = (f'extern "C" __global__ void k1(const float* w, float* p) {{\n  float a = w[0];\n  {pdl.MARK}\n  p[0] = a;\n}}\n'
              f'extern "C" __global__ void k2(float* p) {{\n  {pdl.MARK}\n}}\n')
    out = pdl.instrument(source, "k1", 264)
    assert "float a = w[0];\n  aicf_pdl_entry(264u);\n  p[0] = a;" in out
    assert out.count(pdl.ENTRY) == 1 and out.count(pdl.MARK) == 1 and out.index(pdl.MARK) > out.index("k2(")


def test_a_grid_of_several_waves_triggers_in_its_last_wave():
    """One wave or less triggers at entry; more, from the last wave's first block (linear order)."""
    from aicfc.planner.hardware import load_profile
    hw = load_profile("sm_90")          # 132 SMs, 2048 threads an SM
    assert pdl.trigger_from((132, 1, 1), (384, 1, 1), 200_000, 168, hw) == 0           # persistent
    assert pdl.trigger_from((264, 1, 1), (1024, 1, 1), 0, 32, hw) == 0                  # 2 an SM: one wave
    assert pdl.trigger_from((265, 1, 1), (1024, 1, 1), 0, 32, hw) == 264
    assert pdl.trigger_from((8, 12, 4), (128, 1, 1), 100_000, 128, hw) == 264           # 2 an SM (smem): 384 blocks
    assert pdl.trigger_from((1000, 1, 1), (256, 1, 1), 0, 32, hw) == 0                  # 8 an SM: 1056 a wave
    out = pdl.instrument('extern "C" __global__ void k1(float* p) {\n}\n', "k1", 264)
    assert "k1(float* p) {\n  aicf_pdl_entry(264u);\n}" in out


def test_choose():
    assert pdl.choose("sm_90")[0] == pdl.choose("sm_90a")[0] == pdl.choose("sm_100")[0] == pdl.DEPENDENT
    assert pdl.choose("sm_80")[0] == pdl.choose("sm_89")[0] == pdl.STREAM
    assert pdl.choose("sm_90", enabled=False) == (pdl.STREAM, "dependent launches turned off (aicfc compile --no-pdl)")


@pytest.mark.parametrize("target,mode", [("sm_90", "dependent"), ("sm_80", "stream")])
def test_every_kernel_waits_where_the_plan_is_dependent(target, mode, tmp_path):
    payload = aicfc.compile(chain_model(), target=target, dump_ir=tmp_path)
    assert payload["launch"]["mode"] == mode
    assert len(payload["kernels"]) >= 2 and all(k["launch"] == mode for k in payload["kernels"])
    source = "".join(p.read_text() for p in sorted(tmp_path.glob("module_*.cu")))
    body_entries = source.count("\n  " + pdl.ENTRY)
    assert body_entries == (len(payload["kernels"]) if mode == "dependent" else 0)
    # the bundle records each dependent kernel's trigger block, as its source has it
    for k in payload["kernels"]:
        assert ("trigger_from" in k) == (mode == "dependent")
        if k.get("trigger_from"):
            assert f"{pdl.ENTRY}{k['trigger_from']}u);" in source


def test_no_pdl_keeps_plain_launches():
    payload = aicfc.compile(chain_model(), dependent_launch=False)
    assert payload["launch"]["mode"] == "stream" and {k["launch"] for k in payload["kernels"]} == {"stream"}


def test_bundle_refuses_an_unknown_launch_mode():
    payload = aicfc.compile(chain_model())
    payload["kernels"][0]["launch"] = "eager"
    with pytest.raises(RunError, match=r"kernels\[0\]\.launch"):
        Bundle.from_payload(payload)


@pytest.mark.gpu
def test_gpu_dependent_launches_match_plain_ones_and_onnxruntime(gpu_device):
    from aicf_run.executor import Executor
    model = onnx.load(str(BART))
    inputs = feeds(model, 7)
    ref = reference(model, inputs)
    outputs = {}
    for mode in ("dependent", "stream"):
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", dependent_launch=mode == "dependent")
        assert len(payload["kernels"]) > 10 and {k["launch"] for k in payload["kernels"]} == {mode}
        ex = Executor(Bundle.from_payload(payload), gpu_device)
        try:
            assert all((launch.dependent is not None) == (mode == "dependent") for launch in ex._launches)
            ex.poison()
            first = ex.run(inputs)["y"]
            for _ in range(200):        # graph replays back to back: any race shows as a difference
                ex.launch()
            again = ex.run(inputs)["y"]
            for _ in range(20):         # and the kernels launched one by one, without the graph
                ex.launch(graph=False)
            plain = ex.run(inputs)["y"]
        finally:
            ex.close()
        assert np.array_equal(first, again) and np.array_equal(first, plain)
        outputs[mode] = first
    assert np.array_equal(outputs["dependent"], outputs["stream"])
    err = np.abs(outputs["dependent"].astype(np.float64) - ref).max() / np.abs(ref).max()
    assert np.isfinite(err) and err <= 1e-2


def test_driver_structures_match_cuda_h():
    """The ctypes mirror of cuLaunchKernelEx's structures and enums against the toolkit's cuda.h."""
    import ctypes
    import re
    import shutil
    from aicf_run import pdl as run_pdl
    nvcc = shutil.which("nvcc")
    headers = [Path(nvcc).resolve().parent.parent / "include" / "cuda.h"] if nvcc else []
    headers += sorted(Path("/usr/local").glob("cuda*/include/cuda.h"))
    header = next((h for h in headers if h.exists()), None)
    if header is None:
        pytest.skip("no cuda.h found")
    text = header.read_text(errors="replace")
    def enum(name: str) -> int:
        return int(re.search(rf"\b{name}\s*=\s*(\d+)", text).group(1))
    assert run_pdl.ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == enum("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION")
    assert run_pdl.FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == enum("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")
    assert ctypes.sizeof(run_pdl._Attribute) == 72 and ctypes.sizeof(run_pdl._Config) == 56
    assert "char pad[64]" in text and re.search(r"CUstream hStream;\s*/\*\*<[^*]*\*/\s*CUlaunchAttribute \*attrs;", text)


def test_recorded_trigger_is_the_rendered_one():
    """A grid of several waves triggers from its last wave ([Note: PDL]); the bundle's trigger_from
    is the block the kernel's source triggers from."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096, 4096])
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])],
                              "waves", [x], [y])
    payload = aicfc.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target="sm_90")
    several = [k for k in payload["kernels"] if k["trigger_from"]]
    assert several, [(k["grid"], k["trigger_from"]) for k in payload["kernels"]]
    for k in several:
        assert f"{pdl.ENTRY}{k['trigger_from']}u);" in payload["modules"][k["module"]]["source"]
