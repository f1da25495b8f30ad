"""declare_state: Decision IR → Decision IR with the model's state declared and updated in place.

Property `updated_input_state`: graph output y is ScatterND(x, ids, upd) (lower_data.py's
functional form %y.hit, %y.val, %y = select(%y.hit, %y.val, x)) where x is a graph input of
y's type that no kernel reads other than to compute y, and that is no graph output itself.
Then (x, y) is one STATE tensor: one persistent device buffer that holds x before a run and y
after it (the executor keeps it across runs, aicf_run/state.py), and the three kernels of the
functional form become one kernel of family `scatter` that writes only the indexed rows in place
(codegen/scatter.py): the elements it does not write already hold x. A decode step of a KV cache
then moves its new rows, not the whole cache. The interface of the bundle loses x and y: state
is not passed to or returned by `run`.

    kernel k8 row_reduce { %y.hit = max[1] ... }   kernel k9 row_reduce { %y.val = sum[1] ... }
    kernel k10 pointwise { %y = map select(load(%y.hit, ..), load(%y.val, ..), load(%x, ..)) }
  becomes
    kernel k8 scatter { %y.hit ... %y.val ... %y ... store %y  inplace %y reuses %x }
    state %x %y kernel="k8" write_bytes=... copy_bytes=... "..."
"""
from __future__ import annotations

from aicfc.ir.decision import InPlace, Kernel, Plan, State
from aicfc.ir.lowered import Affine, Call, Compute, Load, loads
from aicfc.ir.properties import is_identity_access
from aicfc.planner.cost import scatter_bytes

STATE_RULE = "y = ScatterND(x, ids, upd), x an input read only there, y an output => state updated in place"


def _functional_form(plan: Plan, y: str) -> tuple[str, list[int]] | None:
    """(x, the indices of the kernels computing %y.hit, %y.val, %y) when y has the form."""
    where = {op.out: i for i, k in enumerate(plan.kernels) for op in k.ops}
    if not all(n in where for n in (f"{y}.hit", f"{y}.val", y)):
        return None
    op = next(o for o in plan.kernels[where[y]].ops if o.out == y)
    body = op.body
    if not (op.combiner == "map" and isinstance(body, Call) and body.fn == "select"
            and all(isinstance(a, Load) for a in body.args)
            and (body.args[0].buffer, body.args[1].buffer) == (f"{y}.hit", f"{y}.val")):
        return None
    x = body.args[2]
    if not is_identity_access(x, op.type.shape):
        return None
    return x.buffer, sorted({where[f"{y}.hit"], where[f"{y}.val"], where[y]})


def declare_state(plan: Plan) -> Plan:
    inputs = {v.name: v.type for v in plan.inputs}
    types = plan.types()
    kernels = list(plan.kernels)
    states: list[State] = []
    for y in plan.outputs:
        found = _functional_form(plan, y)
        if found is None:
            continue
        x, members = found
        mine = {f"{y}.hit", f"{y}.val", y}
        if x not in inputs or inputs[x] != types[y] or x in plan.outputs or any(
                v.source == x for v in plan.views):
            continue
        if any(op.out not in mine for i in members for op in kernels[i].ops):
            continue   # a member kernel computes something else too
        readers = [i for i, k in enumerate(kernels) if k is not None for op in k.ops if op.out != y
                   for ld in loads(op.body) if ld.buffer in (x, f"{y}.hit", f"{y}.val")]
        if any(i not in members for i in readers) or any(
                ld.buffer == x for i in members for op in kernels[i].ops if op.out != y for ld in loads(op.body)):
            continue   # x (or a part of the form) is read elsewhere: the update would clobber it
        ops = {op.out: op for i in members for op in kernels[i].ops}
        chain = tuple(ops[n] for n in (f"{y}.hit", f"{y}.val", y))
        first = kernels[members[0]]
        merged = Kernel(first.name, "scatter", chain,
                        tuple(tuple((v, Affine.var(v)) for v in op.domain_vars) for op in chain), (y,),
                        ("updated_input_state",), (STATE_RULE,),
                        inplace=(InPlace(y, x, f"{x!r} and {y!r} are one state buffer: the scatter writes the "
                                               "indexed rows, every other element already holds x"),))
        for i in members:
            kernels[i] = None  # type: ignore[call-overload]
        kernels[members[-1]] = merged   # where %y was: every operand of the three is computed by then
        write = scatter_bytes(merged, types)
        copy = 2 * types[y].nbytes + write
        states.append(State(x, y, first.name, f"graph output {y!r} is graph input {x!r} updated by ScatterND and "
                                              f"{x!r} is read nowhere else: one buffer, updated in place", write, copy))
    if not states:
        return plan
    return plan.replace(kernels=tuple(k for k in kernels if k is not None), state=tuple(states))
