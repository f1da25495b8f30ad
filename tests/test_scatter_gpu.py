"""On the GPU: ScatterND over state ([Note: a scatter's rows as vectors] in codegen/scatter.py),
each case at its vector width (16-byte vectors, 2-element ones, none where the ids index the
innermost axis), negative ids, and ids outside their axis (no write). The state starts random,
so an element written by no update must come back unchanged, and one written wrongly shows."""
from __future__ import annotations

import numpy as np
import pytest

import aicfc
from tests.test_state import SCATTER_CASES, distinct_ids, scatter_model

pytestmark = pytest.mark.gpu


def reference(x: np.ndarray, ids: np.ndarray, upd: np.ndarray) -> np.ndarray:
    y = x.copy()
    k = ids.shape[-1]
    for tup, row in zip(ids.reshape(-1, k), upd.reshape((-1,) + x.shape[k:])):
        at = tuple(int(i) + (x.shape[d] if i < 0 else 0) for d, i in enumerate(tup))
        if all(0 <= a < x.shape[d] for d, a in enumerate(at)):
            y[at] = row
    return y


@pytest.mark.parametrize("data,q,k,vec", SCATTER_CASES)
def test_scatter_rows_match_numpy(data, q, k, vec, gpu_device):
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    rng = np.random.default_rng(sum(data) + k)
    upd_shape = q + data[k:]
    payload = aicfc.compile(scatter_model(data, q + (k,), upd_shape), target=gpu_device.arch)
    (kern,) = [x for x in payload["kernels"] if x["family"] == "scatter"]
    assert kern["params"]["vec"] == vec
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    ids = distinct_ids(rng, data[:k], q)
    ids.reshape(-1, k)[0, 0] = data[0] + 3            # outside its axis: that row writes nothing
    for step in range(2):
        x = rng.standard_normal(data).astype(np.float32)
        upd = rng.standard_normal(upd_shape).astype(np.float32)
        ex.set_state({"x": x})
        ex.run({"ids": ids, "upd": upd})
        got = ex.state["x"]
        assert np.array_equal(got, reference(x, ids, upd)), f"step {step}"
