"""Weight bytes without whole copies: lazy sources, and the pieces the executor uploads.

A weight's bytes are either in memory (`bytes`, inline in a version-1 bundle or a small
payload) or somewhere else, read when needed:
- `Lazy`: the compiler's weights that stay in the model's external-data files (`FileSlice`)
  or are derived from them (aicfc's `Joined`), so a 4 GB model is never resident twice;
- a version-2 bundle's weights section (docs/bundle-format.md), a range of the bundle file.

`weight_pieces` is the host side of the upload: which byte ranges, in what order, with what
checks. It yields every weight in `bundle.weights` order in pieces of at most `chunk_bytes`,
each read straight from the file into one reused staging buffer, and checks each weight's
SHA-256 before its last piece leaves, so the memory it needs is one chunk whatever the
model's size. `Executor._upload_weights` copies each piece to the device; the tests replay
the pieces into a host array.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aicf_run.errors import RunError

if TYPE_CHECKING:
    from aicf_run.bundle import Bundle

CHUNK_BYTES = 64 << 20   # one staging buffer: large copies, bounded memory

Data = Any   # bytes | bytearray | memoryview | Lazy


class Lazy:
    """Bytes that are read when needed: `len()` is known, `chunks()` reads them."""

    def __len__(self) -> int:
        raise NotImplementedError

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes | memoryview]:
        """The bytes in order, in pieces of at most `size`."""
        raise NotImplementedError

    def read(self) -> bytes:
        """All the bytes (one copy in memory, for the caller that needs them at once)."""
        return b"".join(bytes(c) for c in self.chunks())

    def sha256(self) -> str:
        h = hashlib.sha256()
        for c in self.chunks():
            h.update(c)
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class FileSlice(Lazy):
    """`nbytes` bytes at `offset` of the file `path` (checked by whoever made the slice)."""

    path: str
    offset: int
    nbytes: int

    def __len__(self) -> int:
        return self.nbytes

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        size = max(1, size)
        try:
            with open(self.path, "rb") as f:
                done = 0
                while done < self.nbytes:
                    piece = os.pread(f.fileno(), min(size, self.nbytes - done), self.offset + done)
                    if not piece:
                        raise RunError(f"{self.path} is shorter than it was when the model was loaded "
                                       f"(needed bytes {self.offset}..{self.offset + self.nbytes}); "
                                       f"it changed during the compile, run it again")
                    done += len(piece)
                    yield piece
        except OSError as err:
            raise RunError(f"cannot read {self.path}: {err.strerror or err}") from None


def data_len(data: Data) -> int:
    return len(data) if isinstance(data, Lazy) else memoryview(data).nbytes


def data_chunks(data: Data, size: int = CHUNK_BYTES) -> Iterator[bytes | memoryview]:
    """`data`'s bytes in pieces of at most `size`: slices of memory, or a Lazy's reads."""
    if isinstance(data, Lazy):
        yield from data.chunks(size)
        return
    view = memoryview(data).cast("B")
    for start in range(0, len(view), max(1, size)):
        yield view[start:start + size]


def data_sha256(data: Data) -> str:
    if isinstance(data, Lazy):
        return data.sha256()
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Piece:
    """Copy `data` to byte `start` of buffer `buffer` (a buffer id)."""

    buffer: int
    start: int
    data: memoryview


def weight_pieces(bundle: Bundle, chunk_bytes: int = CHUNK_BYTES,
                  staging: Any = None) -> Iterator[Piece]:
    """Every weight of `bundle` as pieces to copy, in `bundle.weights` order.

    Inline weights are sliced where they lie. Section weights are read from `bundle.path` at
    `bundle.section_offset + offset` into `staging` (a writable buffer of at least
    `chunk_bytes` bytes, e.g. page-locked memory; a bytearray when None); a piece's view is only
    valid until the next piece is taken, so copy it first. A weight whose bytes do not match
    its `sha256` raises RunError before its last piece is yielded; so does a file that is not
    the size it was when it was read.
    """
    chunk_bytes = max(1, chunk_bytes)
    section = [w for w in bundle.weights if "data" not in w]
    # No staged piece is longer than the longest section weight: a small bundle stages little.
    stage_bytes = min(chunk_bytes, max((w["nbytes"] for w in section), default=1))
    if section and bundle.path is None:
        raise RunError("the bundle's weights are in its file's weights section, but it was "
                       "not read from a file; read it with read_bundle")
    handle = None
    try:
        if section:
            handle = _open_section(bundle)
            if staging is None:
                staging = bytearray(stage_bytes)
            view = memoryview(staging).cast("B")
            if len(view) < stage_bytes:
                raise ValueError(f"staging buffer of {len(view)} bytes is smaller than one chunk ({stage_bytes})")
        for i, weight in enumerate(bundle.weights):
            digest = hashlib.sha256()
            if "data" in weight:
                pieces = ((start, c) for start, c in _offsets(data_chunks(weight["data"], chunk_bytes)))
            else:
                pieces = _read_range(bundle, handle, view, weight, stage_bytes)
            total = data_len(weight["data"]) if "data" in weight else weight["nbytes"]
            bad = RunError(f"{_name(bundle)}: weights[{i}] (buffer {weight['buffer']}) does not match "
                           f"its sha256; the file is corrupt, recompile it")
            seen = 0
            for start, data in pieces:
                digest.update(data)
                seen = start + len(data)
                if seen == total and digest.hexdigest() != weight["sha256"]:
                    raise bad
                yield Piece(weight["buffer"], start, data)
            if seen != total or (total == 0 and digest.hexdigest() != weight["sha256"]):
                raise bad
    finally:
        if handle is not None:
            handle.close()


def check_weights(bundle: Bundle, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Read every weight once and check its checksum (what `read_bundle` does)."""
    for _ in weight_pieces(bundle, chunk_bytes):
        pass


