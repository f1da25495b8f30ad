"""aicf-run: execute a compiled `.aicf` bundle on an NVIDIA GPU.

The runtime never imports the compiler and never decides anything: it loads the bundle's
cubins and runs its launch plan. PyCUDA is imported only when a device is opened.

    executor = aicf_run.load("model.aicf")
    outputs = executor.run({"x": x})
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aicf_run.executor import Executor

__version__ = "0.1.0"
__all__ = ["__version__", "load"]


def load(path: str | os.PathLike, device: int = 0) -> Executor:
    """Read and check the bundle at `path`, open GPU `device` and load the bundle onto it."""
    from aicf_run.bundle import read_bundle
    from aicf_run.device import check_arch, open_device
    from aicf_run.executor import Executor

    bundle = read_bundle(path)
    gpu = open_device(device)
    try:
        check_arch(bundle.arch, gpu.arch)
        return Executor(bundle, gpu)
    except BaseException:
        gpu.close()
        raise
