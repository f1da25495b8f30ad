"""Write a payload as a `.aicf` bundle: validate, pack, then replace the target atomically.

The file (format version 2, or 3 for several plans: docs/bundle-format.md) is the 56-byte
header, the msgpack payload without the weights' bytes, then the weights section: every weight end to end, streamed from
wherever it lies (memory, or the model's external-data files) one chunk at a time, and hashed
on the way against its `sha256`, so no copy of all the weights is ever made here and msgpack's
4 GiB object limit never applies to them. It is written to a temporary file in the target
folder, fsynced and renamed over the target, so a reader sees either the old file or the
complete new one, never a partial bundle; on any failure the temporary file is removed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from aicf_run.bundle import FORMAT_VERSION, HEADER, MAGIC, MAX_PAYLOAD_BYTES
from aicf_run.errors import RunError
from aicf_run.plans import PLANS_VERSION, check_plans
from aicf_run.schema import check_payload
from aicf_run.weights import CHUNK_BYTES, data_chunks, data_len
from aicfc.errors import AicfError


def write_bundle(payload: dict[str, Any], path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Validate `payload` with the runtime's checks and write it to `path` atomically.

    `payload` holds its weights inline (`data`: bytes or an aicf_run.weights.Lazy); they go to
    the weights section, `chunk_bytes` at a time. An invalid payload is a compiler bug, not a
    user error, so it raises ValueError (naming the first bad field) and nothing is written. An
    unwritable destination raises AicfError. A payload of several plans (format version 3,
    aicfc/artifact/plans.py) is written as version 3, its blobs to the section; any other as
    version 2.
    """
    version = PLANS_VERSION if payload.get("format_version") == PLANS_VERSION else FORMAT_VERSION
    try:
        if version == PLANS_VERSION:
            check_plans(payload, None, digests=False)
        else:
            check_payload(payload, FORMAT_VERSION, None, digests=False)
    except RunError as err:
        raise ValueError(f"refusing to write an invalid bundle: {err}") from err
    entries, sources, end = [], [], 0
    for weight in payload["weights"]:
        nbytes = data_len(weight["data"])
        owner = {"buffer": weight["buffer"]} if version != PLANS_VERSION else {}   # v3: blobs have none
        entries.append({**owner, "offset": end, "nbytes": nbytes, "sha256": weight["sha256"]})
        sources.append(weight["data"])
        end += nbytes
    data = msgpack.packb({**payload, "weights": entries}, use_bin_type=True)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise AicfError(f"the bundle payload is {len(data)} bytes, over the format's "
                        f"{MAX_PAYLOAD_BYTES}-byte limit; compile a smaller model")
    header = HEADER.pack(MAGIC, version, 0, len(data), hashlib.sha256(data).digest())
    target = Path(path)
    try:
        _write_atomically(target, header, data, _section(entries, sources, chunk_bytes))
    except OSError as err:
        raise AicfError(f"cannot write bundle {target}: {err.strerror or err}; check that the "
                        f"folder exists and is writable") from None


def _section(entries: list[dict], sources: list[Any], chunk_bytes: int) -> Iterator[bytes | memoryview]:
    """The weights section's bytes in order, each weight hashed against its entry on the way."""
    for i, (entry, source) in enumerate(zip(entries, sources)):
        digest, seen = hashlib.sha256(), 0
        for chunk in data_chunks(source, chunk_bytes):
            digest.update(chunk)
            seen += len(chunk)
            yield chunk
        if seen != entry["nbytes"] or digest.hexdigest() != entry["sha256"]:
            raise ValueError(f"refusing to write an invalid bundle: bad bundle field weights[{i}].sha256: "
                             f"does not match its data ({seen} bytes read)")


def _write_atomically(target: Path, header: bytes, data: bytes, section: Iterable[bytes | memoryview] = ()) -> None:
    # A dot-prefixed random name in the same folder: os.replace is only atomic within one
    # filesystem, and O_EXCL guarantees we never clobber someone else's file.
    temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # Mode 0o666 lets the umask decide the final permissions, as for any ordinary file.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(data)
            for chunk in section:
                f.write(chunk)
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
