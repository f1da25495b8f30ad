"""Transformer layers as torch exports them compile to at most 7 kernels, each fusion named by
the property that made it legal (issue 4's bar), for BERT-style and GPT-2-style layers."""
from __future__ import annotations

import pytest

import aicfc
import examples.build_examples as ex
from aicfc.explain import explain_json

# The property each family's fusions rest on (aicfc/ir/properties.py).
PROPERTY = {"gemm": "tile_compatible_compute", "attention": "weighted_streaming_reduction",
            "row_reduce": "online_reducible_norm"}


@pytest.mark.parametrize("name", ["encoder", "decoder"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_layer_is_at_most_seven_kernels_and_explained(name, precision):
    e = explain_json(aicfc.compile(ex.BUILDERS[name](), precision=precision))
    families = [k["family"] for k in e["kernels"]]
    assert len(families) <= 7, families
    assert families.count("attention") == 1 and families.count("row_reduce") == 2
    for k in e["kernels"]:
        assert PROPERTY[k["family"]] in k["properties"], k["name"]
        if len(k["onnx_nodes"]) > 1:          # a fusion: it names the rule that made it
            assert k["rewrites"], k["name"]
    rules = {r["rule"] for r in e["rewrites"] if r["applied"]}
    assert {"softmax(q@kᵀ·s)@v => streaming_attention", "sibling contractions on one operand => one contraction",
            "row stats + map => one row pass", "contraction + map => gemm epilogue"} <= rules
    # the residual chain is written in place
    assert any(d["output"] == "y" for d in e["memory"]["inplace"])


def test_decoder_mask_is_found_causal():
    e = explain_json(aicfc.compile(ex.BUILDERS["decoder"](), precision="fp16"))
    (att,) = [k for k in e["kernels"] if k["family"] == "attention"]
    assert att["params"]["causal"] == 1
    assert any("causal" in r for r in att["rewrites"])
