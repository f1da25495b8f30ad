"""plan_schedules: Decision IR → Decision IR with a schedule on every kernel.

For each kernel: enumerate its family's parameter space (declared beside the template, and
shaped by the precision policy: tensor-core candidates exist only where it allows them),
drop candidates that break a hardware constraint of the target profile (threads per block,
static and dynamic shared memory per block, estimated registers per thread, at least one
resident block per SM), rank the rest by the analytic cost model (`planner/cost.py`) and take the cheapest.
Registers are an estimate until ptxas has seen the kernel: where the pipeline is given a
`RegisterCheck` (compile and tune give one), the leading candidates (at most CHECK_MAX, within
CHECK_MARGIN of the best) are rendered and built, and ranked again with ptxas's counts; one
that spills to local memory is rejected as breaking the register limit.
The decision keeps the runners-up with their predicted times and the rejected with the
constraint they broke. Kernels that differ only in the names of their tensors (the layers of
a transformer) are the same problem: it is solved once (`structure`).

    kernel k0 gemm { ... }
  becomes
    kernel k0 gemm { ...
      schedule {BK=16, BM=32, BN=32, TM=2, TN=2} grid=[4,1,1] block=[256,1,1] smem=0 registers=unknown
      predicted {time_us=3.1, ...}
      candidate {...} time_us=3.3
      candidate {...} rejected "shared memory 66560 B > 49152 B per block" }
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from aicfc.codegen import FAMILIES
from aicfc.errors import AicfError
from aicfc.ir.decision import Candidate, Kernel, Plan, Schedule
from aicfc.ir.lowered import Indirect, Load, Rewrite, map_loads
from aicfc.ir.types import TensorType
from aicfc.planner.cost import Estimate, cost, estimate_registers
from aicfc.planner.hardware import Profile, blocks_per_sm

MAX_GRID = (2**31 - 1, 65535, 65535)   # blocks per launch along x, y, z (every sm_30+ GPU)
KEEP_RUNNERS_UP = 6
KEEP_REJECTED = 6
CHECK_MAX = 6        # leading candidates whose registers ptxas counts
CHECK_MARGIN = 0.15  # ... among those predicted within this fraction of the best
SPILL_ROUNDS = 2     # where all of them spill: rounds of CHECK_MAX more candidates, in rank

# [(kernel, candidates' params)] -> [(registers, spill store bytes) per candidate], from ptxas
RegisterCheck = Callable[[Plan, Sequence[tuple[Kernel, Sequence[dict[str, Any]]]]], list[list[tuple[int, int]]]]


def _params(p: dict) -> tuple:
    return tuple(sorted(p.items()))


@dataclass(frozen=True)
class Ranked:
    """One feasible candidate with its launch shape and predicted cost."""

    params: dict[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_smem: int
    estimate: Estimate
    registers: int | None = None   # ptxas's count, where the candidate was checked

    @property
    def time_us(self) -> float:
        return self.estimate.time_us


def recost(k: Kernel, params: dict[str, Any], grid: tuple[int, int, int], block: tuple[int, int, int],
           dyn_smem: int, regs: int, types: Mapping[str, TensorType], hw: Profile) -> Estimate:
    """The cost of `k` on a candidate whose launch is known, with `regs` registers a thread."""
    smem = FAMILIES[k.family].static_smem(k, params) + dyn_smem
    return cost(k, params, grid, block, smem, regs, types, hw)


def with_params(k: Kernel, changes: dict[str, Any], types: Mapping[str, TensorType], hw: Profile,
                costed: Kernel | None = None, registers: int | None = None) -> Kernel:
    """`k` with its schedule's parameters updated by `changes` (a later pass's decision: a read
    before the dependent-launch wait) and its prediction re-costed on the same launch, at ptxas's
    register count where the leaders were checked (`registers`: where the caller checked the new
    parameters themselves); `costed`: the kernel to cost in its place."""
    s, a = k.schedule, costed or k
    p = dict(s.param) | changes
    checked = registers or dict(s.predicted).get("registers_ptxas")
    est = recost(a, p, s.grid, s.block, s.smem_bytes, int(checked or estimate_registers(a, p)), types, hw)
    if checked:
        est.terms["registers_ptxas"] = checked
    return k.replace(schedule=dataclasses.replace(s, params=tuple(sorted(p.items())), predicted=est.as_items()))


# Schedule keys whose candidates only a --pin of that key makes eligible (the space keeps them, so explain
# shows them with this reason): measured, correct, and slower than the default everywhere they were timed.
OPT_IN = {"STREAM": "stream-k runs only under --pin STREAM=1: on an H100 it measured 1.2-1.7x slower than "
                    "data-parallel tiles on every shape timed (benchmarks/results/stream_k_session76_h100.txt)",
          "TILE": "window tiles run only under --pin NODE:TILE=1: on an H200 they measured 1.0-2.6x slower than the "
                  "direct window's runs on every depthwise convolution timed, MobileNetV2 and EfficientNet-B0 at B32 "
                  "(benchmarks/results/window_stem_session34_h200.txt)",
          "BAND": "unit band runs only under --pin NODE:BAND=1: on an H200 it measured 1.04-1.7x slower than the wgmma "
                  "and taps units on every stride-1 3x3 convolution of ResNet-50 B32 (benchmarks/results/"
                  "conv_band_session39_h200.txt)"}


# [Note: rankings remembered]
# channels_last and unfold_taps rank kernels to decide layouts, plan_schedules ranks the kernels they leave,
# and decide_projections (passes/pipeline.py) plans a graph's front stages two or three times: mostly the same
# kernels, ranked again. `rank` keeps its last RANKED_KEEP answers, keyed by what it reads: the kernel (less
# its name, schedule, memory plan and records), the types of every tensor it touches and which of them are
# weights, the target, the precision, the profile and the keys pinned. ResNet-50 B32 (fp16, sm_90) planned in
# 20.5 s of CPU with its projections decided, against 50.6 s ranking every time, the same schedules. A ranking
# holds every candidate (about 1.6 thousand a kernel there, 190 MB for its 96 kernels), so run_pipeline forgets
# them when it is done, and at most RANKED_KEEP are kept meanwhile.
# Since session 51 run_pipeline keeps the RANKED_BETWEEN latest instead of none: a process that plans the same
# model again (a bundle's plans share most kernels; an A/B of pins; the test suite, which compiles one decoder
# dozens of times) ranks each kernel once. The key then also holds what a ranking reads outside its arguments,
# the environment's switches of the gemv terms and space (RANK_ENV). And the kernel's tensors are named by their
# order of appearance, its ops' ONNX origins and its prefetch reasons dropped: a ranking reads a tensor only
# through its type and whether it is a weight (both in the key), so the layers of a model, equal but for their
# names, are ranked once. Checked by recomputing every remembered answer (session 51): 73 hits over two decoders,
# Llama, GPT-2, MobileNetV3, Swin, T5 and a UNet, every one the same candidates, times and rejections.
RANKED_KEEP = 256
RANKED_BETWEEN = 64
RANK_ENV = ("AICF_GEMV_CONSTANTS", "AICF_GEMV_MINB")
_ranked: OrderedDict[Hashable, tuple[tuple[Ranked, ...], tuple[Candidate, ...]]] = OrderedDict()
_profiles: dict[int, tuple[Profile, str]] = {}   # id -> (the profile, its data as text): passes load their own copies


def forget_rankings(keep: int = 0) -> None:
    """Drop the remembered rankings but the `keep` latest ([Note: rankings remembered]): run_pipeline
    keeps RANKED_BETWEEN at its end."""
    while len(_ranked) > keep:
        _ranked.popitem(last=False)
    if not keep or len(_profiles) > RANKED_BETWEEN:   # each run loads its own profile: its text is in the keys
        _profiles.clear()


def _profile_key(hw: Profile) -> str:
    known = _profiles.get(id(hw))
    if known is None or known[0] is not hw:
        known = _profiles[id(hw)] = (hw, json.dumps(hw.data, sort_keys=True, default=str))
    return known[1]


def _rank_key(k: Kernel, plan: Plan, hw: Profile, pinned: frozenset[str]) -> Hashable:
    """What a ranking depends on: the kernel with every tensor named by its order of appearance (the
    indices read through included) and without its ONNX origins, each tensor's type and whether it is a
    weight; the target, precision, profile, keys pinned and the environment's switches (RANK_ENV). So
    the layers of a model, equal but for their tensors' names, are ranked once ([Note: rankings remembered])."""
    types = plan.types()
    weights = {w.name for w in plan.weights}
    names: dict[str, str] = {}

    def canon(name: str) -> str:
        return names.setdefault(name, f"t{len(names)}")

    def load(ld: Load) -> Load:
        index = tuple(Indirect(load(a.ids)) if isinstance(a, Indirect) else a for a in ld.index)
        return dataclasses.replace(ld, buffer=canon(ld.buffer), index=index)
    ops = tuple(dataclasses.replace(op, out=canon(op.out), body=map_loads(op.body, load), origin=()) for op in k.ops)
    stores = tuple(canon(s) for s in k.stores)
    prefetch = tuple(dataclasses.replace(f, buffer=canon(f.buffer), reason="") for f in k.prefetch)
    kernel = dataclasses.replace(k, name="", ops=ops, stores=stores, prefetch=prefetch, schedule=None, inplace=(),
                                 rewrites=())
    tensors = tuple((c, types.get(n), n in weights) for n, c in names.items())
    return (kernel, tensors, plan.target, plan.precision, _profile_key(hw), pinned,
            tuple(os.environ.get(v) for v in RANK_ENV))


