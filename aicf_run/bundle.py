"""Read and validate `.aicf` bundles (format versions 1, 2 and 3, see docs/bundle-format.md).

The runtime owns the format: the compiler's writer imports `validate_payload` and the header
constants from here, so a bundle that `aicfc` writes is by construction one that `aicf-run`
accepts. Every problem becomes a one-line `RunError` that names it and what to do.

Lengths read from the file are never trusted: the header's payload length is compared with the
file size before any payload byte is read, so a forged length cannot make us allocate.
Version 2 puts the weights in a section after the payload: it is never read into memory
whole; `read_bundle` checks every weight's checksum one chunk at a time (aicf_run/weights.py)
and the executor uploads it the same way. Version 3 holds several plans over one copy of the
weights ([Note: plans] in aicf_run/plans.py); its Bundle is the first plan's, with every plan's
in `plans`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from aicf_run.errors import RunError
from aicf_run.plans import PLANS_VERSION, check_plans, plan_views
from aicf_run.schema import check_payload
from aicf_run.weights import check_weights

__all__ = [
    "MAGIC", "FORMAT_VERSION", "READABLE_VERSIONS", "HEADER", "MAX_PAYLOAD_BYTES", "Bundle",
    "read_bundle", "validate_payload",
]

# The doc's literal b"\x89AICF\r\n\x1a\n" is 9 bytes (PNG's is 8 because "PNG" has 3
# letters); the header has 8 bytes for it, so the magic is that literal's first 8 bytes. The
# high bit and the CR LF still catch 7-bit and text-mode mangling; the checksum catches the rest.
MAGIC = b"\x89AICF\r\n\x1a"
FORMAT_VERSION = 2
# Version 1 (no weights section: every weight inline in the payload) is still read. Version 3
# (several plans, aicf_run/plans.py) is written only for a bundle of several plans: a
# single-plan bundle is still written as version 2, which older aicf-runs read.
READABLE_VERSIONS = (1, 2, PLANS_VERSION)
# magic, version, flags, payload length, SHA-256 of the payload: 8 + 4 + 4 + 8 + 32 = 56 bytes.
HEADER = struct.Struct("<8sIIQ32s")
assert len(MAGIC) == 8 and HEADER.size == 56
MAX_PAYLOAD_BYTES = 16 * 2**30

_RECOMPILE = "recompile the model with `aicfc compile`"


@dataclass(frozen=True)
class Bundle:
    """A validated bundle. The fields are views into `payload`; treat them as read-only."""

    path: Path | None
    payload: dict[str, Any]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    buffers: list[dict[str, Any]]
    kernels: list[dict[str, Any]]
    modules: list[dict[str, Any]]
    weights: list[dict[str, Any]]
    memory: dict[str, Any]
    target: dict[str, Any]
    # Where the weights section lies in the file (version 2); (0, 0) when every weight is inline.
    section_offset: int = 0
    section_bytes: int = 0
    # Version 3: every plan, each a Bundle of its own view (this one's fields are plans[0]'s).
    plan_list: tuple[Bundle, ...] = ()
    # Version 3: the payload as stored (`payload` is the first plan's view); else `payload`.
    stored: dict[str, Any] | None = None

    @classmethod
    def from_payload(cls, payload: dict[str, Any], path: str | os.PathLike | None = None,
                     section: tuple[int, int] | None = None) -> Bundle:
        """Validate `payload` and wrap it; raises RunError naming the first bad field.

        `section` is (file offset, length) of the weights section of the file at `path`; None for
        a payload in memory, whose weights must then all be inline (`data`)."""
        version = payload.get("format_version") if isinstance(payload, dict) else None
        if version == PLANS_VERSION:
            check_plans(payload, None if section is None else section[1])
            plans = tuple(cls._of(view, path, section) for view in plan_views(payload))
            return dataclasses.replace(plans[0], plan_list=plans, stored=payload)
        check_payload(payload, version if version in READABLE_VERSIONS else FORMAT_VERSION,
                      None if section is None else section[1])
        return cls._of(payload, path, section)

    @classmethod
    def _of(cls, payload: dict[str, Any], path: str | os.PathLike | None,
            section: tuple[int, int] | None) -> Bundle:
        """Wrap a checked single-plan payload (or one plan's view)."""
        section_offset, section_bytes = section or (0, 0)
        return cls(
            path=None if path is None else Path(path),
            payload=payload,
            inputs=payload["inputs"],
            outputs=payload["outputs"],
            buffers=payload["buffers"],
            kernels=payload["kernels"],
            modules=payload["modules"],
            weights=payload["weights"],
            memory=payload["memory"],
            target=payload["target"],
            section_offset=section_offset,
            section_bytes=section_bytes,
        )

    @property
    def plans(self) -> tuple[Bundle, ...]:
        """Every plan, one Bundle each, in the bundle's order; (self,) for a single-plan bundle."""
        return self.plan_list or (self,)

    @property
    def state_names(self) -> frozenset[str]:
        """The input names of every plan's state tensors ([Note: state] in aicf_run/executor.py): inputs
        that `run` writes into the state before the run, not arena inputs and not part of a plan's shapes."""
        return frozenset(item["name"] for plan in self.plans for item in plan.payload.get("state", []))

    @property
    def arch(self) -> str:
        """The GPU architecture the cubins were built for, e.g. "sm_90"."""
        return self.target["arch"]


def validate_payload(payload: dict[str, Any]) -> None:
    """Raise RunError naming the first field of `payload` that breaks the format (see schema).

    A payload in memory has every weight inline (`data`: bytes, or an aicf_run.weights.Lazy)."""
    if isinstance(payload, dict) and payload.get("format_version") == PLANS_VERSION:
        check_plans(payload, None)
        return
    check_payload(payload, FORMAT_VERSION)


def read_bundle(path: str | os.PathLike) -> Bundle:
    """Read, check and decode the bundle at `path`; every failure is a one-line RunError."""
    name = os.fspath(path)
    try:
        # stat before open: opening a FIFO or a device could block or never end.
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise RunError(f"{name} is not a regular file; pass a file written by "
                           f"`aicfc compile`")
        with open(name, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            header = f.read(HEADER.size)
            version, payload_length = _check_header(name, header, file_size)
            data = f.read(payload_length)
    except OSError as err:
        raise RunError(f"cannot read bundle {name}: {err.strerror or err}; "
                       f"check the path") from None
    if len(data) != payload_length:
        raise RunError(f"{name} changed while it was being read; try again")
    if hashlib.sha256(data).digest() != header[24:56]:
        raise RunError(f"{name} checksum mismatch (SHA-256 of the payload differs from the "
                       f"header); the file is corrupt, recompile it")
    payload = _decode(name, data)
    section = None
    if version >= 2:
        section = (HEADER.size + payload_length, file_size - HEADER.size - payload_length)
    try:
        if payload.get("format_version") != version:
            check_payload(payload, version)   # names the mismatch
        bundle = Bundle.from_payload(payload, path, section)
    except RunError as err:
        raise RunError(f"{name}: {err}") from None
    if bundle.stored is not None:
        # Version 3: every blob of the section once (a plan's view may leave some out).
        blobs = [{"buffer": i, **blob} for i, blob in enumerate(bundle.stored["weights"])]
        check_weights(dataclasses.replace(bundle, weights=blobs))
    else:
        check_weights(bundle)
    return bundle


def _check_header(name: str, header: bytes, file_size: int) -> tuple[int, int]:
    """Check the 56-byte header against the file size; return (version, payload length).

    Version 1 ends at the payload; version 2 has the weights section after it, whose length
    is the rest of the file (the payload's weights entries must add up to it)."""
    if file_size == 0:
        raise RunError(f"{name} is empty (0 bytes); pass a file written by `aicfc compile`")
    prefix = min(len(header), len(MAGIC))
    if header[:prefix] != MAGIC[:prefix]:
        raise RunError(f"{name} is not an AICF bundle (bad magic); pass a file written by "
                       f"`aicfc compile`")
    if len(header) < HEADER.size:
        raise RunError(f"{name} is truncated: {file_size} bytes, shorter than the "
                       f"{HEADER.size}-byte header; recompile it")
    _magic, version, flags, payload_length, _digest = HEADER.unpack(header)
    if version not in READABLE_VERSIONS:
        raise RunError(f"{name} format version {version} is not supported by this aicf-run "
                       f"(supports {', '.join(map(str, READABLE_VERSIONS))}); {_RECOMPILE} or use "
                       f"a matching aicf-run")
    if flags != 0:
        raise RunError(f"{name} has unknown header flags 0x{flags:08x} (must be 0); "
                       f"{_RECOMPILE} or use a matching aicf-run")
    if payload_length > MAX_PAYLOAD_BYTES:
        raise RunError(f"{name} header claims a {payload_length}-byte payload, over the "
                       f"{MAX_PAYLOAD_BYTES}-byte limit; the file is corrupt, recompile it")
    available = file_size - HEADER.size
    if payload_length > available:
        raise RunError(f"{name} is truncated: header says {payload_length} payload bytes, "
                       f"file has {available}; recompile it")
    if payload_length < available and version == 1:
        raise RunError(f"{name} has {available - payload_length} bytes after the payload "
                       f"(header says {payload_length}, file has {available}); the file is "
                       f"corrupt, recompile it")
    return version, payload_length


def _decode(name: str, data: bytes) -> dict[str, Any]:
    """Unpack the msgpack payload; it must be one map."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=False)
    # msgpack reports bad data through several unrelated types: ExtraData, FormatError and
    # StackError (ValueError), UnicodeDecodeError (ValueError), TypeError for an unhashable
    # map key, OutOfData (UnpackException). All mean the same thing here.
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as err:
        detail = " ".join(str(err).split())[:200]
        raise RunError(f"{name} payload is not valid msgpack ({type(err).__name__}: {detail}); "
                       f"the file is corrupt, recompile it") from None
    if not isinstance(payload, dict):
        raise RunError(f"{name} payload is a msgpack {type(payload).__name__}, not a map; "
                       f"the file is corrupt, recompile it")
    return payload
