"""gather_stem: Decision IR → Decision IR; the pooled stem computes its unfolded input itself instead of
reading a copy that a kernel of its own wrote (rule RULE).

After `unfold_taps` the ResNet stem reads U, the graph input's copy with a tile's filter rows and columns
unfolded into each pixel's 64 elements ([Note: row phases] in passes/unfold_taps.py), and a pointwise kernel
writes U first: at B32 it reads the 9.6 MB fp16 NCHW input and writes 53 MB, which the stem reads back (an
H100's profile, session 86: the copy 25.3 us alone, the stem 31.3). Where the stem runs on the `pool` unit,
its producer warpgroup can fill each tile's slot from the input with what the copy would have stored there
([Note: the stem gathers its input] in codegen/conv_pool.py): U is then never written, the copy's kernel goes,
and the stem reads the input once.

    kernel k0 pointwise { %x.unfold = map load(%x, [i0, i3, 2*i1+i4-3, 2*i2+i5-3], fill=0.0, guard=[1]); store %x.unfold }
    kernel k1 conv { %conv.acc = sum[64,4,1] mul(load(%x.unfold.rows, ...), load(%w, ...)) ...; store %pool }
  becomes
    kernel k1 conv { same ops; inlined ["x.unfold.rows"] "..." %x.unfold = map load(%x, ...) }     (k0 gone)

Legal where the pooled convolution's image is the result of one pointwise kernel's single map of graph inputs
(or through views of it), read by nothing else and no graph output, and the producer fills slots
(`conv_pool.gather_why_not`). The stem is re-planned among its candidates that gather (`conv_pool.space` gives
each GI = 1 once the producer is inlined; ptxas checks the leaders) and weighed against the copy's and the
stem's predicted times together; both figures go in the record. For now only under `--pin gstem=1` (OPT_IN:
the form measured was slower, the form that replaced it is unmeasured); `gstem=0` says so in the record.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aicfc.codegen import conv_pool
from aicfc.errors import AicfError
from aicfc.ir.decision import Candidate, Inlined, Kernel, Plan, Schedule
from aicfc.ir.lowered import Rewrite, loads, view_base
from aicfc.ir.properties import implicit_gemm

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile

RULE = "copy(x) -> pooled stem => the stem's producer fills its slots from x (no copy)"
PIN = "gstem"   # --pin gstem=0 keeps the copy kernel, gstem=1 gathers wherever legal
# Without the pin the stem keeps its copy, whatever the prediction: the element-by-element producer measured 4.2x
# slower than the copy and the stem together (131.1 us against 25.3 + 31.3, session 87 call 1, an H100), and the
# rows' form that replaced it ([Note: a slot filled by source rows]) has not run on a GPU yet.
OPT_IN = ("the stem gathers only under --pin gstem=1 (session 87: the element-by-element producer measured 131.1 us "
          "alone against 25.3 + 31.3 for the copy and the stem; the rows' form, predicted {gather:.2f} us against "
          "{apart:.2f}, has not run on a GPU)")


def _site(k: Kernel, kernels: list[Kernel | None], plan: Plan) -> tuple[int, set[str]] | str:
    """(the index of the kernel that writes the pooled stem `k`'s image, the image's names) or why there is none."""
    g = implicit_gemm(k.ops[0])
    weights = {w.name for w in plan.weights}
    image = g.b if g.a.buffer in weights else g.a
    base = view_base(plan.views)
    u = base(image.buffer)
    names = {u, *(v.out for v in plan.views if base(v.out) == u)}
    writers = [i for i, c in enumerate(kernels) if c is not None and u in c.stores]
    if len(writers) != 1:
        return "its image is not one kernel's result"
    c = kernels[writers[0]]
    if c.family != "pointwise" or len(c.ops) != 1 or c.stores != (u,) or c.ops[0].out != u:
        return f"its image is written by {c.name}, not by a copy of one map alone"
    inputs = {v.name for v in plan.inputs}
    if any(ld.buffer not in inputs for ld in loads(c.ops[0].body)):
        return f"{c.name} reads more than the graph's inputs"
    readers = [r for r in kernels if r is not None and r is not c
               and any(ld.buffer in names for r_op in r.ops for ld in loads(r_op.body))]
    if readers != [k] or any(base(o) == u for o in plan.outputs):
        return f"{u!r} has other readers or is a graph output"
    why = conv_pool.gather_why_not(c.ops[0], plan.types()[image.buffer])
    return why if why else (writers[0], names)


def _gathering(k: Kernel, plan: Plan, hw: Profile, pin: dict | None, check):
    """The best predicted schedule of `k` (the stem with its producer inlined) among its candidates, the pins applied,
    the leaders checked by ptxas where `check` is given; and the candidates considered."""
    from aicfc.passes.plan_schedules import _matches, applied_pins, check_leaders, node_pins, own_pins, rank
    every, by_node = node_pins({key: v for key, v in (pin or {}).items() if key != PIN})
    ranked = rank(k, plan, hw, frozenset(every) | frozenset(own_pins(k, by_node)))[0]
    use = applied_pins(ranked, every, own_pins(k, by_node))[0]
    ranked = [r for r in ranked if _matches(r.params, use)]
    if check is not None and ranked:
        ranked = check_leaders(plan, hw, [(k, ranked, [])], check)[0]
    return (ranked[0] if ranked else None), ranked


def gather_stem(plan: Plan, hw: Profile, pin: dict | None = None, check=None) -> Plan:
    forced = (pin or {}).get(PIN)
    if forced not in (None, "0", "1", 0, 1):
        raise AicfError(f"--pin {PIN}={forced}: expected {PIN}=0 (the stem reads the copy) or {PIN}=1 (the stem "
                        f"fills its slots from the input wherever legal; without the pin, where predicted faster)")
    types = plan.types()
    kernels: list[Kernel | None] = list(plan.kernels)
    records: list[Rewrite] = []
    for i, k in enumerate(plan.kernels):
        if k.family != "conv" or k.schedule is None or k.schedule.param.get("unit") != "pool" or k.inlined:
            continue
        site = _site(k, kernels, plan)
        u = conv_pool.conv_part(k).ops[0].out
        if isinstance(site, str):
            records.append(Rewrite(RULE, u, False, f"{k.name}: {site}"))
            continue
        j, names = site
        copy = kernels[j]
        target = copy.ops[0].out
        if str(forced) == "0":
            records.append(Rewrite(RULE, target, False, f"--pin {PIN}=0"))
            continue
        views = tuple(sorted(names - {target}))
        inlined = k.replace(inlined=(Inlined(copy.ops[0], views, ""),))
        best, considered = _gathering(inlined, plan, hw, pin, check)
        apart = copy.schedule.time_us + k.schedule.time_us
        if best is not None and forced is None:
            records.append(Rewrite(RULE, target, False, OPT_IN.format(gather=best.time_us, apart=apart)))
            continue
        if best is None or (best.time_us >= apart and str(forced) != "1"):
            records.append(Rewrite(RULE, target, False, "no candidate of the stem fills its slots" if best is None else
                                   f"predicted {best.time_us:.2f} us gathering against {apart:.2f} with the copy "
                                   f"({copy.name} {copy.schedule.time_us:.2f} + {k.name} {k.schedule.time_us:.2f})"))
            continue
        mb = types[target].nbytes / 1e6
        reason = (f"kernel {copy.name} (the {mb:.1f} MB {target!r}) computed by {k.name}'s producer warpgroup into each "
                  f"tile's slot: {target!r} is neither written nor read back; predicted {best.time_us:.2f} us against "
                  f"{apart:.2f} with the copy ({copy.name} {copy.schedule.time_us:.2f} + {k.name} "
                  f"{k.schedule.time_us:.2f})" + (f" (--pin {PIN}=1)" if str(forced) == "1" else ""))
        cands = tuple(Candidate(tuple(sorted(c.params.items())), c.time_us) for c in considered[1:9])
        sched = Schedule(tuple(sorted(best.params.items())), best.grid, best.block, best.dyn_smem, None,
                         best.estimate.as_items(), cands)
        kernels[i] = inlined.replace(inlined=(Inlined(copy.ops[0], views, reason),),
                                     schedule=sched, rewrites=tuple(dict.fromkeys(k.rewrites + (RULE,))))
        kernels[j] = None
        records.append(Rewrite(RULE, target, True, reason, 2 * types[target].nbytes))
    if not records:
        return plan
    return plan.replace(kernels=tuple(k for k in kernels if k is not None), rewrites=plan.rewrites + tuple(records))
