"""`aicfc tune`: measure the cost model's candidates on a GPU, and calibrate the profile.

For every kernel of a model the planner ranks the whole space, as compile does
(`plan_schedules.rank`), and `select` keeps the model's top candidates plus a spread through
the rest of the ranking, so that the rank correlation sees fast and slow schedules alike.
Each kernel's candidates are rendered into one CUDA module, candidate of rank r as kernel
`{kernel}_c{r}`; the modules are built with nvcc in parallel (nvcc caches by content), then
every candidate is timed on the GPU with CUDA events on random arguments
(`aicf_run.timing`; a candidate that loads with the TMA gets its tensor maps encoded over
those arguments). The report sets predicted against measured: how far the model's pick is
from the fastest measured candidate, and Spearman's rank correlation per kernel and pooled.
`fit_profile` (`planner/fit.py`) fits the profile's coefficients to the measurements; the
fitted profile is what `aicfc compile --profile FILE` reads. Compile never needs a GPU:
tuning only refines the model.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from aicf_run.convert import to_device
from aicf_run.timing import SPIN_SOURCE
from aicfc.codegen import FAMILIES
from aicfc.codegen.common import kernel_args
from aicfc.codegen.scratch import scratch
from aicfc.codegen.tma import maps_symbol, records
from aicfc.codegen.module import count_registers, module_header, resolve_jobs
from aicfc.codegen.nvcc import Built, build, nvcc_version
from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import TensorType
from aicfc.passes import join_concat, join_reduce
from aicfc.passes.plan_schedules import Ranked, RegisterCheck, check_leaders, rank
from aicfc.planner.cost import estimate_registers
from aicfc.planner.fit import WITHIN, fit_profile, spearman
from aicfc.planner.hardware import Profile

__all__ = ["select", "candidates", "tune_model", "fit_profile", "spearman", "TuneReport", "KernelTune", "Measured"]

# on_progress(steps done, steps in all, what was just done): one step per module built and
# one per candidate measured.
OnProgress = Callable[[int, int, str], None]


def select(ranked: Sequence[Any], top: int = 8, spread: int = 8) -> list[int]:
    """Indices into `ranked` (cheapest first) to measure, in rank order: the first `top`, and
    `spread` more evenly spaced through the rest, the last (the slowest predicted) included."""
    n = len(ranked)
    head = min(max(top, 0), n)
    rest = n - head
    chosen = set(range(head))
    if spread > 0 and rest > 0:
        spread = min(spread, rest)
        # The end of each of `spread` equal segments of the rest: spaced by rest/spread >= 1.
        chosen.update(head + ((i + 1) * rest + spread - 1) // spread - 1 for i in range(spread))
    return sorted(chosen)


@dataclass
class Measured:
    """One candidate of one kernel: what the planner predicted and what the GPU measured."""

    rank: int                       # in the planner's ranking of the whole space (0: its pick)
    params: dict[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_smem: int                   # dynamic shared memory at launch
    smem: int                       # static + dynamic, as cost() takes it
    regs_planned: int               # the registers cost() was given: ptxas's for a checked leader, else the estimate
    predicted_us: float
    measured_us: float | None = None
    registers: int | None = None    # ptxas's count, when it reported one
    failed: str = ""                # why it could not be measured

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "params": self.params, "grid": list(self.grid), "block": list(self.block),
                "dyn_smem_bytes": self.dyn_smem, "smem_bytes": self.smem, "registers_planned": self.regs_planned,
                "registers": self.registers, "predicted_us": self.predicted_us, "measured_us": self.measured_us,
                "failed": self.failed or None}


@dataclass
class KernelTune:
    name: str
    family: str
    feasible: int                   # candidates in the ranking (the space less the rejected)
    candidates: list[Measured]
    kernel: Kernel = field(repr=False, compare=False)

    @property
    def measured(self) -> list[Measured]:
        return [c for c in self.candidates if c.measured_us is not None]

    @property
    def pick(self) -> Measured | None:
        """The model's pick (rank 0), if it was measured."""
        return next((c for c in self.measured if c.rank == 0), None)

    @property
    def fastest(self) -> Measured | None:
        return min(self.measured, key=lambda c: c.measured_us, default=None)

    @property
    def pick_ratio(self) -> float | None:
        """Measured time of the model's pick over the fastest measured candidate's (>= 1)."""
        pick, fastest = self.pick, self.fastest
        return pick.measured_us / fastest.measured_us if pick and fastest else None

    @property
    def spearman(self) -> float:
        m = self.measured
        return spearman([c.predicted_us for c in m], [c.measured_us for c in m])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "feasible": self.feasible,
                "pick_ratio": self.pick_ratio, "spearman": _finite(self.spearman),
                "candidates": [c.to_json() for c in self.candidates]}