def _name(bundle: Bundle) -> str:
    return str(bundle.path) if bundle.path is not None else "bundle"


def _offsets(chunks: Iterator[bytes | memoryview]) -> Iterator[tuple[int, memoryview]]:
    start = 0
    for c in chunks:
        view = memoryview(c)
        yield start, view
        start += len(view)


def _open_section(bundle: Bundle):
    name = str(bundle.path)
    try:
        handle = open(name, "rb")
    except OSError as err:
        raise RunError(f"cannot read bundle {name}: {err.strerror or err}; check the path") from None
    size = os.fstat(handle.fileno()).st_size
    if size != bundle.section_offset + bundle.section_bytes:
        handle.close()
        raise RunError(f"{name} changed since it was read ({size} bytes, expected "
                       f"{bundle.section_offset + bundle.section_bytes}); read it again")
    return handle


def _read_range(bundle: Bundle, handle, view: memoryview, weight: dict,
                chunk_bytes: int) -> Iterator[tuple[int, memoryview]]:
    """The weight's bytes, `chunk_bytes` at a time, through `view` (the staging buffer)."""
    base = bundle.section_offset + weight["offset"]
    nbytes = weight["nbytes"]
    start = 0
    while start < nbytes:
        want = min(chunk_bytes, nbytes - start)
        try:
            got = os.preadv(handle.fileno(), [view[:want]], base + start)
        except OSError as err:
            raise RunError(f"cannot read bundle {bundle.path}: {err.strerror or err}") from None
        if got != want:
            raise RunError(f"{bundle.path} changed while it was being read; read it again")
        yield start, view[:want]
        start += want


def inlined(bundle: Bundle) -> dict[str, Any]:
    """The bundle's payload with every weight inline (`data`), as the compiler wrote it.

    It holds all the weights in memory: for tests and small bundles, never the executor."""
    data: dict[int, bytearray] = {w["buffer"]: bytearray() for w in bundle.weights}
    for piece in weight_pieces(bundle):
        data[piece.buffer] += piece.data
    weights = [{"buffer": w["buffer"], "data": bytes(data[w["buffer"]]), "sha256": w["sha256"]}
               for w in bundle.weights]
    return {**bundle.payload, "weights": weights}
