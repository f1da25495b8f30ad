"""`aicfc explain`: every decision in a bundle, from the bundle alone.

`explain_json` is the stable interface (docs/DESIGN's shape); `explain_text` renders it for
people: per kernel, what it covers, the schedule and why it won, and what it beat.
"""
from __future__ import annotations

from numbers import Real
from typing import Any

from aicf_run.schema import kernel_records, launch_records
from aicfc.errors import AicfError

KERNEL_KEYS = ("name", "symbol", "onnx_nodes", "family", "params", "grid", "block", "smem_bytes", "registers",
               "properties", "rewrites", "predicted", "candidates", "stores")
# The keys of the decision records explain passes on; a record's other keys (free-form in the
# format) are left out, so that the JSON view holds only what check_explainable checked.
CANDIDATE_KEYS = ("params", "predicted_time_us", "rejected_because")
INPLACE_KEYS = ("kernel", "output", "reuses", "reason")
REWRITE_KEYS = ("kind", "rule", "target", "applied", "reason", "bytes_saved")
# [Note: greedy feed] in codegen/greedy_feed.py: a decode plan's device-side greedy step
GREEDY_KEYS = ("argmax", "advance", "batch", "vocab", "vector", "log_rows", "max_stops", "nan", "ties", "reason")


def _only(record: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: record[k] for k in keys if k in record}


def _plan_gap(payload: dict[str, Any]) -> float:
    """What the plan adds to each kernel's predicted time (absent in profiles before it: 0)."""
    gap = payload["target"]["profile"].get("plan_gap_us", 0.0)
    return float(gap) if isinstance(gap, (int, float)) and 0 <= gap < 1e3 else 0.0


def explain_json(payload: dict[str, Any]) -> dict[str, Any]:
    """The stable JSON view of a bundle's payload (one that `aicf_run.bundle` validated)."""
    check_explainable(payload)
    mem = payload["memory"]
    gap = _plan_gap(payload)
    return {
        "format_version": payload["format_version"],
        "compiler": {k: payload["compiler"][k] for k in ("name", "version", "nvcc") if k in payload["compiler"]},
        "target": payload["target"]["arch"],
        "target_name": payload["target"]["profile"].get("name", ""),
        "precision": payload["precision"],
        "model": {k: payload["model"][k] for k in ("name", "source_sha256")},
        "inputs": [{k: v[k] for k in ("name", "dtype", "shape")} for v in payload["inputs"]],
        "outputs": [{k: v[k] for k in ("name", "dtype", "shape")} for v in payload["outputs"]],
        "kernels": [{k: kern.get(k) for k in KERNEL_KEYS} | {"stores": kern.get("stores", []),
                                                             "tensor_maps": _maps_in(kern),
                                                             "candidates": [_only(c, CANDIDATE_KEYS) for c in kern["candidates"]],
                                                             "registers_source": "ptxas"
                    if kern.get("registers") is not None else "unknown"}
                    # [Note: a gemv joined to the launch before it]: a kernel that runs in the launch of the one before
                    | ({"joined_into": kern["into"]} if "into" in kern else {})
                    for kern in kernel_records(payload["kernels"])],
        "memory": {k: mem[k] for k in ("arena_bytes", "weights_bytes", "intermediate_bytes", "inplace")}
        | {"graph_intermediate_bytes": mem.get("graph_intermediate_bytes", 0)}
        | {"buffers": [{k: b[k] for k in ("name", "region", "offset", "nbytes")} for b in payload["buffers"]]}
        | {"inplace": [_only(r, INPLACE_KEYS) for r in mem["inplace"]]},
        "rewrites": [_only(d, REWRITE_KEYS) for d in payload["decisions"] if d.get("kind") == "rewrite"],
        # [Note: state] tensors kept on the device across runs, updated in place (absent: none)
        "state": [{k: st[k] for k in ("name", "output", "dtype", "shape", "kernel", "write_bytes", "copy_bytes",
                                      "reason")} for st in payload.get("state", [])],
        # the kernels' predictions and the plan's gap between them ([Note: launch overhead and the plan gap])
        "predicted_total_us": round(sum(k["predicted"]["time_us"] for k in kernel_records(payload["kernels"]))
                                    + len(payload["kernels"]) * gap, 3),
        "plan_gap_us": gap,
        # [Note: PDL]: how the kernels follow each other (absent in bundles from before: "stream")
        "launch": {"mode": payload.get("launch", {}).get("mode", "stream"),
                   "reason": payload.get("launch", {}).get("reason", "")},
    } | ({"greedy": _only(payload["greedy"], GREEDY_KEYS)} if "greedy" in payload else {}) \
      | ({"timeline": True} if any("timeline" in k for k in payload["kernels"]) else {})   # [Note: timeline]