@dataclass
class TuneReport:
    model: str
    target: str
    precision: str
    gpu: str
    profile: dict[str, Any]         # the profile the predictions were made under
    kernels: list[KernelTune]
    types: dict[str, TensorType] = field(repr=False, compare=False)

    @property
    def spearman(self) -> float:
        """Spearman's rank correlation of predicted and measured over all measured candidates."""
        m = [c for kt in self.kernels for c in kt.measured]
        return spearman([c.predicted_us for c in m], [c.measured_us for c in m])

    @property
    def mean_spearman(self) -> float:
        values = [kt.spearman for kt in self.kernels if not math.isnan(kt.spearman)]
        return float(np.mean(values)) if values else math.nan

    def picks_within(self, tol: float = WITHIN) -> tuple[int, int]:
        """(kernels whose pick measured within `tol` of the fastest, kernels with a measured pick)."""
        ratios = [kt.pick_ratio for kt in self.kernels if kt.pick_ratio is not None]
        return sum(r <= 1 + tol for r in ratios), len(ratios)

    def to_json(self) -> dict[str, Any]:
        good, total = self.picks_within()
        return {"model": self.model, "target": self.target, "precision": self.precision, "gpu": self.gpu,
                "measured": sum(len(kt.measured) for kt in self.kernels),
                "spearman": _finite(self.spearman), "mean_spearman": _finite(self.mean_spearman),
                "picks_within_10pct": [good, total], "kernels": [kt.to_json() for kt in self.kernels]}


def chosen_kernels(plan: Plan, only: Sequence[str] | None) -> list[Kernel]:
    """The kernels of `plan` that `only` names, each by its name (k13) or an ONNX node it covers
    (as `aicfc explain` lists them); every kernel when `only` is empty or None. A name that
    matches nothing is an error naming the kernels there are, before any build or measurement."""
    if not only:
        return list(plan.kernels)
    wanted = set(only)
    kernels = [k for k in plan.kernels if k.name in wanted or wanted & set(k.origins)]
    found = {k.name for k in kernels} | {n for k in kernels for n in k.origins}
    missing = sorted(wanted - found)
    if missing:
        names = [k.name for k in plan.kernels]
        raise AicfError(f"--kernel {', '.join(missing)}: no kernel of this plan has that name or covers that ONNX node; "
                        f"its kernels are {names[0]} .. {names[-1]} (`aicfc explain` of a bundle compiled with the "
                        f"same options lists each one's nodes)")
    return kernels


def candidates(plan: Plan, hw: Profile, top: int = 8, spread: int = 8,
               check: RegisterCheck | None = None, only: Sequence[str] | None = None) -> list[KernelTune]:
    """Every kernel of `plan` (or those `only` names: `chosen_kernels`) with its selected
    candidates (nothing measured yet), ranked as compile ranks them (`check`: with ptxas's
    registers for the leaders)."""
    # a joined GEMM ([Note: a reduce joined into the epilogue]): the host's candidates that hold it, as join_reduce ranks them
    problems = [(k, join_reduce.joined_candidates(k, plan, hw), []) if k.joined else (k, *rank(k, plan, hw))
                for k in chosen_kernels(plan, only)]
    if check:
        again = iter(check_leaders(plan, hw, [p for p in problems if p[1]], check))
        problems = [(k, next(again) if ranked else ranked, rejected) for k, ranked, rejected in problems]
    out = []
    for k, ranked, _ in problems:
        if k.inlined:   # a joined concatenation: only the candidates that still read it by k-blocks render
            ranked = [r for r in ranked if join_concat.keeps(k, r.params, plan)]
        chosen = [_measured(k, i, ranked[i]) for i in select(ranked, top, spread)]
        out.append(KernelTune(k.name, k.family, len(ranked), chosen, k))
    return out


