"""Every convolution of an ONNX CNN timed alone through torch (cuDNN), beside aicf's kernel for it:
what the vendor's library reaches on issue 17's bars, measured the way `aicf-run --profile` measures
aicf's kernels (each launch repeated on inputs already in place, CUDA events).

    python3 benchmarks/cudnn_convs.py MODEL.onnx --bundle MODEL.aicf --inputs INPUTS.npz [--json OUT.json]
    python3 benchmarks/cudnn_convs.py MODEL.onnx --profile PROFILE.txt      # a profile taken before
    python3 benchmarks/cudnn_convs.py --replot OUT.json --plot convs.svg      # redraw a run's picture, no GPU

--plot FILE (.svg, .png or .pdf) draws each compared convolution's fraction of its bar, the vendor's beside
aicf's, against the line every one should clear: which side of it each lands on, at a glance.

With --bundle, aicf's kernels are profiled first in the same process (`Executor.profile()`, what
`aicf-run --profile` prints); --profile reads such a table instead. A Conv node is matched with the
kernel of the most FLOPs among those that name it. A projection shortcut whose GEMM aicf joins along k
into its block's last 1x1 is compared in that kernel, against the vendor's two convolutions, their
times, FLOPs and bytes added (`joins`).

For each Conv node, torch runs `F.conv2d` on channels-last tensors of the node's shapes with
`cudnn.benchmark` (cuDNN's fastest algorithm for that shape), and a 1x1 stride-1 one also as the cuBLAS
GEMM [N·H·W, C] x [C, OC] (the faster of the two is the vendor's figure), without the bias, BatchNorm,
ReLU, residual or pooling that aicf's kernel may fuse: the convolution alone, the most favourable case
for the vendor. (A bias through F.conv2d cost 95 us against 31 without on the 64->256 1x1 at 56x56, B32:
cuDNN adds it in a separate pass.) Its figures: GB/s over its own bytes (input, weight and output once)
and TFLOP/s (2·N·OH·OW·OC·(IC/groups)·KH·KW); its bar as in conv_profile_summary.py (memory-bound:
80% of the copy bandwidth, measured here as a 1 GiB device-to-device copy, gemv.copy_gbs; else 50% of
the tensor peak). Needs torch and onnx (the GPU machine); --replot needs matplotlib alone.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.conv_profile_summary import COMPUTE_BAR, MEMORY_BAR, bar, rows  # noqa: E402
from benchmarks.gemv import copy_gbs  # noqa: E402
from benchmarks.timing import torch_graph_us  # noqa: E402

REPEATS = 20     # launches in one captured graph (timing.torch_graph_us)
ROUNDS = 15      # graph replays; the median is the figure


def conv_nodes(model) -> list[dict]:
    """Each Conv node's name, shapes and attributes, in graph order."""
    import onnx
    from onnx import shape_inference
    model = shape_inference.infer_shapes(model)
    g = model.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(g.input) + list(g.value_info) + list(g.output)}
    inits = {t.name: tuple(t.dims) for t in g.initializer}
    out = []
    for n in g.node:
        if n.op_type != "Conv":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        w = inits.get(n.input[1])
        x = shapes.get(n.input[0])
        if w is None or not x or 0 in x:
            raise ValueError(f"conv {n.name}: its weight or input shape is unknown; export the model with its shapes")
        kh, kw = w[2], w[3]
        pads = list(a.get("pads", [0, 0, 0, 0]))
        out.append({"node": n.name, "x": x, "w": list(w), "bias": len(n.input) > 2 and bool(n.input[2]),
                    "stride": list(a.get("strides", [1, 1])), "pad": [pads[0], pads[1]],
                    "dilation": list(a.get("dilations", [1, 1])), "groups": int(a.get("group", 1)),
                    "kernel": [kh, kw]})
    return out