def _paths(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`kernel_records`, each with its path in the payload (kernels[3], kernels[3].joined[0])."""
    return [(f"kernels[{i}]" + (f".joined[{j - 1}]" if j else ""), r) for i, kern in enumerate(payload["kernels"])
            for j, r in enumerate(launch_records(kern))]


def check_explainable(payload: dict[str, Any]) -> None:
    """Raise AicfError naming the first field explain needs that the bundle lacks or mistypes.

    The runtime's schema (aicf_run/schema.py) checks what running needs; the decision records
    it leaves free-form (predicted costs, candidates, the decision log, in-place decisions) are
    checked here, so a damaged or foreign bundle gets one line instead of a KeyError.
    """
    name = payload["target"]["profile"].get("name", "")
    _want(isinstance(name, str), "target.profile.name", "a str", name)
    launch = payload.get("launch", {})
    _want(isinstance(launch, dict) and all(isinstance(launch.get(k, ""), str) for k in ("mode", "reason")),
          "launch", "a map with str mode and reason", launch)
    for where, kernel in _paths(payload):
        stores = kernel.get("stores", [])
        _want(isinstance(stores, list) and all(isinstance(s, str) for s in stores),
              f"{where}.stores", "a list of str", stores)
        for key, value in kernel["predicted"].items():
            _want(isinstance(key, str) and _number(value), f"{where}.predicted", "a map of str to numbers",
                  {key: value})
        for key in ("time_us", "flops", "bytes"):
            _want(key in kernel["predicted"], f"{where}.predicted.{key}", "a number", None)
        if "tiles_per_sm" in kernel["predicted"]:
            for key in ("t_pipeline_us", "t_compute_us", "t_smem_us", "t_l2_us", "t_epilogue_us",
                        "t_dram_us", "launch_us", "wave_eff", "n_eff"):
                _want(key in kernel["predicted"], f"{where}.predicted.{key}", "a number", None)
        for j, c in enumerate(kernel["candidates"]):
            params = c.get("params")
            _want(isinstance(params, dict) and all(isinstance(k, str) and isinstance(v, (int, str))
                                                    for k, v in params.items()),
                  f"{where}.candidates[{j}].params", "a map of str to int or str", params)
            if "predicted_time_us" in c:
                _want(_number(c["predicted_time_us"]), f"{where}.candidates[{j}].predicted_time_us",
                      "a number", c["predicted_time_us"])
            if "rejected_because" in c:
                _want(isinstance(c["rejected_because"], str), f"{where}.candidates[{j}].rejected_because",
                      "a str", c["rejected_because"])
    _want(_number(payload["memory"].get("graph_intermediate_bytes", 0)), "memory.graph_intermediate_bytes",
          "a number", payload["memory"].get("graph_intermediate_bytes"))
    for i, record in enumerate(payload["memory"]["inplace"]):
        for key in ("kernel", "output", "reuses", "reason"):
            _want(isinstance(record.get(key), str), f"memory.inplace[{i}].{key}", "a str", record.get(key))
    for i, record in enumerate(payload["decisions"]):
        if record.get("kind") != "rewrite":
            continue
        for key in ("rule", "target", "reason"):
            _want(isinstance(record.get(key), str), f"decisions[{i}].{key}", "a str", record.get(key))
        _want(isinstance(record.get("applied"), bool), f"decisions[{i}].applied", "a bool", record.get("applied"))
        _want(_number(record.get("bytes_saved", 0)), f"decisions[{i}].bytes_saved", "a number",
              record.get("bytes_saved"))


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _want(ok: bool, field: str, noun: str, value: Any) -> None:
    if not ok:
        shown = "it is missing" if value is None else f"got {type(value).__name__} {str(value)[:40]!r}"
        raise AicfError(f"bad bundle field {field}: must be {noun}, {shown}; recompile the model "
                        f"with `aicfc compile`")


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


def _kblocks(p: dict[str, Any]) -> str:
    """The Hopper engine's k-blocks: what they are charged and each rate that could bind them (cost_wgmma.py,
    cost_conv_wgmma.py), the binding one among them; a bundle from before t_kblocks_us shows the max of its rates."""
    rates = [("tensor", p["t_compute_us"]), ("smem", p["t_smem_us"]), ("TMA", p["t_l2_us"])]
    if p.get("t_gather_us"):
        # (a bundle from before the walk was named does not say which)
        rates.append(("im2col walk" if p.get("im2col_walk") else "gather issue" if "im2col_walk" in p else "A's gather",
                      p["t_gather_us"]))
    if p.get("t_gather_round_us"):
        rates.append(("gather round trips", p["t_gather_round_us"]))
    if p.get("t_latency_us"):
        rates.append(("TMA latency", p["t_latency_us"]))
    top = max(value for _, value in rates)
    charged = p.get("t_kblocks_us", top)
    pace = f" x pace {charged / top:.2f}" if top > 0 and charged > top * 1.01 else ""
    return f"k-blocks {charged:.2f} = max({', '.join(f'{name} {value:.2f}' for name, value in rates)}){pace}"


def _formula(p: dict[str, Any]) -> str:
    """The cost model's formula with this kernel's terms (planner/cost.py, cost_wgmma.py, cost_attention_wgmma.py,
    cost_gemv.py, cost_thin.py, cost_conv_stem.py)."""
    if "tiles_per_sm" in p:   # the persistent Hopper engine: per-SM tiles of k-blocks, each its slowest rate
        n = max(1.0, p["tiles_per_sm"])
        kb, epi, turn = p.get("t_kblocks_us", 0.0) / n, p["t_epilogue_us"] / n, p.get("consumers_in_turn", 0.0)
        if p.get("pingpong"):    # each tile's epilogue under the other warpgroup's k-blocks, the last one's exposed
            tiles = f"{_kblocks(p)}, ping-pong: {n:.0f} x max(k-blocks {kb:.2f}, epilogue {epi:.2f}) + the last epilogue {epi:.2f}"
        elif turn:               # the pool unit's consumers in turn (cost_conv_pool.py)
            tiles = (f"{_kblocks(p)}, {turn:.0f} warpgroups in turn: {n:.0f} x max(k-blocks {kb:.2f}, (tensor + "
                     f"epilogue) / {turn:.0f} {(p['t_compute_us'] / n + epi) / turn:.2f}) + the last epilogue {epi:.2f}")
        else:
            tiles = f"{_kblocks(p)} + epilogues {p['t_epilogue_us']:.2f}"
        return (f"fill {p['t_pipeline_us']:.2f} + max(the busiest SM's {p['tiles_per_sm']:.0f} tiles: {tiles}"
                + (f" + split reduce {p['t_reduce_us']:.2f}" if p.get("t_reduce_us") else "")
                + f", dram {p['t_dram_us']:.2f}"
                + (f", L2 {p['t_l2_all_us']:.2f}" if p.get("t_l2_all_us") else "") + ")"
                + (f" x pair in lockstep {p['lockstep']:.2f}" if p.get("lockstep", 1.0) > 1.0 else "")
                + (f" + cluster {p['t_cluster_us']:.2f}" if p.get("t_cluster_us") else "")
                + f" + launch {p['launch_us']:.2f}; "
                f"waves {p['wave_eff']:.2f}, n_eff {p['n_eff']:.2f}")
    if "t_combine_us" in p:  # split-KV attention (planner/cost_attention_split.py)
        merge = "the cluster's merge" if p.get("cluster_merge") else "the last block's combine"
        return (f"max(an SM's blocks {p['t_compute_us']:.2f} ({p['blocks']:.0f} blocks of {p['tiles_per_chunk']:.0f} "
                f"key tiles at {p['t_tile_us']:.3f}, fixed {p['t_pipeline_us']:.2f}) + {merge} "
                f"{p['t_combine_us']:.2f}, dram {p['t_dram_us']:.2f}) + launch {p['launch_us']:.2f}")
    if "t_tile_us" in p:     # wgmma attention: a schedule of blocks (planner/cost_attention_wgmma.py)
        return (f"latency + max(the blocks' schedule {p['t_compute_us']:.2f} ({p['key_tiles']:.0f} key tiles at "
                f"{p['t_tile_us']:.3f}: products {p['t_tc_tile_us']:.3f}, softmax {p['t_softmax_tile_us']:.3f}; "
                f"longest block {p['t_block_max_us']:.2f}, {p['blocks_per_sm']:.0f} a SM), dram {p['t_dram_us']:.2f}) "
                f"+ launch {p['launch_us']:.2f}")
    if "warp_slabs" in p:    # thin: a stream of A and the output (planner/cost_thin.py)
        return (f"fill {p['t_pipeline_us']:.2f} + max(dram {p['t_dram_us']:.2f}, issue {p['t_issue_us']:.2f}, "
                f"a warp's pace {p['t_warp_us']:.2f} ({p['warp_slabs']:.0f} slabs a warp, {p['blocks']:.0f} blocks, "
                f"{p['thin_waves']:.0f} wave(s))) + launch {p['launch_us']:.2f}")
    if "stem_rounds" in p:   # stem: a block an output tile (planner/cost_conv_stem.py)
        return (f"fill {p['t_pipeline_us']:.2f} + max(dram {p['t_dram_us']:.2f}, issue {p['t_issue_us']:.2f}, "
                f"a block slot's pace {p['t_block_us']:.2f} ({p['blocks']:.0f} blocks, {p['blocks_per_sm']:.0f} an SM, "
                f"{p['stem_rounds']:.0f} a slot)) + launch {p['launch_us']:.2f}")
    if "t_full_us" in p:     # gemv: a weight stream (planner/cost_gemv.py)
        ops = "tensor-core products" if p.get("tensor_cores") else "FMAs"
        return (f"max(stream {p['t_sm_us']:.2f} ({p['inflight_per_sm'] / 1024:.0f} KB in flight an SM, "
                f"{p['blocks']:.0f} blocks, the busiest SM {p['blocks_busiest_sm']:.0f}; asymptote {p['t_dram_us']:.2f}"
                + (f", {p['hot_bytes'] / 2**20:.1f} MiB of it in L2 already" if p.get("hot_bytes") else "")
                + (f", {p['landed_bytes'] / 2**20:.1f} MiB of it landed before the go" if p.get("landed_bytes") else "") + "), "
                f"{ops} {p['t_fma_us']:.2f}) "
                f"+ exposed {ops} {p['t_fma_exposed_us']:.2f} + later rounds {p['t_rounds_us']:.2f} "
                f"+ full grid {p['t_full_us']:.2f} + reduce {p['t_reduce_us']:.2f} + split {p['t_split_us']:.2f} "
                + (f"+ the norm's row scale {p['t_row_scale_us']:.2f} " if "t_row_scale_us" in p else "")
                + (f"+ the other role's publication and the activations' round trip {p['t_join_us']:.2f} "
                   if "t_join_us" in p else "")   # a gemv joined to the launch before it
                + f"+ launch {p['launch_us']:.2f}")
    body = (f"max(dram {p.get('t_dram_us', 0):.2f} + l2 {p.get('t_l2_us', 0):.2f}, "
            f"compute {p.get('t_compute_us', 0):.2f}, pipeline {p.get('t_pipeline_us', 0):.2f}) "
            f"/ (parallel {p.get('parallel_eff', 1):.2f} x waves {p.get('wave_eff', 1):.2f})")
    if "t_items_us" in p:    # pointwise: [Note: a pointwise thread's items in turn] in planner/cost.py
        body = f"max({body}, a thread's items in turn {p['t_items_us']:.2f})"
    return f"{body} + launch {p.get('launch_us', 0):.2f}"


def explain_text(payload: dict[str, Any]) -> str:
    e = explain_json(payload)
    sig = lambda vs: ", ".join(f"{v['name']}: {v['dtype']}{v['shape']}" for v in vs)  # noqa: E731
    out = [
        f"bundle: model {e['model']['name']!r}, aicfc {e['compiler']['version']}, format v{e['format_version']}"
        + (f"; kernels built by nvcc {e['compiler']['nvcc']!r}" if "nvcc" in e["compiler"] else ""),
        f"target: {e['target']} ({e['target_name']}), precision {e['precision']}",
        f"inputs: {sig(e['inputs'])}",
        f"outputs: {sig(e['outputs'])}",
        f"{len(e['kernels'])} kernel(s)"
        + (f" in {launched} launches" if (launched := sum("joined_into" not in k for k in e["kernels"])) < len(e["kernels"]) else "")
        + f", predicted total {e['predicted_total_us']} us"
        + (f" (the kernels' predictions + {e['plan_gap_us']} us a kernel between them)" if e["plan_gap_us"] else ""),
        f"launches: {e['launch']['mode']}" + (f" ({e['launch']['reason']})" if e["launch"]["reason"] else ""),
        *(["timeline: every kernel stamps when its blocks land, may start and leave (compiled with --timeline; "
           "aicf-run --timeline reads them)"] if e.get("timeline") else []),
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
        if "joined_into" in k:   # [Note: a gemv joined to the launch before it] in codegen/join.py
            out.append(f"    launch: none of its own; its blocks run in {k['joined_into']}'s launch, after that kernel's "
                       f"(passes/join_launches.py)")
        elif k["symbol"] != k["name"]:   # [Note: shared kernel code] in codegen/module.py
            out.append(f"    code: runs {k['symbol']}'s function (the same code but for its name and comments), built once")
        if k["tensor_maps"]:
            out.append(f"    tensor maps: {k['tensor_maps']}")
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
    if e["state"]:
        out.append(f"state: {len(e['state'])} tensor(s) kept on the device across runs, updated in place")
    for st in e["state"]:
        out.append(f"    {st['name']} -> {st['output']} {st['dtype']}{st['shape']}: {st['kernel']} writes "
                   f"{_bytes(st['write_bytes'])} per run instead of {_bytes(st['copy_bytes'])} for a copy; {st['reason']}")
    if "greedy" in e:
        g = e["greedy"]
        out.append(f"greedy feed: {g['argmax']['symbol']} grid={g['argmax']['grid']} block={g['argmax']['block']}, "
                   + (f"then {g['advance']['symbol']}; " if g['advance'] else "which also advances the inputs (one row); ")
                   + f"{g['reason']}; ties: {g['ties']}; {g['nan']}")
    out.append("")
    out.append("rewrites considered:")
    for r in e["rewrites"]:
        verdict = "applied " if r["applied"] else "declined"
        saved = f" (saves {_bytes(r['bytes_saved'])} of traffic)" if r["applied"] and r.get("bytes_saved") else ""
        out.append(f"    {verdict} {r['rule']!r} on {r['target']}: {r['reason']}{saved}")
    return "\n".join(out) + "\n"


def explain_plans_json(views: list[dict[str, Any]]) -> dict[str, Any]:
    """A bundle of several plans ([Note: plans] in aicf_run/plans.py), from each plan's view:
    the first plan's view at the top level (so the stable keys keep their meaning), and
    `plans`, every plan's with its `index`, `name` (its input shapes) and `shapes`."""
    from aicf_run.plans import plan_name
    plans = [{"index": i, "name": plan_name(v["inputs"]),
              "shapes": {t["name"]: list(t["shape"]) for t in v["inputs"]}, **explain_json(v)}
             for i, v in enumerate(views)]
    return {**explain_json(views[0]), "plans": plans}


