"""The `.aicf` bundle on disk: `write_bundle` here, `read_bundle` from the runtime.

The format lives in `aicf_run.bundle` (the runtime must never import the compiler), so the
compiler writes with the runtime's header constants and validator: a bundle `aicfc` writes is
one `aicf-run` accepts. See docs/bundle-format.md.
"""

from aicf_run.bundle import read_bundle
from aicfc.artifact.writer import write_bundle

__all__ = ["read_bundle", "write_bundle"]