def rank(k: Kernel, plan: Plan, hw: Profile, pinned: frozenset[str] = frozenset()) -> tuple[list[Ranked], list[Candidate]]:
    """Every candidate of `k`'s space: the feasible ones cheapest first, and the rejected (those of
    an OPT_IN key among them unless `pinned` names it). Remembered ([Note: rankings remembered])."""
    key = _rank_key(k, plan, hw, pinned)
    hit = _ranked.get(key)
    if hit is not None:
        _ranked.move_to_end(key)
        return list(hit[0]), list(hit[1])
    ranked, rejected = _rank(k, plan, hw, pinned)
    _ranked[key] = (tuple(ranked), tuple(rejected))
    while len(_ranked) > RANKED_KEEP:
        _ranked.popitem(last=False)
    return ranked, rejected


def fastest(k: Kernel, plan: Plan, hw: Profile, pin: Mapping[str, Any] | None = None) -> float:
    """The best predicted time of `k` (inf where no candidate fits): what the passes that weigh a rewrite
    by the planner's predictions compare (channels_last, unfold_taps, pipeline.decide_projections,
    relayout_weights). `pin`: as `pinned_best`."""
    return pinned_best(k, plan, hw, pin)[0]


def pinned_best(k: Kernel, plan: Plan, hw: Profile, pin: Mapping[str, Any] | None = None) -> tuple[float, bool]:
    """(the best predicted time of `k` among the candidates `pin` (`--pin` as `plan_schedules` takes it) would leave
    it, inf where none; whether its plan-wide pins bind `k`, some candidate having all of their keys), so that a
    rewrite is not chosen for a schedule the user's pins then refuse."""
    every, by_node = node_pins(pin or {})
    own = own_pins(k, by_node)
    ranked = rank(k, plan, hw, frozenset(every) | frozenset(own))[0]
    use, binds = applied_pins(ranked, every, own)
    return min((r.time_us for r in ranked if _matches(r.params, use)), default=math.inf), binds


