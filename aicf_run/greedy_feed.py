"""Greedy decoding on the device: the decode plan and its feed kernels replayed back to back.

The compiler gave the decode plan a `greedy` record and a feed module ([Note: greedy feed] in
aicfc/codegen/greedy_feed.py): an argmax that writes each row's next token into a log and the
control words, and an advance that writes the tokens into `input_ids` and the next position
into `cache_position` (at one row the argmax does that itself: [Note: the advance in the argmax]
in aicfc/codegen/greedy_feed.py). Here they are loaded, their memory allocated (the log, the control
words, page-locked copies of both for reading back) and [plan + argmax + advance] captured as
one CUDA graph (launched kernel by kernel when the executor runs without graphs). One
`launch(n)` enqueues n steps and nothing else; `read_back(slot)` enqueues copies of the log and
the control words and an event; `collect` waits for that event only. aicf_run.generate drives it.

[Note: steps in one graph] Each CUDA graph launch costs the GPU a few microseconds before its first kernel
starts, and the kernels of one graph do not overlap the next graph's. So the steps a chunk enqueues
(aicf_run/generate.py's CHUNK_STEPS) are captured as one graph of that many steps, with a one-step graph for
the remainder; both are captured when the feed is set up. Where the bundle compiled the feed's kernels with the
dependent-launch entry (the record's `launch` is "dependent", [Note: PDL] in aicfc/codegen/pdl.py), the argmax
and the advance are launched with programmatic serialization like the plan's kernels, so each lands while the
kernel before it finishes and waits for it on the device, and the next step's first kernel follows the advance
the same way inside a graph. `AICF_FEED_PLAIN=1` in the environment as the feed is set up keeps the form
before this (one step a graph, the feed's kernels launched plainly): an A/B's switch
(benchmarks/decode_ab.py's `run.AICF_FEED_PLAIN=1`). Measured on an H200 (session 54, the 1 B Llama's 4-layer
decode plan, 9 alternating rounds in one process; benchmarks/results/feed_graph_session54_h200.txt): the generate
step 0.1621 ms against 0.1641 with the switch (2.0 us a step), and 0.1603 against 0.1617 in a later call (7 rounds),
the same tokens, the plan's own replay unchanged.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from aicf_run.errors import RunError
from aicf_run.graph import Graph
from aicf_run.pdl import DependentLaunch

_KEYS = ("module", "argmax", "advance", "buffers", "dtypes", "batch", "vocab", "log_rows", "max_stops", "control")
SLOTS = 2   # read-backs in flight: one chunk is read while the next one runs
GRAPH_STEPS = 8   # steps captured in one graph: aicf_run/generate.py's CHUNK_STEPS ([Note: steps in one graph])
ARGMAX_ARGS = ("logits", "log", "control", "ids", "position")   # every parameter an argmax may name
PLAIN_ENV = "AICF_FEED_PLAIN"   # "1": one step a graph, the feed's kernels launched plainly (an A/B's switch)
_FEEDS: "weakref.WeakKeyDictionary[Any, GreedyFeed]" = weakref.WeakKeyDictionary()


def argmax_names(record: dict) -> tuple[str, ...]:
    """The argmax's parameters by name, in order, as the greedy record gives them (`args`; logits, log and control
    before session 57, input_ids and cache_position too since, where no advance kernel writes them)."""
    names = record["argmax"].get("args", ("logits", "log", "control"))
    if (not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names)
            or len(set(names)) != len(names) or not set(names) <= set(ARGMAX_ARGS)
            or not {"logits", "log", "control"} <= set(names)
            or (not record.get("advance") and not {"ids", "position"} <= set(names))):
        raise RunError("the bundle's greedy record has an argmax of an unknown form; recompile the model with "
                       "`aicfc compile`")
    return tuple(names)


def greedy_feed(step: Any) -> "GreedyFeed | None":
    """The feed of a decode plan's executor (built at its first use, then kept with it), or None
    when its bundle has no `greedy` record (compiled before it, or not an aicf_run Executor)."""
    bundle = getattr(step, "bundle", None)
    payload = getattr(bundle, "payload", None)
    if not isinstance(payload, dict) or "greedy" not in payload or not hasattr(step, "launch"):
        return None
    feed = _FEEDS.get(step)
    if feed is None or feed.closed:
        feed = GreedyFeed(step)
        _FEEDS[step] = feed
    return feed


class GreedyFeed:
    """A decode plan's executor with its feed kernels ready to replay (module docstring)."""

    def __init__(self, step: Any) -> None:
        record = step.bundle.payload["greedy"]
        missing = [k for k in _KEYS if k not in record]
        if missing:
            raise RunError(f"the bundle's greedy record lacks {missing}; recompile the model with `aicfc compile`")
        self.record = record
        self.step = step
        self.batch = int(record["batch"])
        self.log_rows = int(record["log_rows"])
        self.max_stops = int(record["max_stops"])
        control = record["control"]
        self._done, self._last, self._stop_ids = int(control["done"]), int(control["last"]), int(control["stop_ids"])
        self._words = int(control["words"])
        self.closed = False
        self._graphs: dict[int, Graph] = {}   # steps -> a graph of that many steps ([Note: steps in one graph])
        self._log = self._control = None
        cuda = self._cuda = step.device.driver
        self._stream = step.stream
        module_record = step.bundle.modules[record["module"]]
        try:
            module = cuda.module_from_buffer(module_record["cubin"])
            self._argmax = module.get_function(record["argmax"]["symbol"])
            # [Note: the advance in the argmax] (aicfc/codegen/greedy_feed.py): none at one row
            self._advance = module.get_function(record["advance"]["symbol"]) if record["advance"] else None
        except cuda.Error as err:
            raise RunError(f"cannot load the greedy feed module {module_record['name']} ({_one_line(err)}); "
                           f"recompile the model with `aicfc compile`") from None
        self._module = module
        self._argmax_args = argmax_names(record)
        self._argmax.prepare("P" * len(self._argmax_args))
        if self._advance is not None:
            self._advance.prepare("PPP")
        self._dependent: tuple[Any, Any] | None = None
        pointers = _interface_pointers(step)
        buffers = record["buffers"]
        try:
            self._logits, self._ids, self._position = (pointers[buffers[k]] for k in ("logits", "ids", "position"))
        except KeyError:
            raise RunError("the bundle's greedy record names buffers that are not the decode plan's input_ids, "
                           "cache_position and logits; recompile the model with `aicfc compile`") from None
        self._ids_dtype = np.dtype(record["dtypes"]["ids"])
        self._position_dtype = np.dtype(record["dtypes"]["position"])
        step.device.on_close(self.close)
        try:
            self._log = cuda.mem_alloc(self.log_rows * self.batch * 8)
            self._control = cuda.mem_alloc(self._words * 8)
            self._host_log = [cuda.pagelocked_empty((self.log_rows, self.batch), np.int64) for _ in range(SLOTS)]
            self._host_control = [cuda.pagelocked_empty(self._words, np.int64) for _ in range(SLOTS)]
            self._start = cuda.pagelocked_empty(self._words, np.int64)
            self._start_ids = cuda.pagelocked_empty(self.batch, self._ids_dtype)
            self._start_position = cuda.pagelocked_empty(1, self._position_dtype)
            self._events = [cuda.Event() for _ in range(SLOTS)]
        except (cuda.Error, MemoryError) as err:
            self.close()
            raise RunError(f"cannot allocate the greedy feed's memory ({_one_line(err)})") from None
        plain = os.environ.get(PLAIN_ENV) == "1"
        self.graph_steps = 1 if plain else GRAPH_STEPS
        modules = getattr(step, "dependent_modules", None)
        if record.get("launch") == "dependent" and modules is not None and not plain:
            try:
                self._dependent = tuple(
                    DependentLaunch(modules, modules.function(record["module"], record[k]["symbol"], 0, f"feed {k}"),
                                    record[k]["grid"], record[k]["block"], 0, args, f"the greedy feed's {k}")
                    for k, args in (("argmax", self._argmax_pointers()),
                                    ("advance", (self._ids, self._position, int(self._control))))
                    if record[k])
            except RunError:
                self.close()
                raise
        if step.uses_graph:
            try:
                for steps in dict.fromkeys((self.graph_steps, 1)):
                    graph = Graph.capture(self._stream, lambda n=steps: self._enqueue_steps(n))
                    self._graphs[steps] = graph
                    graph.upload(self._stream)
            except RunError:
                self.close()
                raise

    def start(self, tokens: np.ndarray, position: int, stops: np.ndarray, done: np.ndarray) -> None:
        """Enqueue the first decode step's inputs: `tokens` [B] into input_ids, `position` into
        cache_position, and the control words (step 0, the stop tokens, the rows already done)."""
        if len(stops) > self.max_stops:
            raise RunError(f"{len(stops)} stop tokens; the greedy feed holds {self.max_stops}")
        ctl = self._start
        ctl[:] = 0
        ctl[1], ctl[3] = position, len(stops)
        ctl[self._done:self._done + self.batch] = done
        ctl[self._last:self._last + self.batch] = tokens
        ctl[self._stop_ids:self._stop_ids + len(stops)] = stops
        self._start_ids[:] = tokens
        self._start_position[0] = position
        cuda, stream = self._cuda, self._stream
        cuda.memcpy_htod_async(int(self._control), ctl, stream)
        cuda.memcpy_htod_async(self._ids, self._start_ids, stream)
        cuda.memcpy_htod_async(self._position, self._start_position, stream)

    def launch(self, steps: int) -> None:
        """Enqueue `steps` decode steps, each [plan, argmax, advance]; no sync."""
        if not self._graphs:
            self._enqueue_steps(steps)
            return
        whole, rest = divmod(steps, self.graph_steps)
        for n, count in ((self.graph_steps, whole), (1, rest)):
            for _ in range(count):
                self._graphs[n].launch(self._stream)
        self.step.wrote_arena()

    def read_back(self, slot: int) -> None:
        """Enqueue copies of the log and the control words into page-locked slot `slot`."""
        cuda, stream = self._cuda, self._stream
        cuda.memcpy_dtoh_async(self._host_log[slot], int(self._log), stream)
        cuda.memcpy_dtoh_async(self._host_control[slot], int(self._control), stream)
        self._events[slot].record(stream)

    def collect(self, slot: int, first: int, count: int) -> tuple[np.ndarray, int]:
        """Wait for read-back `slot`; the tokens of steps first..first+count-1 ([count, B]) and
        the first step whose logits held a NaN (-1: none so far)."""
        try:
            self._events[slot].synchronize()
        except self._cuda.Error as err:
            self.step.device.lost = True
            raise RunError(f"a kernel failed while generating ({_one_line(err)}); the GPU context is unusable "
                           f"now; rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel") from None
        rows = (first + np.arange(count)) % self.log_rows
        return self._host_log[slot][rows].copy(), int(self._host_control[slot][2]) - 1

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for graph in self._graphs.values():
            try:
                graph.close()
            except RunError:
                pass   # a lost context frees the graph when it goes
        self._graphs = {}
        self._dependent = None
        for allocation in (self._log, self._control):
            if allocation is not None:
                try:
                    allocation.free()
                except self._cuda.Error:
                    pass
        self._log = self._control = None
        # the functions, then the module: unloaded now, while the context is alive (as Executor.close does)
        self._argmax = self._advance = self._module = None

    def _argmax_pointers(self) -> tuple[int, ...]:
        """The argmax's arguments, in the order the greedy record's `args` names them."""
        pointers = {"logits": self._logits, "log": int(self._log), "control": int(self._control), "ids": self._ids,
                    "position": self._position}
        return tuple(pointers[name] for name in self._argmax_args)

    def _enqueue_steps(self, steps: int) -> None:
        for _ in range(steps):
            self._enqueue_step()

    def _enqueue_step(self) -> None:
        self.step.launch(graph=False)
        record, stream = self.record, self._stream
        if self._dependent is not None:
            for launch in self._dependent:
                launch(stream.handle)
            return
        try:
            self._argmax.prepared_async_call(tuple(record["argmax"]["grid"]), tuple(record["argmax"]["block"]),
                                             stream, *self._argmax_pointers())
            if self._advance is not None:
                self._advance.prepared_async_call(tuple(record["advance"]["grid"]), tuple(record["advance"]["block"]),
                                                  stream, self._ids, self._position, int(self._control))
        except self._cuda.Error as err:
            raise RunError(f"the greedy feed kernels failed to launch ({_one_line(err)}); recompile the model "
                           f"with `aicfc compile` for this GPU") from None


def _interface_pointers(step: Any) -> dict[int, int]:
    """{buffer id: device address} of the decode plan's inputs and outputs (its executor's own
    transfers, so the addresses are the ones its kernels use)."""
    bundle = step.bundle
    items = list(bundle.inputs) + list(bundle.outputs)
    transfers = list(step._inputs) + list(step._outputs)
    return {item["buffer"]: transfer.pointer for item, transfer in zip(items, transfers)}


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
