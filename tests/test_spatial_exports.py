"""Real torch exports of issue 18's spatial models (tests/fixtures/spatial, written by
make_spatial.py with torch 2.14 / transformers 5.24, dynamo exporter, opset 18, random weights):
a two-level U-Net (Conv, MaxPool, bilinear and nearest Upsample as Resize, ConvTranspose, skip
Concats) and transformers' WhisperEncoder with a tiny config (two Conv1d + GELU, one layer).

Each compiles at fp32 and fp16 and matches onnxruntime through the interpreter (CPU) and on the
GPU (fp32 1e-4, fp16 1e-2 of the output's max) on fresh random inputs.
"""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import aicfc
from tests.export_check import feeds, gpu_error, interpreter_error, reference

SPATIAL = Path(__file__).resolve().parent / "fixtures" / "spatial"
MODELS = sorted(p.stem for p in SPATIAL.glob("*.onnx"))


def load(stem: str) -> onnx.ModelProto:
    return onnx.load(str(SPATIAL / f"{stem}.onnx"))


def test_fixtures_present():
    assert MODELS == ["unet_dynamo_b1", "whisper_encoder_dynamo_b1"]
    ops = {n.op_type for n in load("unet_dynamo_b1").graph.node}
    assert {"ConvTranspose", "Resize", "Concat", "MaxPool"} <= ops


@pytest.mark.parametrize("stem", MODELS)
def test_interpreter_matches_onnxruntime(stem):
    model = load(stem)
    inputs = feeds(model, 0)
    assert interpreter_error(model, inputs, reference(model, inputs)) <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stem", MODELS)
def test_compiles(stem, precision):
    kernels = aicfc.compile(load(stem), precision=precision)["kernels"]
    families = [k["family"] for k in kernels]
    if stem.startswith("whisper"):
        # the two Conv1d as implicit GEMMs, the first with its GELU as the epilogue
        assert families[:2] == ["conv", "conv"] and "node_gelu" in kernels[0]["onnx_nodes"]
        assert families.count("attention") == 1
    else:
        resize = [k for k in kernels if any("upsample" in n for n in k["onnx_nodes"])]
        assert len(resize) == 2 and all(k["family"] == "pointwise" for k in resize)
        # 12 Conv and the ConvTranspose, less the two 1x1 Convs (GEMMs)
        assert families.count("conv") == 11 and families.count("gemm") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
@pytest.mark.parametrize("stem", MODELS)
def test_gpu_matches_onnxruntime(stem, precision, tol, gpu_device):
    model = load(stem)
    inputs = feeds(model, 1)
    assert gpu_error(model, inputs, reference(model, inputs), precision, gpu_device) <= tol