def own_pins(k: Kernel, by_node: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The pins (`node_pins`' second part) of the ONNX nodes `k` covers."""
    return {key: value for node in k.origins for key, value in by_node.get(node, {}).items()}


def applied_pins(ranked: list[Ranked], every: Mapping[str, Any], own: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the pins that restrict a kernel whose feasible candidates are `ranked`, whether the plan-wide ones bind it):
    a node's own pins always, the plan-wide ones where some candidate has all of their keys."""
    binds = bool(every) and any(set(every) <= set(r.params) for r in ranked)
    return {**(every if binds else {}), **own}, binds


def _rank(k: Kernel, plan: Plan, hw: Profile, pinned: frozenset[str]) -> tuple[list[Ranked], list[Candidate]]:
    types = plan.types()
    family = FAMILIES[k.family]
    ranked, rejected = [], []
    for why_params, why in getattr(family, "declined", lambda k, plan: [])(k, plan):
        rejected.append(Candidate(_params(why_params), None, why))
    for p in family.space(k, plan):
        opt = next((why for key, why in OPT_IN.items() if p.get(key) and key not in pinned), None)
        if opt:
            rejected.append(Candidate(_params(p), None, opt))
            continue
        grid, block, dyn = family.launch(k, p)
        threads = block[0] * block[1] * block[2]
        static = family.static_smem(k, p)
        smem = static + dyn
        regs = estimate_registers(k, p)
        why = None
        if any(g > limit for g, limit in zip(grid, MAX_GRID)):
            why = f"grid {list(grid)} exceeds CUDA's launch limits {list(MAX_GRID)}"
        elif not 32 <= threads <= hw.max_threads_per_block:
            why = f"{threads} threads per block outside 32..{hw.max_threads_per_block}"
        elif static > hw.smem_per_block_static:
            why = f"static shared memory {static} B > {hw.smem_per_block_static} B per block"
        elif smem > hw.smem_per_block_optin:
            why = f"shared memory {smem} B > {hw.smem_per_block_optin} B per block"
        elif regs > hw.max_registers_per_thread:
            why = f"estimated {regs} registers per thread > {hw.max_registers_per_thread}"
        elif blocks_per_sm(threads, smem, regs, hw)[0] < 1:
            why = f"no block fits on an SM ({blocks_per_sm(threads, smem, regs, hw)[1]})"
        else:   # a family's own limit on the launch (the split attention's clusters)
            why = getattr(family, "launch_why_not", lambda k, p, grid, hw: None)(k, p, grid, hw)
        if why:
            rejected.append(Candidate(_params(p), None, why))
            continue
        ranked.append(Ranked(p, grid, block, dyn, cost(k, p, grid, block, smem, regs, types, hw)))
    ranked.sort(key=_order)
    return ranked, rejected


def _order(r: Ranked) -> tuple:
    """Ties on time (one bound, the same for both) go to the schedule with less exposed latency,
    then to the one whose epilogues cost less (a DRAM-bound GEMM ties on DRAM whatever its
    stores), then to the one that issues less, then to the one that moves fewer bytes through shared
    memory (its other bounds have more slack), then to the one that pulls fewer bytes from the L2 into its SMs
    (t_l2_us: a DRAM-bound GEMM's k-blocks share the SM's port with its residual and its stores; on an H100, aicfc
    tune of ResNet-50 B32, session 85, benchmarks/results/b_resident_session85_h100.txt: the stage-3 expansions'
    64x128 ping-pong tiles with B resident, [Note: B resident in shared memory] in codegen/gemm_wgmma.py, ran
    10.81-11.09 us against 11.03-11.41 with B through the ring, predicted the same), then to the deeper ring of k-blocks (STAGES: more
    loads in flight absorb the arrivals' spread, which the model does not see; on an H200 a 1B
    Llama prefill's gate/up GEMM, 128x192 tiles alone on their SMs, ran 48.6 us at 3 stages and
    44.8-47.0 at 4, predicted the same), then to more consumer warpgroups (NWG: a tile of one warpgroup's
    rows runs as fast or faster with a second warpgroup beside it that takes every other tile, ping-pong,
    though a CTA of one tile leaves it idle; on an H200, aicfc tune of ResNet-50 B32, session 29,
    benchmarks/results/tune_resnet50_b32_session29_h200.txt: its 7x7x512 3x3 convolutions' 64x128 tiles,
    100 CTAs of one tile each, ran 16.5-17.1 us against 19.9-20.0 with one warpgroup, predicted the same;
    the 1x1 GEMMs' equal pairs 0-3% apart, never slower with two; why the lone warpgroup loses the most in
    the convolution is not found), then to a fixed order."""
    t = r.estimate.terms
    return (round(r.time_us, 6), t["t_pipeline_us"], round(t.get("t_epilogue_us", 0.0), 6), round(t["t_compute_us"], 6),
            round(t["t_smem_us"], 6), round(t.get("t_l2_us", 0.0), 6), -r.params.get("STAGES", 0), -r.params.get("NWG", 0),
            _params(r.params))


def check_leaders(plan: Plan, hw: Profile, problems: Sequence[tuple[Kernel, list[Ranked], list[Candidate]]],
                  check: RegisterCheck) -> list[list[Ranked]]:
    """Each problem's ranking with its leaders re-costed from ptxas's register counts (occupancy
    follows them) and sorted again; a leader that spills is moved to the problem's rejected.
    Where every leader spills, the next CHECK_MAX candidates in rank are built too (up to
    SPILL_ROUNDS more times): the estimate can miss an epilogue's registers (a rotary map's
    loads and selects beside 128 accumulators), and the first candidate that does not spill
    beats any that does. Where every one checked spills, they stay, at their re-costed times: a
    spilling kernel still runs. One `check` call a round for all the problems, so their builds
    can run in parallel.

    A leader that spills under a launch-bounds hint (the family's `without_hint`: the K-major gemv's
    MB) is built again in the next round without it: the hint is a register ceiling given to ptxas for
    more loads in flight, not part of the schedule, and where ptxas needs more registers than it
    leaves (a bf16 gemv's conversions at 64) the schedule runs better without it than not at all."""
    types = plan.types()
    windows = [[r for r in ranked[:CHECK_MAX] if r.time_us <= ranked[0].time_us * (1 + CHECK_MARGIN)]
               for _, ranked, _ in problems]
    seen = [len(w) for w in windows]
    results: list[list[tuple[Ranked, int]]] = [[] for _ in problems]
    pending = list(range(len(problems)))
    for round_ in range(1 + SPILL_ROUNDS):
        batch = [i for i in pending if windows[i]]
        if not batch:
            break
        counts = check(plan, [(problems[i][0], [r.params for r in windows[i]]) for i in batch])
        unhinted: dict[int, list[Ranked]] = {}
        for i, found in zip(batch, counts):
            k = problems[i][0]
            relax = getattr(FAMILIES[k.family], "without_hint", lambda p: None)
            for r, (regs, spill) in zip(windows[i], found):
                again = Ranked(r.params, r.grid, r.block, r.dyn_smem,
                               recost(k, r.params, r.grid, r.block, r.dyn_smem, regs, types, hw), regs)
                again.estimate.terms["registers_ptxas"] = regs
                results[i].append((again, spill))
                if spill and (plain := relax(r.params)) is not None:
                    unhinted.setdefault(i, []).append(dataclasses.replace(r, params=plain))
        spilled_all = {i for i in batch if all(spill for _, spill in results[i])}
        pending = sorted(spilled_all | set(unhinted))
        for i in pending:
            more = problems[i][1][seen[i]:seen[i] + CHECK_MAX] if i in spilled_all else []
            windows[i] = unhinted.get(i, []) + more
            seen[i] += len(more)
    out = []
    for (k, ranked, rejected), found, n in zip(problems, results, seen):
        checked = [r for r, spill in found if not spill]
        spilled = [(r, spill) for r, spill in found if spill]
        if not checked:
            checked, spilled = [r for r, _ in spilled], []
        for r, spill in spilled:
            rejected.append(Candidate(_params(r.params), None,
                                      f"spills {spill} B to local memory at {r.registers} registers (ptxas)"))
        out.append(sorted(checked + ranked[n:], key=_order))
    return out


def structure(k: Kernel, types: Mapping[str, TensorType]) -> Hashable:
    """What `rank` depends on: the kernel with every tensor named by its order of appearance,
    with the types of those tensors. Equal for two kernels exactly when they pose the same
    scheduling problem (names and origins play no part in it)."""
    names: dict[str, str] = {}

    def canon(name: str) -> str:
        return names.setdefault(name, f"t{len(names)}")

    def load(ld: Load) -> Load:
        return dataclasses.replace(ld, buffer=canon(ld.buffer))
    ops = tuple((canon(op.out), op.type, op.combiner, op.reduce, map_loads(op.body, load), bind)
                for op, bind in zip(k.ops, k.binds))
    stores = tuple(canon(s) for s in k.stores)
    return (k.family, ops, stores, tuple(sorted((c, types[n]) for n, c in names.items() if n in types)))


def runners_up(ranked: list[Ranked]) -> list[Ranked]:
    """What `explain` shows the choice beat: the KEEP_RUNNERS_UP next in rank, then the best of
    every other variant (unit, and how A is loaded) the ranking holds, so that the alternative
    one might expect (mma against wgmma, a gathered image against im2col) is there with its time."""
    shown = list(ranked[1:1 + KEEP_RUNNERS_UP])
    seen = {_variant(r.params) for r in ranked[:1] + shown}
    for r in ranked[1 + KEEP_RUNNERS_UP:]:
        if _variant(r.params) not in seen:
            seen.add(_variant(r.params))
            shown.append(r)
    return shown


def _variant(p: dict[str, Any]) -> tuple:
    return p.get("unit"), p.get("A")


def _matches(p: dict[str, Any], pin: dict[str, Any]) -> bool:
    return all(str(p.get(key)) == str(value) for key, value in pin.items())


def pins_unused(schedules: Iterable[Mapping[str, Any]], pin: Mapping[str, Any]) -> str | None:
    """Why the plan-wide pins of `pin` (`--pin KEY=VALUE`, not the rewrite switches) restricted no
    kernel, given the chosen schedules of every plan of the bundle; None when one of them matches
    them all. A pin restricts the kernels whose space has all of its keys, so a key no space has (a
    misspelt one, or FLAT on a model without batches) would otherwise change nothing, silently."""
    every, _ = node_pins(pin)
    if not every or any(_matches(dict(p), every) for p in schedules):
        return None
    said = " ".join(f"--pin {key}={value}" for key, value in every.items())
    keys = "these keys together" if len(every) > 1 else f"the key {next(iter(every))!r}"
    return (f"{said}: no kernel's schedule has {keys}, so the pin would change nothing; `aicfc explain` "
            f"lists each kernel's schedule parameters and candidates")


def node_pins(pin: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(pins of every kernel, pins by ONNX node): `--pin NODE:KEY=VALUE` restricts only the kernel
    that covers ONNX node NODE (the names `aicfc explain` lists), `--pin KEY=VALUE` every kernel
    whose space has KEY."""
    from aicfc.passes.fold_cache_writes import PIN as EARLY_PIN
    from aicfc.passes.unfold_taps import PIN as UNFOLD_PIN
    from aicfc.passes.concat_projections import PIN as PROJECTION_PIN
    from aicfc.passes.pool_epilogue import PIN as POOLED_PIN
    from aicfc.passes.fold_row_scale import PIN as ROWSCALE_PIN
    from aicfc.passes.early_epilogue import PIN as EPRE_PIN
    from aicfc.passes.l2_fill import PIN as FILL_PIN, SHARE_PIN
    from aicfc.passes.relayout_weights import GEMV_PIN
    from aicfc.passes.attention_room import PIN as ROOM_PIN
    from aicfc.passes.gemv_room import PIN as GEMV_ROOM_PIN
    from aicfc.passes.work_before_wait import PIN as AHEAD_PIN
    from aicfc.passes.early_trigger import PIN as TRIGGER_PIN
    from aicfc.passes.late_trigger import PIN as LATE_PIN
    from aicfc.passes.tail_steps import PIN as TAIL_PIN
    from aicfc.passes.join_launches import GATE_PIN, PIN as JOIN_PIN
    from aicfc.passes.join_concat import PIN as CONCAT_PIN
    from aicfc.passes.join_reduce import PIN as REDUCE_PIN
    from aicfc.passes.gather_stem import PIN as GATHER_PIN
    passes = (UNFOLD_PIN, EARLY_PIN, PROJECTION_PIN, POOLED_PIN, ROWSCALE_PIN, EPRE_PIN, FILL_PIN, SHARE_PIN, GEMV_PIN,
              ROOM_PIN, GEMV_ROOM_PIN, AHEAD_PIN, TRIGGER_PIN, LATE_PIN, TAIL_PIN, JOIN_PIN, GATE_PIN, CONCAT_PIN,
              REDUCE_PIN, GATHER_PIN)
    every: dict[str, Any] = {}
    by_node: dict[str, dict[str, Any]] = {}
    for key, value in pin.items():
        node, colon, name = key.rpartition(":")
        if not colon:
            if key not in passes:
                every[key] = value
            continue
        if not node or not name:
            raise AicfError(f"--pin {key}={value}: expected NODE:KEY=VALUE, e.g. --pin node_matmul_115:unit=gemv")
        if name in passes:
            raise AicfError(f"--pin {key}={value}: {name!r} switches a rewrite for the whole plan, not one "
                            f"node's schedule; give it as --pin {name}={value}")
        by_node.setdefault(node, {})[name] = value
    return every, by_node


def plan_schedules(plan: Plan, hw: Profile, pin: dict[str, Any] | None = None,
                   check: RegisterCheck | None = None) -> Plan:
    """`pin` (from `--pin KEY=VALUE`) restricts every kernel whose space has those keys, and
    `--pin NODE:KEY=VALUE` the kernel covering ONNX node NODE, which must have KEY (`node_pins`);
    `check` counts the leading candidates' registers (`check_leaders`). Keys that switch a
    rewrite rather than a schedule (`unfold`, passes/unfold_taps.py; `early`, passes/fold_cache_writes.py;
    `projection`, passes/concat_projections.py; `pooled`, passes/pool_epilogue.py; `rowscale`,
    passes/fold_row_scale.py; `epre`, passes/early_epilogue.py; `fill`, passes/l2_fill.py; `room`, passes/attention_room.py;
    `gemvroom`, passes/gemv_room.py) were the passes' to read and
    are dropped."""
    every, by_node = node_pins(pin or {})
    covered = {node for k in plan.kernels for node in k.origins}
    missing = sorted(set(by_node) - covered)
    if missing:
        raise AicfError(f"--pin {missing[0]}:...: no kernel of the plan covers ONNX node {missing[0]!r}; "
                        f"`aicfc explain` lists the nodes each kernel covers")

    kernels, records = [], []
    types = plan.types()
    solved: dict[Hashable, tuple[Kernel, list[Ranked], list[Candidate]]] = {}

    def problem(k: Kernel) -> tuple[Hashable, frozenset[str]]:
        """What `rank` depends on: the kernel's structure and the keys pinned on it."""
        return structure(k, types), frozenset(every) | frozenset(own_pins(k, by_node))
    for k in plan.kernels:
        key = problem(k)
        if key not in solved:
            solved[key] = (k, *rank(k, plan, hw, key[1]))
    if check:
        problems = [(key, v) for key, v in solved.items() if v[1]]
        for (key, (k, _, rejected)), ranked in zip(problems, check_leaders(plan, hw, [v for _, v in problems], check)):
            solved[key] = (k, ranked, rejected)
    for k in plan.kernels:
        _, ranked, rejected = solved[problem(k)]
        own = own_pins(k, by_node)
        nodes = [n for n in k.origins if n in by_node]
        if own and ranked and not any(set(own) <= set(r.params) for r in ranked):
            raise AicfError(f"--pin {', '.join(nodes)}:{'/'.join(sorted(own))}: no {k.family} schedule of kernel {k.name} has "
                            f"{'these keys' if len(own) > 1 else 'this key'} ({', '.join(sorted(own))}); "
                            f"`aicfc explain` lists its candidates and their keys")
        if not ranked:
            # the launch limits bind every candidate when they bind one: the reason worth naming
            grid = next((c.rejected_because for c in rejected if c.rejected_because.startswith("grid ")), None)
            why = grid or (rejected[0].rejected_because if rejected else "empty space")
            tail = "; the tensors are too large for one launch" if grid else ""
            raise AicfError(f"kernel {k.name}: no candidate of the {k.family} space fits {hw.arch} ({why}){tail}")
        pin = applied_pins(ranked, every, own)[0]
        if pin:
            pinned = [r for r in ranked if _matches(r.params, pin)]
            scope = "".join(f"{n}:" for n in nodes)
            said = " ".join(f"{scope if a in own else ''}{a}={b}" for a, b in pin.items())
            if not pinned:
                # a matching candidate the constraints or ptxas rejected: its reason is what to change
                why = next((c.rejected_because for c in rejected if _matches(dict(c.params), pin)), None)
                raise AicfError(f"kernel {k.name}: no feasible {k.family} candidate matches --pin {said}"
                                + (f" (the one that matches was rejected: {why})" if why else
                                   "; `aicfc explain` lists the feasible ones"))
            records.append(Rewrite("--pin " + said, k.name, True,
                                   f"the user restricted the schedule to {len(pinned)} of {len(ranked)} feasible "
                                   f"candidates; the unpinned best was {ranked[0].time_us:.2f} us"))
            ranked = pinned + [r for r in ranked if not _matches(r.params, pin)]
        best = ranked[0]
        seen_reasons: set[str] = set()
        kept_rejected = []
        for c in rejected:
            kind = re.sub(r"[\d.]+", "N", c.rejected_because)
            if kind not in seen_reasons and len(kept_rejected) < KEEP_REJECTED:
                seen_reasons.add(kind)
                kept_rejected.append(c)
        candidates = tuple(Candidate(_params(r.params), round(r.time_us, 4)) for r in runners_up(ranked))
        schedule = Schedule(_params(best.params), best.grid, best.block, best.dyn_smem, None,
                            best.estimate.as_items(), candidates + tuple(kept_rejected))
        kernels.append(k.replace(schedule=schedule))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
