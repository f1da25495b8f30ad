"""`aicfc explain`: every decision in a bundle, from the bundle alone.

`explain_json` is the stable interface (docs/DESIGN's shape); `explain_text` renders it for
people: per kernel, what it covers, the schedule and why it won, and what it beat.
"""
from __future__ import annotations

from typing import Any

KERNEL_KEYS = ("name", "onnx_nodes", "family", "params", "grid", "block", "smem_bytes", "registers",
               "properties", "rewrites", "predicted", "candidates", "stores")


def explain_json(payload: dict[str, Any]) -> dict[str, Any]:
    mem = payload["memory"]
    return {
        "format_version": payload["format_version"],
        "compiler": payload["compiler"],
        "target": payload["target"]["arch"],
        "target_name": payload["target"]["profile"].get("name", ""),
        "precision": payload["precision"],
        "model": payload["model"],
        "inputs": [{k: v[k] for k in ("name", "dtype", "shape")} for v in payload["inputs"]],
        "outputs": [{k: v[k] for k in ("name", "dtype", "shape")} for v in payload["outputs"]],
        "kernels": [{k: kern.get(k) for k in KERNEL_KEYS} | {"registers_source": "ptxas"
                    if kern.get("registers") is not None else "unknown"} for kern in payload["kernels"]],
        "memory": {k: mem[k] for k in ("arena_bytes", "weights_bytes", "intermediate_bytes", "inplace")}
        | {"graph_intermediate_bytes": mem.get("graph_intermediate_bytes", 0)}
        | {"buffers": [{k: b[k] for k in ("name", "region", "offset", "nbytes")} for b in payload["buffers"]]},
        "rewrites": [d for d in payload["decisions"] if d.get("kind") == "rewrite"],
        "predicted_total_us": round(sum(k["predicted"]["time_us"] for k in payload["kernels"]), 3),
    }


def _fmt_params(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(p.items()))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _share(part: int, whole: int) -> str:
    return f" (the arena is {100 * part / whole:.0f}% of it)" if whole else ""


def _formula(p: dict[str, Any]) -> str:
    """The cost model's formula with this kernel's terms (planner/cost.py, planner/cost_wgmma.py)."""
    if "tiles_per_sm" in p:   # the persistent Hopper engine: per-SM tiles of k-blocks, each its slowest rate
        return (f"fill {p['t_pipeline_us']:.2f} + max(the busiest SM's {p['tiles_per_sm']:.0f} tiles: k-blocks at "
                f"max(tensor {p['t_compute_us']:.2f}, smem {p['t_smem_us']:.2f}, TMA {p['t_l2_us']:.2f}) + epilogues "
                f"{p['t_epilogue_us']:.2f}, dram {p['t_dram_us']:.2f}) + launch {p['launch_us']:.2f}; "
                f"waves {p['wave_eff']:.2f}, n_eff {p['n_eff']:.2f}")
    return (f"max(dram {p.get('t_dram_us', 0):.2f} + l2 {p.get('t_l2_us', 0):.2f}, "
            f"compute {p.get('t_compute_us', 0):.2f}, pipeline {p.get('t_pipeline_us', 0):.2f}) "
            f"/ (parallel {p.get('parallel_eff', 1):.2f} x waves {p.get('wave_eff', 1):.2f}) "
            f"+ launch {p.get('launch_us', 0):.2f}")


def explain_text(payload: dict[str, Any]) -> str:
    e = explain_json(payload)
    sig = lambda vs: ", ".join(f"{v['name']}: {v['dtype']}{v['shape']}" for v in vs)  # noqa: E731
    out = [
        f"bundle: model {e['model']['name']!r}, aicfc {e['compiler']['version']}, format v{e['format_version']}",
        f"target: {e['target']} ({e['target_name']}), precision {e['precision']}",
        f"inputs: {sig(e['inputs'])}",
        f"outputs: {sig(e['outputs'])}",
        f"{len(e['kernels'])} kernel(s), predicted total {e['predicted_total_us']} us",
        "",
    ]
    for k in e["kernels"]:
        p = k["predicted"]
        regs = f"{k['registers']} registers (ptxas)" if k["registers"] is not None else "registers unknown"
        out.append(f"{k['name']}  {k['family']}  covers ONNX nodes: {', '.join(k['onnx_nodes'])}")
        out.append(f"    stores {', '.join(k['stores'])}; properties: {', '.join(k['properties']) or 'none'}"
                   f"; rewrites: {', '.join(k['rewrites']) or 'none'}")
        out.append(f"    schedule {_fmt_params(k['params'])}  grid={k['grid']} block={k['block']} "
                   f"smem={k['smem_bytes']} B  {regs}")
        out.append(f"    predicted {p['time_us']:.2f} us = {_formula(p)};  {p['flops']:.3g} FLOP, {_bytes(p['bytes'])}")
        beaten = [c for c in k["candidates"] if "predicted_time_us" in c]
        rejected = [c for c in k["candidates"] if "rejected_because" in c]
        if beaten:
            checked = " (the leaders re-costed with ptxas's register counts)" if "registers_ptxas" in p else ""
            out.append(f"    why: lowest predicted time{checked}; it beat:")
            out += [f"      {_fmt_params(c['params'])}: {c['predicted_time_us']:.2f} us" for c in beaten]
        if rejected:
            out.append("    rejected by constraints:")
            out += [f"      {_fmt_params(c['params'])}: {c['rejected_because']}" for c in rejected]
        out.append("")
    m = e["memory"]
    out.append(f"memory: arena {_bytes(m['arena_bytes'])} (inputs, outputs and intermediates), "
               f"weights {_bytes(m['weights_bytes'])}")
    out.append(f"    one buffer per stored intermediate would take {_bytes(m['intermediate_bytes'])}"
               f"{_share(m['arena_bytes'], m['intermediate_bytes'])}")
    if m["graph_intermediate_bytes"]:
        out.append(f"    one buffer per ONNX intermediate tensor would take {_bytes(m['graph_intermediate_bytes'])}"
                   f"{_share(m['arena_bytes'], m['graph_intermediate_bytes'])}")
    out.append(f"    in-place decisions: {len(m['inplace'])}")
    for ip in m["inplace"]:
        out.append(f"      {ip['kernel']}: {ip['output']} written over {ip['reuses']} ({ip['reason']})")
    for b in m["buffers"]:
        out.append(f"    {b['name']:<24} {b['region']:<8} offset {b['offset']:>10}  {_bytes(b['nbytes'])}")
    out.append("")
    out.append("rewrites considered:")
    for r in e["rewrites"]:
        verdict = "applied " if r["applied"] else "declined"
        saved = f" (saves {_bytes(r['bytes_saved'])} of traffic)" if r["applied"] and r["bytes_saved"] else ""
        out.append(f"    {verdict} {r['rule']!r} on {r['target']}: {r['reason']}{saved}")
    return "\n".join(out) + "\n"
