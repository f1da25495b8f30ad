"""The one ordered list of compiler stages; the CLI and the tests import it, never copy it.

Each stage maps one IR level to the same or the next level. `run_pipeline` verifies after
every stage (the verifier of the level the stage produced), and can dump the printed IR of
every stage as `NN_<stage>.txt`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from aicfc.ir.decision import verify_plan
from aicfc.ir.high import Graph, verify_graph
from aicfc.ir.lowered import Rewrite, verify_program
from aicfc.passes import concat_projections
from aicfc.passes.apply_precision import apply_precision
from aicfc.passes.canonicalize import canonicalize
from aicfc.passes.channels_last import channels_last
from aicfc.passes.cse import cse
from aicfc.passes.dce import dce
from aicfc.passes.declare_state import declare_state
from aicfc.passes.fold_column_scale import fold_column_scale
from aicfc.passes.fold_constants import fold_constants
from aicfc.passes.fold_guarded_moves import fold_guarded_moves
from aicfc.passes.fold_row_scale import fold_row_scale
from aicfc.passes.fold_views import fold_views
from aicfc.passes.form_kernels import form_kernels
from aicfc.passes.inline_producers import inline_producers
from aicfc.passes.interleave_gates import interleave_gates
from aicfc.passes.join_launches import join_launches
from aicfc.passes.lower import lower
from aicfc.passes.merge_contractions import merge_contractions
from aicfc.passes.attention_room import attention_room
from aicfc.passes.early_epilogue import early_epilogue
from aicfc.passes.early_trigger import early_trigger
from aicfc.passes.late_trigger import late_trigger
from aicfc.passes.gemv_room import gemv_room
from aicfc.passes.l2_fill import l2_fill
from aicfc.passes.tail_steps import tail_steps
from aicfc.passes.fold_cache_writes import fold_cache_writes
from aicfc.passes.join_concat import join_concat, joins_by_prediction
from aicfc.passes.gather_stem import gather_stem
from aicfc.passes.join_reduce import join_reduce
from aicfc.passes.plan_memory import plan_memory
from aicfc.passes.pool_epilogue import pool_epilogue
from aicfc.passes.plan_schedules import RANKED_BETWEEN, RegisterCheck, fastest, forget_rankings, plan_schedules
from aicfc.passes.read_grouped_heads import read_grouped_heads
from aicfc.passes.relayout_weights import relayout_weights
from aicfc.passes.unfold_taps import unfold_taps
from aicfc.passes.work_before_wait import work_before_wait
from aicfc.passes.rotary_epilogue import fold_rotary
from aicfc.passes.sink_views import sink_views
from aicfc.planner.hardware import Profile

LEVELS = ("high", "lowered", "decision")


@dataclass(frozen=True)
class Options:
    target: str
    profile: Profile
    precision: str = "fp32"
    pin: tuple[tuple[str, str], ...] = ()   # --pin KEY=VALUE: restrict schedule spaces
    inplace: bool = True                    # --no-inplace: no in-place reuse in plan_memory
    check: RegisterCheck | None = None      # ptxas's registers for the leading candidates
    # the projection shortcuts to merge (their Add's output, why): decide_projections fills it by cost;
    # None (a caller running the stages itself) merges none unless --pin projection=1
    projections: tuple[tuple[str, str], ...] | None = None
    dependent: bool = True                  # --no-pdl: plain launches (late_trigger then leaves every entry as it is)


@dataclass(frozen=True)
class Stage:
    name: str
    takes: str
    gives: str
    run: Callable[[Any, Options], Any]


PIPELINE: tuple[Stage, ...] = (
    Stage("canonicalize", "high", "high", lambda g, o: canonicalize(g, dict(o.pin), dict(o.projections or ()))),
    Stage("fold_constants", "high", "high", lambda g, o: fold_constants(g)),
    Stage("cse", "high", "high", lambda g, o: cse(g)),
    Stage("fold_column_scale", "high", "high", lambda g, o: fold_column_scale(g)),
    Stage("dce", "high", "high", lambda g, o: dce(g)),
    Stage("lower", "high", "lowered", lambda g, o: lower(g)),
    Stage("sink_views", "lowered", "lowered", lambda p, o: sink_views(p)),
    Stage("inline_producers", "lowered", "lowered", lambda p, o: inline_producers(p)),
    Stage("fold_views", "lowered", "lowered", lambda p, o: fold_views(p)),
    Stage("inline_again", "lowered", "lowered", lambda p, o: inline_producers(p, again=True)),
    Stage("merge_contractions", "lowered", "lowered", lambda p, o: merge_contractions(p)),
    Stage("fold_guarded_moves", "lowered", "lowered", lambda p, o: fold_guarded_moves(p)),
    Stage("read_grouped_heads", "lowered", "lowered", lambda p, o: read_grouped_heads(p)),
    Stage("interleave_gates", "lowered", "lowered", lambda p, o: interleave_gates(p)),
    Stage("rotary_epilogue", "lowered", "lowered", lambda p, o: fold_rotary(p, o.precision, o.profile)),
    Stage("form_kernels", "lowered", "decision", lambda p, o: form_kernels(p, o.target)),
    Stage("declare_state", "decision", "decision", lambda p, o: declare_state(p)),
    Stage("apply_precision", "decision", "decision", lambda p, o: apply_precision(p, o.precision)),
    Stage("channels_last", "decision", "decision", lambda p, o: channels_last(p, dict(o.pin), o.profile)),
    Stage("unfold_taps", "decision", "decision", lambda p, o: unfold_taps(p, dict(o.pin), o.profile)),
    Stage("pool_epilogue", "decision", "decision", lambda p, o: pool_epilogue(p, dict(o.pin), o.profile)),
    Stage("fold_row_scale", "decision", "decision", lambda p, o: fold_row_scale(p, dict(o.pin), o.profile)),
    Stage("relayout_weights", "decision", "decision", lambda p, o: relayout_weights(p, o.profile, dict(o.pin))),
    Stage("plan_schedules", "decision", "decision", lambda p, o: plan_schedules(p, o.profile, dict(o.pin), o.check)),
    Stage("join_concat", "decision", "decision", lambda p, o: join_concat(p, dict(o.pin))),
    Stage("join_reduce", "decision", "decision", lambda p, o: join_reduce(p, o.profile, dict(o.pin), o.check)),
    Stage("gather_stem", "decision", "decision", lambda p, o: gather_stem(p, o.profile, dict(o.pin), o.check)),
    Stage("fold_cache_writes", "decision", "decision", lambda p, o: fold_cache_writes(p, o.profile, dict(o.pin))),
    Stage("gemv_room", "decision", "decision", lambda p, o: gemv_room(p, o.profile, dict(o.pin), o.check)),
    Stage("early_epilogue", "decision", "decision", lambda p, o: early_epilogue(p, o.profile, dict(o.pin))),
    Stage("l2_fill", "decision", "decision", lambda p, o: l2_fill(p, o.profile, dict(o.pin))),
    Stage("tail_steps", "decision", "decision", lambda p, o: tail_steps(p, o.profile, dict(o.pin), o.check)),
    Stage("attention_room", "decision", "decision", lambda p, o: attention_room(p, o.profile, dict(o.pin), o.check)),
    Stage("work_before_wait", "decision", "decision", lambda p, o: work_before_wait(p, o.profile, dict(o.pin))),
    Stage("early_trigger", "decision", "decision", lambda p, o: early_trigger(p, o.profile, dict(o.pin))),
    Stage("join_launches", "decision", "decision", lambda p, o: join_launches(p, o.profile, dict(o.pin), o.check)),
    Stage("late_trigger", "decision", "decision",
          lambda p, o: late_trigger(p, o.profile, dict(o.pin)) if o.dependent else p),
    Stage("plan_memory", "decision", "decision", lambda p, o: plan_memory(p, o.inplace)),
)

# Ordering rules, checked at import: levels only move forward, one step at a time, and
# canonicalize precedes lower (lowering has no rule for Gemm); sink_views precedes
# inline_producers (it moves a split view from between a GEMM's bias map and the element-wise
# maps reading it, HF Conv1D's view back to [B,S,N] before the GELU, to after those maps: the
# bias is then recomputed inside them, and form_kernels absorbs them as the GEMM's epilogue;
# after inline_producers the bias would already be stored); fold_views follows
# inline_producers (which recomputes maps in program order: with the head-split views gone
# first, the bias would be recomputed inside the head transpose, which then no longer folds
# into the attention's operand access) and precedes merge_contractions (which keeps a result
# read through a view apart); inline_again (inline_producers once more) follows fold_views,
# which has taken the splitting views out from between producers and consumers;
# merge_contractions precedes form_kernels (which absorbs the merged epilogue);
# fold_guarded_moves follows merge_contractions (its split views of a GEMM's result would keep
# the GEMM from merging with its siblings: a result read through a view stays apart);
# read_grouped_heads comes last before form_kernels (the K/V head copies it reads through
# must already read the QKV result directly: views folded, moves inlined); interleave_gates
# follows merge_contractions (whose merged gate/up result it reorders) and precedes form_kernels
# (which absorbs the map of the column pairs as a gated epilogue); rotary_epilogue: below.
for _a, _b in zip(PIPELINE, PIPELINE[1:]):
    assert _a.gives == _b.takes, f"stage {_b.name} takes {_b.takes} but {_a.name} gives {_a.gives}"
_ORDER = [s.name for s in PIPELINE]
assert _ORDER.index("canonicalize") < _ORDER.index("lower") < _ORDER.index("sink_views") < _ORDER.index("inline_producers")
assert _ORDER.index("fold_constants") < _ORDER.index("cse") < _ORDER.index("dce")   # folding makes duplicates
# fold_column_scale takes constants as fold_constants left them (a norm's weight through a Cast) and
# precedes lower (it rewrites MatMul nodes) and apply_precision (the folded weight is rounded once).
assert _ORDER.index("fold_constants") < _ORDER.index("fold_column_scale") < _ORDER.index("lower")
assert _ORDER.index("apply_precision") < _ORDER.index("relayout_weights") < _ORDER.index("plan_schedules")
assert (_ORDER.index("inline_producers") < _ORDER.index("fold_views") < _ORDER.index("inline_again")
        < _ORDER.index("merge_contractions") < _ORDER.index("fold_guarded_moves")
        < _ORDER.index("read_grouped_heads") < _ORDER.index("form_kernels"))
assert _ORDER.index("merge_contractions") < _ORDER.index("interleave_gates") < _ORDER.index("form_kernels")
# rotary_epilogue follows fold_guarded_moves (rotate_half's halves read from the QKV result) and
# read_grouped_heads (the attention's reads of q, k and v resolved) and precedes form_kernels.
assert _ORDER.index("read_grouped_heads") < _ORDER.index("rotary_epilogue") < _ORDER.index("form_kernels")
# declare_state merges the kernels form_kernels made of a ScatterND's functional form, and must
# precede plan_schedules (which plans the merged scatter kernel) and plan_memory (state buffers).
assert _ORDER.index("form_kernels") < _ORDER.index("declare_state") < _ORDER.index("plan_schedules")
# fold_cache_writes folds declare_state's scatters into the attentions plan_schedules made split-KV,
# before plan_memory places the buffers of the merged kernels.
assert _ORDER.index("plan_schedules") < _ORDER.index("fold_cache_writes") < _ORDER.index("plan_memory")
# join_concat removes the Concat kernels a wgmma GEMM's A operand absorbs, once plan_schedules chose that unit and
# BK, and before the passes that read the final kernel order and plan_memory (the inputs live until the GEMM).
assert _ORDER.index("plan_schedules") < _ORDER.index("join_concat") < _ORDER.index("fold_cache_writes")
# join_reduce re-plans a Hopper GEMM with the GEMM that reads its whole rows (both scheduled by plan_schedules, the
# host's A operand settled by join_concat), before the passes that read the final kernel order and plan_memory.
assert _ORDER.index("join_concat") < _ORDER.index("join_reduce") < _ORDER.index("fold_cache_writes")
# gather_stem re-plans the pooled stem (scheduled by plan_schedules) with its input copy inlined, before the passes
# that read the final kernel order and plan_memory (which then never allocates the copy).
assert _ORDER.index("plan_schedules") < _ORDER.index("gather_stem") < _ORDER.index("fold_cache_writes")
# gemv_room reads the final kernel order (fold_cache_writes removes kernels) and changes a gemv's launch, before
# early_epilogue and l2_fill cost and fill that gemv as it will run.
assert _ORDER.index("fold_cache_writes") < _ORDER.index("gemv_room") < _ORDER.index("early_epilogue")
# early_epilogue reads the final kernel order (fold_cache_writes removes kernels) and precedes plan_memory,
# which keeps an operand read before the wait live until its reader.
assert _ORDER.index("fold_cache_writes") < _ORDER.index("early_epilogue") < _ORDER.index("plan_memory")
# l2_fill reads the final kernel order and the gemvs' PRE (fold_cache_writes, early_epilogue re-cost them).
assert _ORDER.index("early_epilogue") < _ORDER.index("l2_fill")
# tail_steps reads the final kernel order and the gemvs' tails as early_epilogue re-costed them (EPRE), after l2_fill,
# which keys on PRE (a gemv with more steps before its wait still requests its first), before attention_room.
assert _ORDER.index("l2_fill") < _ORDER.index("tail_steps") < _ORDER.index("attention_room")
# attention_room reads the final kernel order and the attentions' PRE (fold_cache_writes sets it), after l2_fill,
# which re-costs the gemvs it fills (each pass keeps the other's parameters).
assert _ORDER.index("l2_fill") < _ORDER.index("attention_room") < _ORDER.index("plan_memory")
# work_before_wait reads the early epilogues it must not break, and plan_memory lengthens the lifetimes of what it marks
assert _ORDER.index("attention_room") < _ORDER.index("work_before_wait") < _ORDER.index("plan_memory")
# join_launches reads every gemv's final parameters (l2_fill's fill, tail_steps' PRE, early_trigger's TF: it re-costs
# the role it makes from them) and precedes plan_memory, which places the joined launch's buffers as for its two
# kernels in order: the role writes only after every block of the kernel before has published, and what it reads
# before that (weights, early epilogue operands) lives until the role.
assert _ORDER.index("early_trigger") < _ORDER.index("join_launches") < _ORDER.index("plan_memory")
# late_trigger reads every kernel's final entry (AHEAD, TF, a gemv's PRE and PF) and the joined launches
assert _ORDER.index("join_launches") < _ORDER.index("late_trigger") < _ORDER.index("plan_memory")
# pool_epilogue merges a convolution whose layout (channels_last) and stem rows (unfold_taps) are decided,
# before relayout_weights lays out its filter and plan_schedules plans the merged kernel.
assert (_ORDER.index("channels_last") < _ORDER.index("unfold_taps") < _ORDER.index("pool_epilogue")
        < _ORDER.index("relayout_weights") < _ORDER.index("plan_schedules"))
# fold_row_scale merges a norm into the gemv that reads it once apply_precision has set the operands' types
# (the gemv streams fp16/bf16), before relayout_weights and plan_schedules plan the merged kernel.
assert _ORDER.index("apply_precision") < _ORDER.index("fold_row_scale") < _ORDER.index("relayout_weights")

VERIFIERS: dict[str, Callable[[Any], None]] = {
    "high": verify_graph, "lowered": verify_program, "decision": verify_plan,
}


@dataclass(frozen=True)
class Result:
    high: Graph
    lowered: Any
    plan: Any


@dataclass(frozen=True)
class Front:
    """The pipeline run up to the schedules for one choice of projections: what run_pipeline resumes
    from when that choice is the one decided."""
    projections: tuple[tuple[str, str], ...]
    last: dict
    ir: Any


def _run_stages(stages: Sequence[Stage], ir: Any, options: Options, last: dict[str, Any], verify: bool,
                on_stage: Callable[[str], None] | None, after: Callable[[int, Stage, Any], None] | None = None,
                first: int = 1) -> Any:
    """Runs `stages` from `ir`, verifying each result where asked and keeping it in `last` by the IR it
    gives; `on_stage` hears each stage's name before it runs, `after` gets each result with the stage's
    number in the whole pipeline (`first` for the first of these). The last IR is returned."""
    for n, stage in enumerate(stages, start=first):
        if on_stage:
            on_stage(stage.name)
        ir = stage.run(ir, options)
        if verify:
            VERIFIERS[stage.gives](ir)
        last[stage.gives] = ir
        if after:
            after(n, stage, ir)
    return ir


def decide_projections(graph: Graph, options: Options, on_stage: Callable[[str], None] | None = None,
                       verify: bool = True) -> tuple[Options, list[Rewrite], Front | None]:
    """Which projection shortcuts to merge with the 1x1 they are added to (passes/concat_projections.py),
    by the planner's predictions: the graph planned up to the schedules with every legal site merged and
    with none; per site, the best predicted times of the kernels covering its ONNX nodes, merged against
    apart. `options` with the sites chosen, a record of each site declined (a merged one's record comes
    from lower, with the same figures), and the front run of that choice where it was one of the two.
    Under `--pin projection=...` nothing is decided here. (A model with such sites plans its front
    stages two or three times, mostly the same kernels, whose rankings `rank` remembers: ResNet-50 B32
    planned in 20.5 s of CPU, decision included, against 50.6 s ranking every time.)"""
    if options.projections is not None or any(k == concat_projections.PIN for k, _ in options.pin):
        return options, [], None
    sites = concat_projections.merged_sites(canonicalize(graph, {concat_projections.PIN: "1"}).nodes)
    if not sites:
        return dataclasses.replace(options, projections=()), [], None
    front = PIPELINE[:_ORDER.index("relayout_weights") + 1]
    runs = []
    for merged in (tuple((site, "") for site in sites), ()):
        last: dict[str, Any] = {"high": graph}
        how = "merged" if merged else "apart"
        say = (lambda name, how=how: on_stage(f"projections {how}: {name}")) if on_stage else None
        ir = _run_stages(front, graph, dataclasses.replace(options, projections=merged), last, verify, say)
        runs.append(Front(merged, last, ir))

    def best(plan: Any, nodes: frozenset[str]) -> tuple[float, int, bool]:
        kernels = [k for k in plan.kernels if nodes & set(k.origins)]
        # a concatenation the GEMM will read by k-blocks is no kernel ([Note: a concatenation read by k-blocks])
        joined = [k for k in kernels if joins_by_prediction(k, plan, options.profile)]
        kernels = [k for k in kernels if k not in joined]
        return sum(fastest(k, plan, options.profile) for k in kernels), len(kernels), bool(joined)
    chosen, records = [], []
    for site, nodes in sorted(sites.items()):
        (t_merged, n_merged, joined), (t_apart, n_apart, _) = best(runs[0].ir, nodes), best(runs[1].ir, nodes)
        what = "the merged GEMM reading the concatenation by k-blocks" if joined else "the concatenation's copy and the merged GEMM"
        numbers = f"predicted {t_merged:.2f} us for {what} ({n_merged} kernels) against {t_apart:.2f} us apart ({n_apart} kernels)"
        if t_merged < t_apart:
            chosen.append((site, numbers))
        else:
            records.append(Rewrite(concat_projections.CONCAT_PROJECTION_RULE, site, False, f"kept apart: {numbers}"))
    # The front run of the choice made, if it was one of the two, is what run_pipeline resumes from (its
    # merged sites' records, planned without the figures, get them in `with_figures`).
    resume = runs[0] if len(chosen) == len(sites) else runs[1] if not chosen else None
    return dataclasses.replace(options, projections=tuple(chosen)), records, resume


def with_figures(plan: Any, projections: tuple[tuple[str, str], ...]) -> Any:
    """`plan` whose records of merged projections (from lower: the rule's reason) state the decision's
    figures, where the front run it resumed from was planned without them."""
    why = dict(projections)

    def fill(r: Rewrite) -> Rewrite:
        if r.rule != concat_projections.CONCAT_PROJECTION_RULE or not r.applied or not why.get(r.target) or why[r.target] in r.reason:
            return r
        return dataclasses.replace(r, reason=f"{r.reason}; {why[r.target]}")
    return plan.replace(rewrites=tuple(fill(r) for r in plan.rewrites))


def run_pipeline(graph: Graph, options: Options, dump_dir: str | Path | None = None,
                 verify: bool = True, on_stage: Callable[[str], None] | None = None) -> Result:
    try:
        return _run_pipeline(graph, options, dump_dir, verify, on_stage)
    finally:
        forget_rankings(RANKED_BETWEEN)   # [Note: rankings remembered] in passes/plan_schedules.py


def _run_pipeline(graph: Graph, options: Options, dump_dir: str | Path | None, verify: bool,
                  on_stage: Callable[[str], None] | None) -> Result:
    options, declined, resume = decide_projections(graph, options, on_stage, verify)
    last: dict[str, Any] = {"high": graph}
    ir: Any = graph
    start = 0
    if resume is not None and dump_dir is None:
        last, ir = dict(resume.last), resume.ir
        start = _ORDER.index("relayout_weights") + 1
    after: Callable[[int, Stage, Any], None] | None = None
    if dump_dir is not None:
        folder = Path(dump_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "00_import.txt").write_text(str(graph))

        def write(n: int, stage: Stage, ir: Any) -> None:
            (folder / f"{n:02d}_{stage.name}.txt").write_text(str(ir))
        after = write
    _run_stages(PIPELINE[start:], ir, options, last, verify, on_stage, after, start + 1)
    plan = last["decision"]
    if start:
        plan = with_figures(plan, options.projections or ())
    if declined:
        plan = plan.replace(rewrites=plan.rewrites + tuple(declined))
    return Result(last["high"], last["lowered"], plan)