def _measured(k: Kernel, i: int, r: Ranked) -> Measured:
    smem = FAMILIES[k.family].static_smem(k, r.params) + r.dyn_smem
    planned = r.registers or estimate_registers(k, r.params)
    return Measured(i, dict(r.params), r.grid, r.block, r.dyn_smem, smem, planned, r.time_us, registers=r.registers)


def symbol(kt: KernelTune, c: Measured) -> str:
    return f"{kt.name}_c{c.rank}"


def source(plan: Plan, kt: KernelTune) -> str:
    """One CUDA module holding every candidate of one kernel, and the timer's spin kernel."""
    types = plan.types()
    family = FAMILIES[kt.family]
    # maps in constant memory, as the compiled plan has them ([Note: TMA maps in constant memory])
    kernels = [family.render_kernel(kt.kernel, dict(c.params, MAPS=maps_symbol(symbol(kt, c))), types, symbol(kt, c))
               for c in kt.candidates]
    return "\n".join([module_header(plan, len(kt.candidates)), SPIN_SOURCE, *kernels])


RANDOM_INT_BOUND = 1 << 20   # integers drawn from [0, this): ids and positions past any extent


def random_argument(t: TensorType, rng: np.random.Generator, zeroed: bool = False) -> np.ndarray:
    """Host bytes for a device buffer of type `t`: standard normal floats; integers drawn from
    [0, RANDOM_INT_BOUND); false booleans; zeros where the buffer must start zeroed (a split's
    tickets, codegen/scratch.py).

    Integers are ids and positions: a gather clamps an id into its table ([Note: Indirect
    index]), so random ids read scattered rows as a model's do, where zero ids would all read
    one; a decode attention bounds its keys by the position + 1 ([Note: live keys]), so a large
    one times the full cache the cost model assumes, where zero left one key live (session 12's
    tune of a decode step measured its split attention over a single key)."""
    if zeroed:
        return np.zeros(t.nbytes, np.uint8)
    if t.dtype == "bf16":
        return to_device(rng.standard_normal(t.numel, dtype=np.float32), "bfloat16")
    if t.dtype in ("f32", "f16"):
        return rng.standard_normal(t.numel, dtype=np.float32).astype(t.np_dtype, copy=False)
    if t.dtype == "f64":
        return rng.standard_normal(t.numel)
    if t.dtype in ("i32", "i64"):
        return rng.integers(0, RANDOM_INT_BOUND, t.numel, dtype=t.np_dtype)
    return np.zeros(t.nbytes, np.uint8)


def tune_model(model: Any, target: str | None = None, precision: str = "fp32",
               shapes: dict[str, tuple[int, ...]] | list[str] | None = None, top: int = 8, spread: int = 8,
               profile_path: str | Path | None = None, device: Any = None,
               on_progress: OnProgress | None = None, check_registers: bool = True,
               kernels: Sequence[str] | None = None) -> TuneReport:
    """Measure the selected candidates of every kernel of `model` (or of those `kernels` names:
    `chosen_kernels`) on `device` (None: open GPU 0 and close it after). `target` None means the
    GPU's own architecture."""
    from aicf_run.device import check_arch, open_device
    from aicf_run.errors import RunError
    from aicfc.driver import load
    from aicfc.frontend.onnx_import import import_model, parse_shape_overrides
    from aicfc.passes.apply_precision import check_precision
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile

    check_precision(precision)
    if top < 1 or spread < 0:
        raise AicfError(f"--top {top} --spread {spread}: expected --top >= 1 and --spread >= 0")
    if isinstance(shapes, (list, tuple)):
        shapes = parse_shape_overrides(shapes)
    proto, name, _ = load(model)
    graph = import_model(proto, shapes, name=name)
    own = device is None
    if own:
        device = open_device()
    try:
        target = target or device.arch
        try:
            check_arch(target, device.arch)
        except RunError:
            raise AicfError(f"--target {target}: cubins for it cannot run on this {device.arch} GPU; "
                            f"leave --target out to tune for the GPU's own architecture") from None
        profile = load_profile(target, profile_path)
        # the plan's own schedules go unused here: `candidates` ranks (and checks) every kernel
        plan = run_pipeline(graph, Options(target, profile, precision)).plan
        tuned = candidates(plan, profile, top, spread, count_registers if check_registers else None, kernels)
        total = len(tuned) + sum(len(kt.candidates) for kt in tuned)
        done = 0

        def step(label: str) -> None:
            nonlocal done
            done += 1
            if on_progress:
                on_progress(done, total, label)

        if on_progress:
            on_progress(0, total, "nvcc")
        builds = _build_all(plan, tuned, step)
        rng = np.random.default_rng(0)
        types = plan.types()
        for kt, built in zip(tuned, builds):
            _measure(device, kt, built, lambda c: _argument_types(kt.kernel, c.params, types), rng, step,
                     lambda c: _tensor_map_records(kt.kernel, c.params, types))
        return TuneReport(plan.name, target, precision, device.name, profile.data, tuned, types)
    finally:
        if own:
            device.close()


