"""A bundle of several plans on a GPU: one Executor per plan over shared device memory.

[Note: plans] in aicf_run/plans.py says what the compiler wrote. Here the weights region is
allocated once and each weight goes up once (a blob every plan reads is uploaded by the first);
the arena is one allocation of the largest plan's `arena_bytes`, which every plan uses from its
start, since the plans run one at a time on one shared stream. A plan's outputs returned as
device arrays are therefore valid until the next run of any plan. Plans that declare the same
state tensors at the same offsets ([Note: state] in aicf_run/executor.py: a KV cache) share one
state region, so a prefill plan's run leaves the cache the decode plan's next run reads
(`shares_state`); otherwise each plan keeps its own. `run` picks the plan whose
input shapes equal the inputs' (`select_plan`): a lookup, never a choice; `plan=` names one.

[Note: one arena, several plans]
`bench`, `profile` and a timeline replay a plan on what its arena holds, which for one plan alone is its last
run's inputs. Here the arena is shared: after a prefill plan's run it holds the prefill's data, and a decode
plan timed then reads that as its inputs (session 54: a garbage position sent the decode step's cos/sin
tables down a slow path, 2.5 us a kernel where its own inputs take 0.74). So the shared memory records which
plan's launch last wrote the arena (`Shared.arena_plan`: every launch, a run's included, and the greedy feed's
graphs, which replay the decode plan), and timing another plan there is a one-line RunError that says to run
that plan on its own inputs first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aicf_run import bench as _bench
from aicf_run import profile as _profile
from aicf_run.bundle import Bundle
from aicf_run.device import Device
from aicf_run.errors import RunError
from aicf_run.executor import Executor, Shared
from aicf_run.plans import PlanInfo, input_shapes, plan_index, plan_infos, select_plan


class PlanSet:
    """Every plan of `bundle` loaded on `device`, each captured as its own CUDA graph when
    `graph`; the same calls as Executor, with `plan=` (an index or a name of `plans`) where
    no inputs say which plan is meant."""

    def __init__(self, bundle: Bundle, device: Device, graph: bool = True) -> None:
        self.bundle = bundle
        self.device = device
        self._cuda = device.driver
        self._closed = False
        self._executors: list[Executor] = []
        self._arena = self._weights = self._state = None
        arena_bytes = max(plan.memory["arena_bytes"] for plan in bundle.plans)
        self._arena = self._allocate(arena_bytes, "arena (the largest plan's)")
        # Registered before the plans' executors: close callbacks run last-in first-out, so
        # the executors (their graphs point into this memory) go first.
        device.on_close(self.close)
        try:
            self._weights = self._allocate(bundle.memory["weights_bytes"], "weights")
            if self.shares_state:
                nbytes = bundle.plans[0].memory["state_bytes"]
                self._state = self._allocate(nbytes, "state (shared by every plan)")
                self._cuda.memset_d8(int(self._state), 0, nbytes)
            shared = Shared(self._arena, self._weights, self._cuda.Stream(), state=self._state)
            for plan in bundle.plans:
                self._executors.append(Executor(plan, device, graph=graph, shared=shared))
        except BaseException:
            self.close()
            raise

    @property
    def shares_state(self) -> bool:
        """Whether every plan declares state, the same tensors at the same offsets: then they
        share one state region (a prefill plan fills the cache the decode plan reads)."""
        return same_state([plan for plan in self.bundle.plans])

    @property
    def plans(self) -> tuple[PlanInfo, ...]:
        """Every plan's index, name and input shapes, in the bundle's order."""
        return plan_infos([plan.inputs for plan in self.bundle.plans])

    @property
    def stream(self) -> Any:
        """The one PyCUDA Stream every plan's copies and launches go to."""
        return self._executors[0].stream

    @property
    def uses_graph(self) -> bool:
        return self._executors[0].uses_graph

    def plan(self, plan: int | str) -> Executor:
        """The Executor of one plan (an index or a name of `plans`)."""
        self._check_open()
        return self._executors[plan_index([p.inputs for p in self.bundle.plans], plan)]

    def select(self, inputs: Mapping[str, Any]) -> PlanInfo:
        """The plan whose input shapes equal `inputs`' ({name: array or tensor}); NoPlanError,
        one line naming the shapes given and the plans there are, when none does."""
        state = self.bundle.state_names                       # [Note: state]: not part of the shapes
        given = {name: value for name, value in inputs.items() if name not in state}
        return self.plans[select_plan([p.inputs for p in self.bundle.plans], input_shapes(given))]

    def run(self, inputs: Mapping[str, Any], *, plan: int | str | None = None, **options: Any) -> dict[str, Any]:
        """Run the plan for `inputs`' shapes (or `plan`); the options are Executor.run's."""
        self._check_open()
        if plan is None:
            index = self.select(inputs).index
        else:
            index = plan_index([p.inputs for p in self.bundle.plans], plan)
        return self._executors[index].run(inputs, **options)

    def launch(self, graph: bool | None = None, plan: int | str = 0) -> None:
        """Enqueue one plan's launch plan on the inputs already in the arena (Executor.launch)."""
        self.plan(plan).launch(graph)

    @property
    def state(self) -> dict:
        """A host copy of the state tensors (Executor.state) of the first plan: the one set
        every plan shares when `shares_state`; `plan(i).state` reads another plan's own."""
        return self.plan(0).state

    def set_state(self, values: Mapping[str, Any], plan: int | str = 0) -> None:
        """Write state tensors (Executor.set_state): every plan's when shared, else `plan`'s."""
        self.plan(plan).set_state(values)

    def reset_state(self) -> None:
        """Zero every plan's state tensors (the shared region once), e.g. before a new sequence."""
        self._check_open()
        done = False
        for executor in self._executors:
            if executor.has_state and not (done and self.shares_state):
                executor.reset_state()
                done = True

    def generate(self, prompt: Any, max_new_tokens: int, **options: Any) -> Any:
        """Generate tokens after `prompt` (aicf_run.generate.generate: prefill plans, then the
        decode plan, over the KV cache every plan shares)."""
        from aicf_run.generate import generate
        return generate(self, prompt, max_new_tokens, **options)

    def synchronize(self) -> None:
        self._check_open()
        self._executors[0].synchronize()

    def bench(self, replays: int, graph: bool | None = None, plan: int | str = 0) -> _bench.BenchReport:
        """Time one plan (Executor.bench)."""
        return self.plan(plan).bench(replays, graph)

    def profile(self, plan: int | str = 0) -> _profile.ProfileReport:
        """Time every kernel of one plan (Executor.profile)."""
        return self.plan(plan).profile()

    def poison(self) -> None:
        """Fill the shared arena with NaN bytes (Executor.poison), all of it."""
        self._check_open()
        self._cuda.memset_d8(int(self._arena), 0xFF, max(p.memory["arena_bytes"] for p in self.bundle.plans))
        self.device.context.synchronize()

    def close(self) -> None:
        """Close every plan's executor, then free the memory they share."""
        if self._closed:
            return
        self._closed = True
        for executor in self._executors:
            executor.close()
        self._executors = []
        for allocation in (self._arena, self._weights, self._state):
            if allocation is not None:
                allocation.free()

    def _check_open(self) -> None:
        if self._closed:
            raise RunError("this executor is closed; load the bundle again")

    def _allocate(self, nbytes: int, region: str) -> Any:
        try:
            return self._cuda.mem_alloc(max(nbytes, 1))
        except (self._cuda.Error, MemoryError, OverflowError) as err:
            raise RunError(f"cannot allocate {nbytes} bytes of GPU memory for the {region} "
                           f"({' '.join(str(err).split())[:300]}); free GPU memory or use a larger "
                           f"GPU") from None


def state_layout(plan: Bundle) -> tuple:
    """A plan's state tensors as (name, output, dtype, shape, offset in the state region)."""
    buffers = plan.buffers
    return tuple((item["name"], item["output"], item["dtype"], tuple(item["shape"]), buffers[item["buffer"]]["offset"])
                 for item in plan.payload.get("state", []))


def same_state(plans: list[Bundle]) -> bool:
    """Whether every plan has state and all lay it out alike (`state_layout`, `state_bytes`)."""
    first = state_layout(plans[0])
    return bool(first) and all(state_layout(p) == first and p.memory["state_bytes"] == plans[0].memory["state_bytes"]
                               for p in plans)