def plan_summaries(e: dict[str, Any]) -> list[str]:
    """One line per plan of `explain_plans_json`'s result."""
    return [f"plan {p['index']}: {p['name']}: {len(p['kernels'])} kernel(s), predicted {p['predicted_total_us']} us, "
            f"arena {_bytes(p['memory']['arena_bytes'])}" for p in e["plans"]]


def explain_plans_text(views: list[dict[str, Any]], section_bytes: int) -> str:
    """Every plan's explanation in turn, after a summary line per plan."""
    e = explain_plans_json(views)
    out = [f"{len(views)} plans, one per set of input shapes, over one copy of the weights "
           f"({_bytes(section_bytes)} stored once; a {_bytes(e['memory']['weights_bytes'])} weights region "
           f"on the device, shared); aicf-run runs the plan whose input shapes equal the inputs'",
           *plan_summaries(e), ""]
    for p, view in zip(e["plans"], views):
        out.append(f"=== plan {p['index']} of {len(views)}: {p['name']} ===")
        out.append(explain_text(view))
    return "\n".join(out)


def _maps_in(kernel: dict) -> str:
    """Where a kernel's TMA maps live ([Note: TMA maps in constant memory] in codegen/tma.py)."""
    n = len(kernel.get("tensor_maps") or ())
    if not n:
        return ""
    if kernel.get("maps_symbol"):
        return f"{n} in constant memory ({kernel['maps_symbol']}), read without fences"
    return f"{n} in global memory, each fenced once a block (about 0.25 us each before the first copy)"
