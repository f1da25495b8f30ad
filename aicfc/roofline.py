"""Roofline plots for `aicfc explain --roofline`: the runtime's plotting, with the compiler's error.

The drawing (points, axes, ceilings, the atomic write) lives in aicf_run.roofline, so that
`aicf-run --profile --roofline` can plot measured points without importing the compiler; the
compiler may import the runtime, never the reverse. Here its RunErrors become AicfErrors, the
compiler's one user-facing exception; the message is the same.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from aicf_run import roofline as _runtime
from aicf_run.errors import RunError
from aicf_run.roofline import FORMATS, KINDS, Point, points_from_payload
from aicfc.errors import AicfError

__all__ = ["FORMATS", "KINDS", "Point", "check_path", "plot_roofline", "points_from_payload"]


def check_path(path: str | os.PathLike) -> Path:
    """`path` if matplotlib can write a plot there by its suffix, else AicfError."""
    try:
        return _runtime.check_path(path)
    except RunError as err:
        raise AicfError(str(err)) from None


def plot_roofline(profile: dict[str, Any], points: Iterable[Point], path: str | os.PathLike,
                  title: str | None = None) -> list[Point]:
    """Draw `points` on the roofline of `profile` into `path` (see aicf_run.roofline.plot_roofline)."""
    try:
        return _runtime.plot_roofline(profile, points, path, title)
    except RunError as err:
        raise AicfError(str(err)) from None
