"""Shared fixtures. GPU tests are marked `gpu` and skip cleanly where PyCUDA or a GPU is missing."""
from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def gpu_available() -> str | None:
    """None when a GPU can be used, else the reason it cannot."""
    try:
        import pycuda.driver as cuda
        cuda.init()
        if cuda.Device.count() < 1:
            return "no CUDA device"
    except Exception as e:  # ImportError, or the driver's own error
        return f"no usable GPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords:
            reason = gpu_available()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep the cubin cache of a test run out of the user's home."""
    os.environ.setdefault("AICF_CACHE_DIR", str(tmp_path_factory.mktemp("aicf-cache")))
