"""A gemv's L2 requests ahead of its own loads ([Note: requests ahead of the stream] in codegen/gemm_gemv.py), an
experiment's switch (AICF_GEMV_AHEAD): the rendering, a bad value refused in one line, and on the GPU the same
products as numpy, over [K, N] and K-major weights, splits and k-rows that are no multiple of a step."""
from __future__ import annotations

import numpy as np
import pytest

import aicfc
from aicfc.codegen import gemm_gemv
from aicfc.errors import AicfError
from tests.test_gemv import _run_against_numpy, rows_model


def _gemv_source(model, pin: dict) -> tuple[dict, str]:
    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin={"unit": "gemv", **pin})
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    source = "".join(m["source"] for m in payload["modules"])
    return k, source[source.index(f" {k['name']}("):]


@pytest.mark.parametrize("kind,pin", [("kn", {"kmajor": "0", "BN": 64, "SPLITK": 2}),
                                      ("km", {"KM": 1, "kmajor": "w", "BN": 2, "WARPS": 4, "KS": 2, "U": 2})])
def test_requests_ahead_render_only_under_the_switch(kind, pin, monkeypatch):
    model = rows_model(1, 5632, 1024, np.random.default_rng(0))
    k, body = _gemv_source(model, pin)
    assert "prefetch.global.L2" not in body
    monkeypatch.setenv("AICF_GEMV_AHEAD", f"{kind}=2")
    k2, body2 = _gemv_source(model, pin)
    assert k2["params"] == k["params"], "the switch changes the rendering, not the schedule"
    assert body2.count("prefetch.global.L2") >= 2 and "(lane & 7) == 0" in body2
    other = "km" if kind == "kn" else "kn"
    monkeypatch.setenv("AICF_GEMV_AHEAD", f"{other}=2")
    assert "prefetch.global.L2" not in _gemv_source(model, pin)[1]


@pytest.mark.parametrize("value", ["x", "kn=", "kq=2", "kn=two"])
def test_a_bad_switch_is_one_line(value, monkeypatch):
    monkeypatch.setenv("AICF_GEMV_AHEAD", value)
    with pytest.raises(AicfError, match="AICF_GEMV_AHEAD"):
        gemm_gemv.ahead({"KM": 1})


def test_the_switch_reads_both_kinds(monkeypatch):
    monkeypatch.setenv("AICF_GEMV_AHEAD", "kn=4;km=1")
    assert (gemm_gemv.ahead({}), gemm_gemv.ahead({"KM": 1}), gemm_gemv.ahead({"TC": 1})) == (4, 1, 0)
    monkeypatch.setenv("AICF_GEMV_AHEAD", "3")
    assert (gemm_gemv.ahead({}), gemm_gemv.ahead({"KM": 1})) == (3, 3)


# (rows, K, N, pin): splits, a K that is no multiple of a step, N not a multiple of BN; K-major one row
CASES = [(1, 2048, 3072, {"kmajor": "0", "BN": 64, "WARPS": 8, "U": 4, "SPLITK": 2, "CL": 1}),
         (3, 1000, 264, {"kmajor": "0", "BN": 64, "WARPS": 4, "U": 8, "SPLITK": 1}),
         (1, 5632, 2056, {"KM": 1, "kmajor": "w", "BN": 2, "WARPS": 4, "KS": 2, "U": 2}),
         (1, 2000, 1030, {"KM": 1, "kmajor": "w", "BN": 8, "WARPS": 8, "KS": 1, "U": 4})]


@pytest.mark.gpu
@pytest.mark.parametrize("ahead", ["1", "4"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}K{}N{}{}".format(c[0], c[1], c[2], "-km" if c[3].get("KM") else ""))
def test_requests_ahead_match_numpy(case, ahead, gpu_device, monkeypatch):
    from aicfc.passes.relayout_weights import GEMV_RULE
    rows, k, n, pin = case
    monkeypatch.setenv("AICF_GEMV_AHEAD", ahead)
    model = rows_model(rows, k, n, np.random.default_rng(k + n), bias=True, residual=True)
    _run_against_numpy(model, pin, "fp16", gpu_device, GEMV_RULE if pin.get("KM") and n * 2 % 16 == 0 else None)
