"""[Note: moved maps] (aicf_run/moved.py): a kernel with TMA tensor maps launched with some buffers at other
addresses, as `aicf-run --profile` launches it over copies of its weights and outputs.

CPU: which address each map takes. GPU (`gpu`): on a ResNet stage's Hopper kernels (maps in constant memory),
dependent and plain, the moved launch reads the copied weights and writes the copy of its output, leaving the
original untouched, and gives the same bits; the profile rotates them and the run after it is unchanged.
"""
from __future__ import annotations

import numpy as np
import pytest

from aicf_run.moved import map_addresses
from tests import onnx_builders as B


def test_a_map_follows_its_moved_buffer() -> None:
    """Maps over buffers 3 and 5 (arguments 1 and 2 of the kernel) and over 7 (not an argument): moving argument
    2 moves the second map only."""
    kernel = {"args": [0, 3, 5], "tensor_maps": [{"buffer": 3}, {"buffer": 5}, {"buffer": 7}]}
    pointers = [1000 + 100 * b for b in range(8)]
    assert map_addresses(kernel, pointers, {}) == [1300, 1500, 1700]
    assert map_addresses(kernel, pointers, {2: 9000}) == [1300, 9000, 1700]
    assert map_addresses(kernel, pointers, {0: 8000, 1: 9000}) == [9000, 1500, 1700]
    assert map_addresses({"args": [1]}, pointers, {0: 5}) == []


def _host(cuda, pointer: int, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, np.uint8)
    cuda.memcpy_dtoh(out, pointer)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dependent", [True, False], ids=["dependent", "plain"])
def test_gpu_moved_maps_write_the_copy(dependent, gpu_device):
    import aicfc
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    from aicf_run.profile import cold_copies

    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=2)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", dependent_launch=dependent)
    cuda = gpu_device.driver
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 64, 28, 28)).astype(np.float32)
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    try:
        buffers, kernels = ex.bundle.buffers, ex.bundle.kernels
        l2_bytes = ex.bundle.target["profile"]["l2_bytes"]
        mapped = [i for i, k in enumerate(kernels) if k.get("tensor_maps") and k.get("maps_symbol")]
        assert mapped, "the stage's convolutions run on the Hopper engine with their maps in constant memory"
        inputs = {ex.bundle.inputs[0]["name"]: x}
        first = ex.run(inputs)
        checked = 0
        for index in mapped:
            kernel = kernels[index]
            _, moved = cold_copies(kernel, buffers, l2_bytes)
            outputs = [i for i in moved if buffers[kernel["args"][i]]["region"] == "arena"]
            if not outputs:
                continue
            pointers = ex.kernel_pointers(index)
            copies = {i: ex.device_copy(pointers[i], buffers[kernel["args"][i]]["nbytes"]) for i in moved}
            launch = ex.kernel_moved(index, {i: int(c) for i, c in copies.items()})
            try:
                for i in outputs:
                    nbytes = buffers[kernel["args"][i]]["nbytes"]
                    ex.launch_kernel(index)   # on what the plan left in its inputs (a later kernel may reuse them)
                    ex.synchronize()
                    want = _host(cuda, pointers[i], nbytes)
                    cuda.memset_d8(pointers[i], 0, nbytes)
                    cuda.memset_d8(int(copies[i]), 0xFF, nbytes)
                    launch()
                    ex.synchronize()
                    assert not _host(cuda, pointers[i], nbytes).any(), f"kernel {index} wrote its original output"
                    np.testing.assert_array_equal(_host(cuda, int(copies[i]), nbytes), want)
                    checked += 1
            finally:
                ex.synchronize()
                launch.free()
                for c in copies.values():
                    c.free()
        assert checked >= 2
        report = ex.profile()
        rotated = [k for k in report.kernels if k.index in mapped and k.copies > 1]
        assert len(rotated) == len(mapped)
        again = ex.run(inputs)
        for name, value in first.items():
            assert not np.isnan(value).any()
            np.testing.assert_array_equal(again[name], value)
    finally:
        ex.close()
