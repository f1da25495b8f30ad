"""Device-resident I/O on a real GPU: torch (and CuPy when importable) tensors in and out of
Executor.run, equal bit for bit to the numpy path; GPU casts equal to the host conversion; no
host copy on the device path. Marked `gpu`: they skip without PyCUDA and a GPU."""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from aicf_run.bundle import Bundle
from aicf_run.executor import Executor
from aicf_run.interop import DeviceArray

pytestmark = pytest.mark.gpu
EXAMPLES = [("mlp", "fp32"), ("block", "fp32"), ("block", "fp16"), ("mlp", "bf16")]
IDS = [f"{n}-{p}" for n, p in EXAMPLES]


@pytest.fixture(scope="module")
def payloads(gpu_device: Any) -> dict[tuple[str, str], dict]:
    import aicfc
    import examples.build_examples as ex
    return {(name, precision): aicfc.compile(ex.BUILDERS[name](), target=gpu_device.arch,
                                             precision=precision)
            for name, precision in EXAMPLES}


def _inputs(bundle: Bundle, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {item["name"]: rng.standard_normal(item["shape"]).astype(item["dtype"])
            for item in bundle.inputs}


def _torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


@pytest.fixture
def no_host_copies(gpu_device: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make every host<->device copy of the driver fail, for the block under `with`."""
    import contextlib

    @contextlib.contextmanager
    def forbid():
        with monkeypatch.context() as m:
            for name in ("memcpy_htod", "memcpy_dtoh", "memcpy_htod_async", "memcpy_dtoh_async"):
                def refuse(*args: Any, _name: str = name, **kwargs: Any) -> None:
                    raise AssertionError(f"{_name} on the device path")
                m.setattr(gpu_device.driver, name, refuse)
            yield
    return forbid


@pytest.mark.parametrize("name,precision", EXAMPLES, ids=IDS)
def test_torch_in_and_out_equals_numpy(payloads: dict, gpu_device: Any, no_host_copies: Any,
                                       name: str, precision: str) -> None:
    torch = _torch()
    bundle = Bundle.from_payload(payloads[name, precision])
    executor = Executor(bundle, gpu_device)
    try:
        inputs = _inputs(bundle, seed=21)
        expected = executor.run(inputs)
        device_inputs = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
        torch.cuda.synchronize()
        with no_host_copies():
            executor.poison()
            got = executor.run(device_inputs)
        for output, array in expected.items():
            assert np.isfinite(array).all()
            result = got[output]
            assert isinstance(result, DeviceArray)
            via_dlpack = torch.from_dlpack(result).cpu().numpy()
            via_cai = torch.as_tensor(result, device="cuda").cpu().numpy()
            assert via_dlpack.tobytes() == array.tobytes(), f"{output}: torch in/out != numpy"
            assert via_cai.tobytes() == array.tobytes()
        # Into the caller's tensors, on the caller's stream.
        side = torch.cuda.Stream()
        outs = {item["name"]: torch.full(item["shape"], float("nan"), device="cuda")
                for item in bundle.outputs}
        with torch.cuda.stream(side), no_host_copies():
            returned = executor.run(device_inputs, outputs=outs, stream=side.cuda_stream)
        side.synchronize()
        for output, array in expected.items():
            assert returned[output] is outs[output]
            assert outs[output].cpu().numpy().tobytes() == array.tobytes()
    finally:
        executor.close()


@pytest.mark.parametrize("name,precision", [e for e in EXAMPLES if e[1] in ("fp16", "bf16")],
                         ids=[i for i, e in zip(IDS, EXAMPLES) if e[1] in ("fp16", "bf16")])
def test_gpu_casts_equal_the_host_conversion(payloads: dict, gpu_device: Any, name: str,
                                             precision: str) -> None:
    payload = payloads[name, precision]
    assert all("cast" in item for item in payload["inputs"] + payload["outputs"])
    old = copy.deepcopy(payload)
    for item in old["inputs"] + old["outputs"]:
        del item["cast"]   # a bundle from before GPU casts: converted on the host
    new_ex, old_ex = Executor(Bundle.from_payload(payload), gpu_device), Executor(Bundle.from_payload(old), gpu_device)
    try:
        inputs = _inputs(new_ex.bundle, seed=5)
        inputs[next(iter(inputs))].flat[:4] = [np.nan, np.inf, -np.inf, 65520.0]
        a, b = new_ex.run(inputs), old_ex.run(inputs)
        for output in a:
            np.testing.assert_array_equal(a[output], b[output])
    finally:
        new_ex.close()
        old_ex.close()


def test_cupy_in_and_out(payloads: dict, gpu_device: Any, no_host_copies: Any) -> None:
    cupy = pytest.importorskip("cupy")
    bundle = Bundle.from_payload(payloads["block", "fp16"])
    executor = Executor(bundle, gpu_device)
    try:
        inputs = _inputs(bundle, seed=8)
        expected = executor.run(inputs)
        device_inputs = {k: cupy.asarray(v) for k, v in inputs.items()}
        cupy.cuda.Device().synchronize()
        with no_host_copies():
            got = executor.run(device_inputs)
        for output, array in expected.items():
            assert cupy.asnumpy(cupy.asarray(got[output])).tobytes() == array.tobytes()
            assert cupy.asnumpy(cupy.from_dlpack(got[output])).tobytes() == array.tobytes()
    finally:
        executor.close()