def _build_all(plan: Plan, kernels: list[KernelTune], step: Callable[[str], None]) -> list[Built]:
    """One module per kernel, nvcc runs in parallel; in kernel order."""
    sources = [source(plan, kt) for kt in kernels]
    builds: list[Built | None] = [None] * len(kernels)
    if not kernels:
        return []
    nvcc_version()  # once here rather than racing in every thread; also finds nvcc or fails
    with ThreadPoolExecutor(max_workers=min(resolve_jobs(None), len(kernels)), thread_name_prefix="aicf-nvcc") as pool:
        futures = {pool.submit(build, s, plan.target): i for i, s in enumerate(sources)}
        try:
            for future in as_completed(futures):
                i = futures[future]
                builds[i] = future.result()
                step(f"nvcc {kernels[i].name} ({len(kernels[i].candidates)} candidates)")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [b for b in builds if b is not None]


def _argument_types(k: Kernel, params: dict[str, Any],
                    types: dict[str, TensorType]) -> tuple[tuple[TensorType, bool], ...]:
    """The types of one candidate's arguments, in order, each with whether it must start zeroed:
    its schedule may add scratch buffers (split-k partials and zeroed tickets, `codegen/scratch.py`)."""
    extra = {s.name: s for s in scratch(k, params)}
    return tuple((extra[b].type, extra[b].zeroed) if b in extra else (types[b], False) for b in kernel_args(k, params))


def _tensor_map_records(k: Kernel, params: dict[str, Any],
                        types: dict[str, TensorType]) -> list[dict[str, Any]]:
    """One candidate's TMA tensor maps ([Note: TMA record]) with each buffer named by its
    position in the candidate's arguments: the bench encodes them against the device buffers it
    allocated for those arguments (`aicf_run.timing.KernelBench.time_us`)."""
    position = {b: i for i, b in enumerate(kernel_args(k, params))}
    return records(k, params, types, position, "arguments of the kernel")


def _measure(device: Any, kt: KernelTune, built: Built,
             argument_types: Callable[[Measured], tuple[tuple[TensorType, bool], ...]], rng: np.random.Generator,
             step: Callable[[str], None],
             map_records: Callable[[Measured], list[dict[str, Any]]] = lambda c: []) -> None:
    from aicf_run.timing import KernelBench, LaunchRefused

    # Scratch sizes differ between schedules: one set of buffers per list of argument types,
    # filled once (random normal data for 65536 x 4096 takes seconds to draw).
    groups: dict[tuple[tuple[TensorType, bool], ...], list[Measured]] = {}
    for c in kt.candidates:
        groups.setdefault(argument_types(c), []).append(c)
    for arg_types, members in groups.items():
        arrays = [random_argument(t, rng, zeroed) for t, zeroed in arg_types]
        with KernelBench(device, built.cubin, arrays) as bench:
            for c in members:
                name = symbol(kt, c)
                c.registers = built.registers.get(name)
                try:
                    maps = map_records(c)
                    t = bench.time_us(name, c.grid, c.block, c.dyn_smem, maps, maps_symbol(name) if maps else None)
                except LaunchRefused as e:
                    c.failed = str(e)
                else:
                    if math.isfinite(t) and t > 0:
                        c.measured_us = t
                    else:
                        c.failed = f"timing {t} us is not a positive number"
                if c.registers is None:
                    c.registers = bench.registers(name)
                step(f"{kt.name} rank {c.rank}")


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value
