"""Decision-applied IR + built module → the bundle payload (docs/bundle-format.md)."""
from __future__ import annotations

import hashlib
from typing import Any

from aicf_run.bundle import FORMAT_VERSION   # the runtime owns the format
from aicfc import __version__
from aicfc.codegen import join
from aicfc.codegen.common import kernel_args
from aicfc.codegen.io_cast import Converted
from aicfc.codegen.nvcc import nvcc_version
from aicfc.codegen.module import ModuleBuild
from aicfc.codegen.pdl import DEPENDENT
from aicfc.codegen.timeline import STAMPS, phase_labels, stamped_blocks, symbol as stamp_symbol
from aicfc.codegen.tma import constant_maps, maps_symbol, records
from aicfc.ir.decision import Plan
from aicfc.passes.pipeline import Result
from aicfc.ir.types import ITEMSIZE
from aicfc.passes.apply_precision import STORAGE
from aicfc.passes.plan_memory import memory_summary
from aicfc.planner.hardware import Profile



def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def module_record(m: ModuleBuild, arch: str) -> dict[str, Any]:
    """A built module as the bundle's `modules` list holds it."""
    return {"name": m.name, "arch": arch, "cubin": m.built.cubin, "cubin_sha256": _sha(m.built.cubin),
            "source_sha256": _sha(m.source.encode()), "source": m.source}


def _kernel(k, index: dict[str, int], module: int, types, launch: str,
            constant: frozenset[str] = frozenset(), timeline: str | None = None,
            trigger: int = 0, symbol: str | None = None) -> dict[str, Any]:
    """`timeline`: the source of the kernel's module where the plan is stamped, else None."""
    s = k.schedule
    maps_in = {"maps_symbol": maps_symbol(k.name)} if k.name in constant else {}
    if timeline is not None:   # [Note: timeline] (codegen/timeline.py): where the kernel's stamps are, its phases' names
        maps_in["timeline"] = {"symbol": stamp_symbol(k.name), "blocks": stamped_blocks(s.grid), "stamps": STAMPS,
                               **({"phases": labels} if (labels := phase_labels(timeline, k.name)) else {})}
    return {
        "name": k.name, "module": module, "symbol": symbol or k.name, "family": k.family,
        "params": dict(s.params), "grid": list(s.grid), "block": list(s.block),
        "smem_bytes": s.smem_bytes, "registers": s.registers,
        "args": [index[b] for b in kernel_args(k)],
        "tensor_maps": records(k, None, types, index), **maps_in,
        "onnx_nodes": list(k.origins), "properties": list(k.properties), "rewrites": list(k.rewrites),
        "stores": list(k.stores),
        "launch": launch,
        # [Note: PDL] (codegen/pdl.py): the first block that lets the next kernel launch
        **({"trigger_from": trigger} if launch == DEPENDENT else {}),
        "predicted": dict(s.predicted),
        "candidates": [{"params": dict(c.params), "predicted_time_us": c.predicted_time_us}
                       if c.predicted_time_us is not None else
                       {"params": dict(c.params), "rejected_because": c.rejected_because}
                       for c in s.candidates],
    }


