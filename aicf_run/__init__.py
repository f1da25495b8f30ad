"""aicf-run: execute a compiled `.aicf` bundle on an NVIDIA GPU.

The runtime never imports the compiler and never decides anything: it loads the bundle's
cubins and runs its launch plan. PyCUDA is imported only when a device is opened.

    executor = aicf_run.load("model.aicf")    # the launch plan captured as a CUDA graph
    outputs = executor.run({"x": x})
    timings = executor.bench(100)             # aicf_run.bench.BenchReport
    kernels = executor.profile()              # aicf_run.profile.ProfileReport

A bundle of several plans (one per set of input shapes) loads as an aicf_run.plan_set.PlanSet:
`executor.plans` lists them, `run` picks the one whose shapes equal the inputs'. A decoder
whose KV cache is state generates tokens ([Note: generation] in aicf_run/generate.py):

    result = executor.generate(prompt_ids, max_new_tokens=64)   # aicf_run.generate.Generation
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aicf_run.executor import Executor
    from aicf_run.plan_set import PlanSet

__version__ = "0.1.0"
__all__ = ["__version__", "load"]


def load(path: str | os.PathLike, device: int = 0, graph: bool = True) -> Executor | PlanSet:
    """Read and check the bundle at `path`, open GPU `device` and load the bundle onto it.

    With `graph` (the default) the launch plan is captured once into a CUDA graph that every
    run replays. `executor.device.close()` frees the GPU (it also happens at exit). A bundle of
    several plans gives a PlanSet (every plan loaded, over one copy of the weights).
    """
    from aicf_run.bundle import read_bundle
    from aicf_run.device import check_arch, open_device
    from aicf_run.executor import Executor

    bundle = read_bundle(path)
    gpu = open_device(device)
    try:
        check_arch(bundle.arch, gpu.arch)
        if len(bundle.plans) > 1:
            from aicf_run.plan_set import PlanSet
            return PlanSet(bundle, gpu, graph=graph)
        return Executor(bundle, gpu, graph=graph)
    except BaseException:
        gpu.close()
        raise
