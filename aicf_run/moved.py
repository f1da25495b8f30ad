"""A kernel launched with some of its buffers at other addresses, tensor maps included (for `--profile`).

[Note: moved maps]
`aicf-run --profile` times each kernel over copies of the buffers that would otherwise stay in L2 between its
launches ([Note: cold weights], [Note: outputs written back] in aicf_run/profile.py). A kernel with TMA tensor
maps (the Hopper GEMMs and convolutions) reads its operands and stores its output through maps, which hold the
buffers' addresses, not through its pointer arguments; so until session 79 such a kernel kept its buffers and,
repeated alone, its weights and output stayed in L2 (ResNet-50 B32's stage-2 expansions with their residual ran
at 0.69-0.73 of their DRAM-bound predictions alone and 1.0 in the plan's chain; session 78, an H100). Here a
moved launch has maps of its own: each map whose buffer moved is encoded again at the copy's address
(`map_addresses`), uploaded as a table of its own (the kernel's first argument), and, where the kernel reads its
maps from constant memory ([Note: TMA maps in constant memory] in aicfc/codegen/tma.py), written into a second
instance of the kernel's module, loaded for this launch alone: one module instance has one constant bank, and the
plan's launches keep theirs. A dependent launch ([Note: PDL]) loads that instance through the driver API, a plain
one through PyCUDA, as the executor does. `free()` releases the instance and the table; the caller makes sure no
launch of it is still queued (the profile synchronizes first).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

from aicf_run import pdl, tensormap


def map_addresses(kernel: Mapping[str, Any], buffer_pointers: Sequence[int],
                  moved: Mapping[int, int]) -> list[int]:
    """The address each of `kernel`'s tensor maps reads with the arguments at the positions of `moved` ({argument
    position: new address}) moved: a map over a moved argument's buffer follows it, the others stay."""
    by_buffer = {kernel["args"][i]: address for i, address in moved.items()}
    return [by_buffer.get(record["buffer"], buffer_pointers[record["buffer"]])
            for record in kernel.get("tensor_maps", ())]


class MovedLaunch:
    """One kernel's launch with moved buffers: call it to enqueue the launch; `free()` after the stream is idle."""

    def __init__(self, enqueue: Callable[[Any], None], launch: Any, held: Sequence[Any] = (),
                 instance: pdl.Modules | None = None, keep: Any = None) -> None:
        self._enqueue, self._launch = enqueue, launch
        self._held, self._instance = list(held), instance
        self._keep = keep   # a PyCUDA module instance of its own, unloaded when its last reference goes

    def __call__(self) -> None:
        self._enqueue(self._launch)

    def free(self) -> None:
        held, self._held = self._held, []
        for allocation in held:
            allocation.free()
        instance, self._instance = self._instance, None
        if instance is not None:
            instance.close()
        self._launch = self._keep = None


def moved_maps(cuda: Any, kernel: Mapping[str, Any], buffer_pointers: Sequence[int], moved: Mapping[int, int],
               what: str) -> tuple[tuple[bytes, ...], Any, int]:
    """`kernel`'s tensor maps encoded at their moved addresses, and the device table holding them (its allocation,
    freed by the caller, and address)."""
    maps = tuple(tensormap.encode(record, address, name=f"{what} tensor_maps[{i}] (moved)")
                 for i, (record, address) in enumerate(zip(kernel.get("tensor_maps", ()),
                                                           map_addresses(kernel, buffer_pointers, moved))))
    allocation, [table] = tensormap.upload(cuda, [maps], f"{what} (moved)")
    return maps, allocation, table