def launches(plan: Plan, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kernel records the executor launches: a joined kernel's record ([Note: a gemv joined to the launch before
    it] in codegen/join.py) goes into its host's `joined` list, and the host's launch takes its blocks and arguments."""
    out: list[dict[str, Any]] = []
    for i, (k, record) in enumerate(zip(plan.kernels, records, strict=True)):
        if not join.joined(k):
            out.append(record)
            continue
        host = out[-1]   # the record of plan.kernels[i - 1]: a host is never joined itself (it is no gemv)
        _, _, total = join.launch_blocks(plan.kernels[i - 1], k)
        host.update(grid=[total, 1, 1], args=host["args"] + record["args"],
                    # its stamps, under --timeline: [Note: a joined role's stamps] in codegen/timeline.py
                    joined=host.get("joined", []) + [record | {"into": host["name"]}])
    return out


def decision_log(plan: Plan) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = [
        {"kind": "rewrite", "rule": r.rule, "target": r.target, "applied": r.applied,
         "reason": r.reason, "bytes_saved": r.bytes_saved} for r in plan.rewrites]
    for k in plan.kernels:
        s = k.schedule
        log.append({"kind": "schedule", "kernel": k.name, "family": k.family, "params": dict(s.params),
                    "predicted_time_us": s.time_us,
                    "reason": f"lowest predicted time among {sum(1 for c in s.candidates if c.predicted_time_us is not None) + 1}"
                              f" kept candidates of the {k.family} space"})
    return log


def converted(result: Result, plan: Plan) -> list[Converted]:
    """The inputs and outputs whose interface dtype (the model's) differs from their storage."""
    host, types = result.high.types(), plan.types()
    stateful = {n for st in plan.state for n in (st.input, st.output)}   # kept in their storage dtype
    names = [(v.name, True) for v in plan.inputs] + [(n, False) for n in plan.outputs]
    names = [(n, i) for n, i in names if n not in stateful]
    return [Converted(n, host[n].bundle_name, types[n].bundle_name, types[n].numel, is_input)
            for n, is_input in names if n in host and host[n].bundle_name != types[n].bundle_name]


def build_payload(result: Result, plan: Plan, modules: list[ModuleBuild], profile: Profile,
                  precision: str, model_sha256: str,
                  casts: tuple[ModuleBuild | None, dict[str, dict]] = (None, {})) -> dict[str, Any]:
    """`casts`: the interface cast module and records (codegen/io_cast.py build_casts); its
    module goes after `modules`, where its records' `module` index points."""
    cast_module, cast_records = casts
    if cast_module is not None:
        modules = [*modules, cast_module]
    buffers = [b for b in plan.buffers]
    index = {b.name: i for i, b in enumerate(buffers)}
    weights = {w.name: w for w in plan.weights}
    storage = STORAGE[precision]
    outputs = set(result.high.outputs)
    graph_bytes = sum(n.type.numel * ITEMSIZE[storage if n.type.dtype == "f32" else n.type.dtype]
                      for n in result.high.nodes if n.output not in outputs)
    mem = memory_summary(plan, graph_bytes)
    types = plan.types()
    module_of = {name: i for i, m in enumerate(modules) for name in m.kernel_names}

    host = result.high.types()   # the model's own dtypes: the interface aicf-run converts to
    stateful = {n for st in plan.state for n in (st.input, st.output)}

    def signature(names) -> list[dict[str, Any]]:
        return [{"name": n, "dtype": host.get(n, types[n]).bundle_name, "shape": list(types[n].shape), "buffer": index[n],
                 **({"cast": cast_records[n]} if n in cast_records else {})}
                for n in names]
    constant = constant_maps(plan)   # [Note: TMA maps in constant memory], as codegen/module.py rendered them
    return {
        "format_version": FORMAT_VERSION,
        # the nvcc (and so the ptxas) that built the kernels and counted the registers the planner re-ranked its
        # leaders with: another toolkit can count differently and pick differently
        "compiler": {"name": "aicfc", "version": __version__, "nvcc": nvcc_version()},
        "target": {"arch": plan.target, "profile": profile.data},
        "precision": precision,
        "model": {"name": plan.name, "source_sha256": model_sha256},
        "inputs": signature([v.name for v in plan.inputs if v.name not in stateful]),
        "outputs": signature([o for o in plan.outputs if o not in stateful]),
        # [Note: state] persistent buffers the executor keeps across runs (docs/bundle-format.md)
        "state": [{"name": st.input, "output": st.output, "dtype": types[st.input].bundle_name,
                   "shape": list(types[st.input].shape), "buffer": index[st.input], "output_buffer": index[st.output],
                   "kernel": st.kernel, "write_bytes": st.write_bytes, "copy_bytes": st.copy_bytes,
                   "reason": st.reason} for st in plan.state],
        "buffers": [{"id": i, "name": b.name, "region": b.region, "offset": b.offset, "nbytes": b.type.nbytes,
                     "dtype": b.type.bundle_name, "shape": list(b.type.shape)} for i, b in enumerate(buffers)],
        "memory": {**mem, "arena_bytes": max(1, mem["arena_bytes"])},
        "weights": [{"buffer": index[n], "data": w.data, "sha256": w.sha256} for n, w in weights.items()],
        "modules": [module_record(m, plan.target) for m in modules],
        "kernels": launches(plan, [_kernel(k, index, module_of[k.name], types, plan.launch, constant,
                                           modules[module_of[k.name]].source if plan.timeline else None, trigger, symbol)
                                   for k, trigger, symbol in zip(plan.kernels, plan.triggers, plan.symbols, strict=True)]),
        "ir": {"high": str(result.high), "lowered": str(result.lowered), "decision": str(plan)},
        "decisions": decision_log(plan) + [
            {"kind": "state", "input": st.input, "output": st.output, "kernel": st.kernel, "reason": st.reason,
             "write_bytes": st.write_bytes, "copy_bytes": st.copy_bytes} for st in plan.state] + [
            {"kind": "io_cast", "tensor": t.name, "from": t.pair[0], "to": t.pair[1],
             "kernel": cast_records[t.name]["symbol"],
             "reason": f"interface {t.host}, stored as {t.storage}: converted on the GPU by a "
                       f"cast kernel of module {cast_module.name}"}
            for t in converted(result, plan) if t.name in cast_records],
    }