def measure(convs: list[dict], dtype: str) -> tuple[list[dict], float]:
    import torch
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = []
    for i, c in enumerate(convs):
        x = torch.randn(c["x"], generator=gen, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        w = (torch.randn(c["w"], generator=gen, device="cuda", dtype=dt) * 0.05).to(memory_format=torch.channels_last)

        def fn(x=x, w=w, c=c):
            return F.conv2d(x, w, None, c["stride"], c["pad"], c["dilation"], c["groups"])

        y = fn()
        n, oc, oh, ow = y.shape
        flops = 2 * n * oh * ow * oc * c["w"][1] * c["kernel"][0] * c["kernel"][1]
        nbytes = 2 * (x.numel() + w.numel() + y.numel())
        # F.conv2d has no out=: inside the capture each call takes its own output from the graph's private
        # pool (torch_graph_us asks for preallocated outputs; the matmul below keeps the same terms)
        us, lib = torch_graph_us(fn, REPEATS, ROUNDS), "cuDNN"
        if c["kernel"] == [1, 1] and c["stride"] == [1, 1] and c["groups"] == 1 and c["pad"] == [0, 0]:
            # a 1x1 convolution over channels-last pixels is the GEMM [N·H·W, C] x [C, OC]: cuBLAS too
            a = x.permute(0, 2, 3, 1).reshape(-1, c["x"][1])
            b = w.reshape(oc, -1).t()
            mm = torch_graph_us(lambda a=a, b=b: a @ b, REPEATS, ROUNDS)
            if mm < us:
                us, lib = mm, "cuBLAS"
        res.append(dict(c, out=list(y.shape), us=us, lib=lib, flops=flops, bytes=nbytes,
                        gbs=nbytes / us / 1e3, tflops=flops / us / 1e6))
        print(f"  [{i + 1}/{len(convs)}] {c['node']}: {us:.2f} us ({lib})", file=sys.stderr, flush=True)
    return res, copy_gbs()


def kernels_by_node(table: str) -> dict[str, dict]:
    """Each ONNX node of a profile table -> the row of the kernel of the most FLOPs that names it."""
    ours: dict[str, dict] = {}
    for r in rows(table):
        for node in r["nodes"].replace(",", " ").split():
            if node not in ours or r["tflops"] * r["meas"] > ours[node]["tflops"] * ours[node]["meas"]:
                ours[node] = r
    return ours


def kernel_flops(row: dict) -> float:
    return row["tflops"] * row["meas"] * 1e6


def joins(res: list[dict], ours: dict[str, dict]) -> dict[str, str]:
    """Conv node n -> conv node m whose aicf kernel also runs n's GEMM, joined along k (a projection
    shortcut with the block's last 1x1): the kernel that names n does less than half of n's FLOPs (it
    gathers n's strided input), m's output has n's shape (the two are added), and m's kernel does m's and
    n's FLOPs together, within 5%."""
    out = {}
    for r in res:
        o = ours.get(r["node"])
        if o is not None and kernel_flops(o) >= 0.5 * r["flops"]:
            continue
        for m in res:
            q = ours.get(m["node"])
            if m is not r and q is not None and m["out"] == r["out"] and \
                    abs(kernel_flops(q) - m["flops"] - r["flops"]) <= 0.05 * kernel_flops(q):
                out[r["node"]] = m["node"]
                break
    return out


def compare(res: list[dict], ours: dict[str, dict], copy: float, peak: float) -> tuple[list[str], dict]:
    """The table's lines and its tally. A convolution joined into another's kernel is compared there: the
    vendor's figure for that kernel is the two convolutions' times, FLOPs and bytes added."""
    joined = joins(res, ours)
    guests: dict[str, list[dict]] = {}
    for r in res:
        if r["node"] in joined:
            guests.setdefault(joined[r["node"]], []).append(r)
    tally = {"n": len(res), "joined": len(joined), "vendor": 0, "aicf": 0, "both_fail": 0,
             "vendor_us": 0.0, "aicf_us": 0.0}
    lines = []
    for r in res:
        shape = f"{r['x'][1]}x{r['x'][2]}x{r['x'][3]}->{r['out'][1]} k{r['kernel'][0]} s{r['stride'][0]}"
        if r["node"] in joined:
            host = ours[joined[r["node"]]]["kernel"]
            lines.append(f"{r['node']:>18} {shape:>28} {r['lib']:>6} | {r['us']:9.2f}   (its GEMM runs in {host} with "
                         f"{joined[r['node']]}: compared there)")
            continue
        group = [r] + guests.get(r["node"], [])
        us = sum(g["us"] for g in group)
        gbs = sum(g["bytes"] for g in group) / us / 1e3
        tflops = sum(g["flops"] for g in group) / us / 1e6
        vb, vf, vok = bar({"gbs": gbs, "tflops": tflops}, copy, peak)
        lib = "+".join(g["lib"] for g in group)
        line = (f"{r['node']:>18} {shape:>28} {lib:>6} | {us:9.2f} {vb:>7} {100 * vf:5.1f}% "
                f"{'yes' if vok else 'NO':>4} | ")
        r["vendor_bar"] = {"us": us, "bound": vb, "fraction": vf, "pass": vok, "with": [g["node"] for g in group[1:]]}
        tally["vendor"] += vok
        tally["vendor_us"] += us
        o = ours.get(r["node"])
        if o is None:
            lines.append(line + f"{'-':>6}")
            continue
        ob, of, ook = bar(o, copy, peak)
        r["aicf"] = {"kernel": o["kernel"], "us": o["meas"], "bound": ob, "fraction": of, "pass": ook}
        tally["aicf"] += ook
        tally["both_fail"] += (not ook) and (not vok)
        tally["aicf_us"] += o["meas"]
        lines.append(line + f"{o['kernel']:>6} {o['meas']:8.2f} {100 * of:5.1f}% {'yes' if ook else 'NO':>4} | "
                            f"{o['meas'] / us:11.2f}")
    return lines, tally


def plot(doc: dict, path: str, title: str) -> int:
    """Each compared convolution's fraction of its bar, the vendor's and aicf's side by side, into `path`
    (matplotlib's object-oriented API on its own canvas, written atomically: aicf_run/roofline.py's
    helpers). Returns how many convolutions it drew."""
    from aicf_run.roofline import _matplotlib, _save_atomically, check_path
    target = check_path(path)
    rows = [r for r in doc["convs"] if "aicf" in r and "vendor_bar" in r]
    FigureCanvasAgg, Figure = _matplotlib()
    fig = Figure(figsize=(max(8, 0.22 * len(rows) + 2), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = range(len(rows))
    def of_bar(b: dict) -> float:   # the fraction over the bar's own threshold: 100 is the bar
        return 100 * b["fraction"] / (MEMORY_BAR if b["bound"] == "memory" else COMPUTE_BAR)

    ax.bar([x - 0.2 for x in xs], [of_bar(r["vendor_bar"]) for r in rows], width=0.4,
           color="#9e9e9e", label="vendor (cuDNN / cuBLAS), the convolution alone")
    ax.bar([x + 0.2 for x in xs], [of_bar(r["aicf"]) for r in rows], width=0.4,
           color=["#2e7d32" if r["aicf"]["pass"] else "#c62828" for r in rows],
           label="aicf's kernel, with its epilogue (green: at its bar)")
    ax.axhline(100, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(list(xs), [r["aicf"]["kernel"] for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel("% of its bar: 50% of the tensor peak,\nor 80% of the copy bandwidth where memory-bound")
    ax.set_title(title, fontsize=10)
    top = max(max(of_bar(r["vendor_bar"]), of_bar(r["aicf"])) for r in rows) if rows else 100
    ax.set_ylim(0, 1.25 * max(top, 100))   # room above the bars for the legend
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    import matplotlib
    with matplotlib.rc_context({"svg.fonttype": "none"}):   # an SVG's text as text, not outlines
        _save_atomically(fig, target)
    return len(rows)


def aicf_profile(bundle: str, inputs: str) -> str:
    """`aicf-run BUNDLE --profile`'s table, measured in this process."""
    import numpy as np
    import aicf_run
    from aicf_run.profile import format_profile
    ex = aicf_run.load(bundle)
    with np.load(inputs, allow_pickle=False) as z:
        ex.run({k: z[k] for k in z.files})
    return format_profile(ex.profile())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("onnx", nargs="?")
    ap.add_argument("--bundle", help="the model's aicf bundle: profiled here, in the same process")
    ap.add_argument("--inputs",
                    help="with --bundle: the model's inputs (.npz, as benchmarks/export_case.py writes them)")
    ap.add_argument("--profile", help="instead of --bundle: an `aicf-run BUNDLE --profile` table of the same model")
    ap.add_argument("--json", default=None)
    ap.add_argument("--precision", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense fp16 tensor-core peak (sm_90)")
    ap.add_argument("--plot", help="draw each convolution's fraction of its bar into this file (.svg, .png, .pdf)")
    ap.add_argument("--replot", help="a --json file of an earlier run: draw its --plot, measure nothing")
    args = ap.parse_args(argv)
    if args.plot:
        from aicf_run.errors import RunError
        from aicf_run.roofline import check_path
        try:
            check_path(args.plot)
        except RunError as err:
            ap.error(str(err))
    if args.replot:
        if not args.plot:
            ap.error("--replot draws a picture: name it with --plot FILE")
        try:
            doc = json.loads(Path(args.replot).read_text())
        except (OSError, ValueError) as err:
            ap.error(f"--replot {args.replot}: not a JSON file of an earlier run ({err})")
        n = plot(doc, args.plot, f"{Path(args.replot).stem}: each convolution against its bar")
        print(f"wrote {args.plot}: {n} convolutions")
        return 0
    if args.onnx is None or not Path(args.onnx).is_file():
        ap.error(f"the ONNX model {args.onnx or ''} is needed and must exist (or --replot)")
    import onnx
    try:
        convs = conv_nodes(onnx.load(args.onnx, load_external_data=False))
    except ValueError as err:
        ap.error(str(err))
    if (args.bundle is None) == (args.profile is None):
        ap.error("give the bundle (--bundle) or its profile (--profile)")
    if args.bundle and not args.inputs:
        ap.error("--bundle needs the model's inputs (--inputs X.npz)")
    table = aicf_profile(args.bundle, args.inputs) if args.bundle else open(args.profile).read()
    if args.bundle:
        print(table)
    ours = kernels_by_node(table)
    res, cgbs = measure(convs, args.precision)
    print(f"copy bandwidth (1 GiB device-to-device, read + write): {cgbs:.0f} GB/s; "
          f"tensor peak {args.peak_tflops:.0f} TFLOP/s")
    print(f"{'node':>18} {'shape':>28} {'lib':>6} | {'vendor us':>9} {'bound':>7} {'of bar':>6} {'pass':>4} | "
          f"{'kernel':>6} {'aicf us':>8} "
          f"{'of bar':>6} {'pass':>4} | {'aicf/vendor':>11}")
    lines, tally = compare(res, ours, cgbs, args.peak_tflops)
    print("\n".join(lines))
    print(f"convolutions: {tally['n']}, {tally['joined']} of them run inside another's kernel (joined along k), so "
          f"{tally['n'] - tally['joined']} compared; at their bar: the vendor's alone {tally['vendor']}, "
          f"aicf {tally['aicf']} (with its fused epilogues); below it on both: {tally['both_fail']}; "
          f"sum of times: vendor {tally['vendor_us']:.1f} us, "
          f"aicf {tally['aicf_us']:.1f} us")
    doc = {"copy_gbs": cgbs, "peak_tflops": args.peak_tflops, "convs": res}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.plot:
        plot(doc, args.plot, f"{Path(args.onnx).stem}: each convolution against its bar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
