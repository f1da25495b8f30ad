"""Write a payload as a `.aicf` bundle: validate, pack, then replace the target atomically.

The file is the 56-byte header of docs/bundle-format.md followed by the msgpack payload. It is
written to a temporary file in the target folder, fsynced and renamed over the target, so a
reader sees either the old file or the complete new one, never a partial bundle; on any
failure the temporary file is removed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

import msgpack

from aicf_run.bundle import FORMAT_VERSION, HEADER, MAGIC, MAX_PAYLOAD_BYTES, validate_payload
from aicf_run.errors import RunError
from aicfc.errors import AicfError


def write_bundle(payload: dict[str, Any], path: str | os.PathLike) -> None:
    """Validate `payload` with the runtime's checks and write it to `path` atomically.

    An invalid payload is a compiler bug, not a user error, so it raises ValueError (naming the
    first bad field) and nothing is written. An unwritable destination raises AicfError.
    """
    try:
        validate_payload(payload)
    except RunError as err:
        raise ValueError(f"refusing to write an invalid bundle: {err}") from err
    data = msgpack.packb(payload, use_bin_type=True)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise AicfError(f"the bundle payload is {len(data)} bytes, over the format's "
                        f"{MAX_PAYLOAD_BYTES}-byte limit; compile a smaller model")
    header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(data), hashlib.sha256(data).digest())
    target = Path(path)
    try:
        _write_atomically(target, header, data)
    except OSError as err:
        raise AicfError(f"cannot write bundle {target}: {err.strerror or err}; check that the "
                        f"folder exists and is writable") from None


def _write_atomically(target: Path, header: bytes, data: bytes) -> None:
    # A dot-prefixed random name in the same folder: os.replace is only atomic within one
    # filesystem, and O_EXCL guarantees we never clobber someone else's file.
    temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # Mode 0o666 lets the umask decide the final permissions, as for any ordinary file.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; best effort, as some filesystems refuse to fsync a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
