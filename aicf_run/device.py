"""Open a GPU through PyCUDA, and decide whether a bundle's cubins can run on it.

PyCUDA is imported only inside `open_device`, so everything else in the runtime (reading and
validating bundles and inputs) works on a machine without a GPU, and tests can run there.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aicf_run.errors import RunError

_INSTALL_HINT = "install the GPU extra: pip install 'aicf[gpu]' (needs an NVIDIA driver)"
# sm_XY: the last digit is the minor version, the rest the major (sm_90 -> 9.0, sm_100 -> 10.0).
# A trailing "a" marks arch-specific features that run on that exact architecture only; "f"
# marks family-specific ones that run on the same major with an equal or higher minor.
_ARCH = re.compile(r"sm_([0-9]{1,2})([0-9])([af]?)")


def check_arch(bundle_arch: str, device_arch: str) -> None:
    """Raise RunError unless a cubin for `bundle_arch` can run on a `device_arch` GPU.

    A cubin for sm_XY runs only on a GPU of the same major X with minor >= Y (sm_80 runs on
    sm_86, not on sm_90); an "a" cubin (sm_90a) needs exactly that GPU.
    """
    bundle = _ARCH.fullmatch(bundle_arch)
    device = _ARCH.fullmatch(device_arch)
    if bundle is None or device is None:
        bad = bundle_arch if bundle is None else device_arch
        raise RunError(f"cannot compare architectures: {bad!r} is not like 'sm_90'; "
                       f"recompile with aicfc compile --target {device_arch}")
    major, minor, suffix = int(bundle[1]), int(bundle[2]), bundle[3]
    device_major, device_minor = int(device[1]), int(device[2])
    runs = major == device_major and (
        minor == device_minor if suffix == "a" else minor <= device_minor)
    if not runs:
        plain = f"sm_{device_major}{device_minor}"
        raise RunError(f"bundle was compiled for {bundle_arch} but this GPU is {plain}; "
                       f"recompile with aicfc compile --target {plain}")


@dataclass(eq=False)
class Device:
    """A GPU with a PyCUDA context made current on this thread.

    `driver` is the `pycuda.driver` module, so nothing else needs to import PyCUDA.
    Callbacks given to `on_close` run before the context is popped (LIFO), which is how the
    executor frees its device memory while the context is still alive. `lost` is set when a
    kernel fault has left the context unusable (a sticky CUDA error).
    """

    driver: Any
    context: Any
    ordinal: int
    name: str
    arch: str
    lost: bool = False
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)

    def on_close(self, callback: Callable[[], None]) -> None:
        self._closers.append(callback)

    def close(self) -> None:
        """Run the close callbacks and pop the context; safe to call twice (atexit does)."""
        if self._closed:
            return
        self._closed = True
        # In a lost context every free fails and PyCUDA prints a warning per object straight to
        # file descriptor 2, burying the one-line error that explains the fault.
        with _silence_stderr() if self.lost else contextlib.nullcontext():
            while self._closers:
                self._closers.pop()()
            # The closers have freed every PyCUDA object in the context, so it can go: pop it
            # off this thread's stack and detach it (release our hold on the primary context),
            # so that opening and closing devices repeatedly in one process piles up nothing.
            try:
                self.context.pop()
                self.context.detach()
            except self.driver.Error:
                pass  # not this thread's current context any more; the driver frees it at exit


def open_device(ordinal: int = 0) -> Device:
    """Initialise CUDA and make a context on GPU `ordinal`; RunError when that is impossible."""
    cuda = _import_driver()
    try:
        cuda.init()
        count = cuda.Device.count()
    except (cuda.Error, RuntimeError, OSError) as err:
        raise RunError(f"cannot initialise CUDA ({_one_line(err)}); check that an NVIDIA GPU "
                       f"and its driver are present (nvidia-smi)") from None
    if count == 0:
        raise RunError("no NVIDIA GPU found; aicf-run needs one (check nvidia-smi)")
    if not 0 <= ordinal < count:
        raise RunError(f"there is no GPU {ordinal}: this machine has {count} "
                       f"(--device 0..{count - 1})")
    try:
        gpu = cuda.Device(ordinal)
        major, minor = gpu.compute_capability()
        name = gpu.name()
        # The primary context: the one the CUDA runtime (torch, CuPy, JAX) uses, so that
        # their device pointers are valid in our kernels and ours in theirs.
        context = gpu.retain_primary_context()
        context.push()
    except (cuda.Error, RuntimeError) as err:
        raise RunError(f"cannot open GPU {ordinal} ({_one_line(err)}); check nvidia-smi, the "
                       f"GPU may be busy or in exclusive mode") from None
    device = Device(driver=cuda, context=context, ordinal=ordinal, name=name,
                    arch=f"sm_{major}{minor}")
    atexit.register(device.close)
    return device


def _import_driver() -> Any:
    try:
        import pycuda.driver as cuda
    except ModuleNotFoundError as err:
        if err.name in ("pycuda", "pycuda.driver"):
            raise RunError(f"PyCUDA is not installed; {_INSTALL_HINT}") from None
        raise RunError(f"PyCUDA cannot be imported ({_one_line(err)}); {_INSTALL_HINT}") from None
    except ImportError as err:
        # pycuda._driver links against libcuda: without an NVIDIA driver this import fails.
        raise RunError(f"PyCUDA cannot load the CUDA driver ({_one_line(err)}); install an "
                       f"NVIDIA driver and check nvidia-smi") from None
    return cuda


@contextlib.contextmanager
def _silence_stderr() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null for the block (C++ code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
