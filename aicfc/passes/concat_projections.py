"""concat_projections: two 1x1 convolutions summed into one are one convolution over the
concatenation of their inputs (part of canonicalize, after BatchNormalization folding and before
`conv_as_matmul`).

A bottleneck block with a projection shortcut ends in y = Conv1x1(h; W1, b1) + Conv1x1/s(x; W2, b2)
(ResNet: the block's last 1x1 and the downsampling projection, each with its BatchNormalization
folded). Both are sums over input channels at the output's own position, so

    W1·h + W2·x[.., ::s, ::s] = [W1 | W2]·Concat(h, x[.., ::s, ::s])   (channels concatenated)

and the sum is one 1x1 convolution of C1 + C2 input channels with bias b1 + b2, a GEMM whose
epilogue keeps whatever followed the Add (the ReLU). The property is `pointwise_window` on both
(every output reads one tap at its own position; a stride s subsamples the input first, which a
strided Slice states); the rewrite is rule CONCAT_PROJECTION_RULE.

    %a: f16[32,256,56,56] = Conv(%h, %w1, %b1) {kernel_shape=[1,1], strides=[1,1]}      h: 64 channels
    %d: f16[32,256,56,56] = Conv(%x, %w2, %b2) {kernel_shape=[1,1], strides=[1,1]}      x: 64 channels
    %y: f16[32,256,56,56] = Add(%a, %d)
  becomes
    %y.cat: f16[32,128,56,56] = Concat(%h, %x) {axis=1}
    %y: f16[32,256,56,56] = Conv(%y.cat, %y.w, %y.b)                                  [w1 | w2], b1 + b2

Cost: the pipeline decides each site by the planner's own predictions
(`passes/pipeline.decide_projections`): it plans the graph both ways up to the schedules and, per site,
sets the best predicted times of the kernels covering its ONNX nodes merged (the concatenation's copy,
none where the GEMM reads the concatenation by k-blocks: [Note: a concatenation read by k-blocks] in
passes/join_concat.py, and the merged GEMM) against apart (the projection and the 1x1 with the residual add in its epilogue).
In bytes (`bytes_saved`, recorded beside it): apart, the projection writes its M·N result and the add
reads it back; merged, the concatenation copies M·(C1 + C2) elements. At ResNet-50 B32's first block
that is a 51 MB result against a 25.7 MB copy of two 64-channel inputs; at its later stages the merged
GEMM's longer k-loop is what decides, and the planner keeps them apart. `--pin projection=0` /
`projection=1` overrides the decision (none / every legal site).

Legality (`match`): an Add of two Convs that nothing else reads and that are not graph outputs;
both 1x1, one group, no padding, unit dilation, constant weights (and biases); the first at unit
strides (its input has the output's spatial size); the second at any strides s whose subsample
x[.., ::s, ::s] has the output's spatial size; the same output shape and dtype.
"""
from __future__ import annotations

import math

import numpy as np

from aicfc.ir.high import Node, make_attrs
from aicfc.ir.ops import OPS
from aicfc.ir.types import Weight

PIN = "projection"   # --pin projection=0 keeps projections apart, projection=1 merges wherever legal, whatever the cost
CONCAT_PROJECTION_RULE = "Conv1x1(h) + Conv1x1/s(x) => Conv1x1(Concat(h, x[::s]))"
CONCAT_PROJECTION_REASON = ("pointwise_window on both: each output sums its input channels at its own position, so the sum "
                            "is one 1x1 convolution over the two inputs' channels concatenated (weights side by side, "
                            "biases added), and the projection's result is neither written nor read back")


def _pointwise(n: Node | None, wmap: dict[str, Weight], types: dict) -> bool:
    if n is None or n.op != "Conv" or n.inputs[1] not in wmap or not all(i in wmap for i in n.inputs[2:]):
        return False
    at = n.attr
    w = types[n.inputs[1]].shape
    return (len(w) == 4 and w[2:] == (1, 1) and at.get("group", 1) == 1 and not any(at.get("pads", ()))
            and all(d == 1 for d in at.get("dilations", (1, 1))))


def match(add: Node, producer: dict[str, Node], readers: dict[str, list[Node]], outputs: tuple[str, ...],
          wmap: dict[str, Weight], types: dict) -> tuple[Node, Node] | None:
    """(main, projection) when `add` sums two pointwise convolutions the rewrite may merge, the
    unit-stride one first; None otherwise (see the module docstring)."""
    if add.op != "Add" or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    convs = [producer.get(i) for i in add.inputs]
    if not all(_pointwise(c, wmap, types) for c in convs):
        return None
    for c in convs:
        if c.output in outputs or len(readers.get(c.output, [])) != 1:
            return None
    out = types[add.output]
    if any(types[c.output] != out for c in convs) or len(out.shape) != 4:
        return None
    unit = [c for c in convs if all(s == 1 for s in c.attr["strides"])]
    if not unit:
        return None
    main = unit[0]
    proj = convs[1] if main is convs[0] else convs[0]
    for c in (main, proj):
        xs = types[c.inputs[0]].shape
        sub = tuple(math.ceil(e / s) for e, s in zip(xs[2:], c.attr["strides"]))
        if xs[0] != out.shape[0] or sub != out.shape[2:]:
            return None
    return main, proj


def bytes_saved(main: Node, proj: Node, types: dict) -> int:
    """Bytes the merge saves (negative: costs): the projection's result written and read back, less the
    concatenation's copy of both inputs' channels, read and written (module docstring)."""
    out = types[main.output]
    pixels = out.numel // out.shape[1]
    c1, c2 = types[main.inputs[0]].shape[1], types[proj.inputs[0]].shape[1]
    return 2 * pixels * (out.shape[1] - c1 - c2) * out.nbytes // out.numel


def merged_sites(nodes) -> dict[str, frozenset[str]]:
    """The sites a canonical graph merged (the Add's output -> the ONNX nodes of the Add and both
    convolutions), from the Concat nodes this rewrite made."""
    return {n.attr["site"]: frozenset(n.attr["nodes"]) for n in nodes
            if n.op == "Concat" and n.attr.get("rule") == CONCAT_PROJECTION_RULE}


def rewrite(add: Node, main: Node, proj: Node, types: dict, wmap: dict[str, Weight], fresh,
            why: str) -> tuple[list[Node], list[Weight]]:
    """The nodes and weights that replace `add`, `main` and `proj` (`match` holds); `why` is the decision's
    text, recorded on the Concat with the site and its ONNX nodes (`merged_sites` reads them back)."""
    y = add.output
    dt = types[y].np_dtype
    origin = add.origin
    nodes: list[Node] = []

    def emit(op: str, inputs: tuple[str, ...], out: str, at: dict, origin: str = origin) -> str:
        t = OPS[op].infer([types[i] for i in inputs], at)
        types[out] = t
        nodes.append(Node(op, inputs, out, t, make_attrs(at), origin))
        return out

    x = proj.inputs[0]
    strides = tuple(proj.attr["strides"])
    if any(s != 1 for s in strides):
        xs = types[x].shape
        shape = xs[:2] + types[y].shape[2:]
        x = emit("Slice", (x,), fresh(f"{y}.sub"), {"shape": shape, "starts": (0, 0, 0, 0), "steps": (1, 1) + strides},
                 proj.origin)
    cat = emit("Concat", (main.inputs[0], x), fresh(f"{y}.cat"), {"axis": 1, "rule": CONCAT_PROJECTION_RULE, "why": why,
                                                                          "saved": bytes_saved(main, proj, types),
                                                                          "site": add.output,
                                                                          "nodes": (add.origin, main.origin, proj.origin)})

    def bias(c: Node) -> np.ndarray:
        return wmap[c.inputs[2]].array().astype(np.float64) if len(c.inputs) == 3 else 0.0

    w = np.concatenate([wmap[main.inputs[1]].array(), wmap[proj.inputs[1]].array()], axis=1)
    weights = [Weight.of(fresh(f"{y}.w"), w.astype(wmap[main.inputs[1]].type.np_dtype))]
    if len(main.inputs) == 3 or len(proj.inputs) == 3:
        # no bias where neither had one (an export that folded BatchNormalization with a zero shift): a zero
        # bias would be one more map between the GEMM and what follows it, which then stays a kernel of its own
        weights.append(Weight.of(fresh(f"{y}.b"), (bias(main) + bias(proj) + np.zeros(w.shape[0])).astype(dt)))
    for wt in weights:
        types[wt.name] = wt.type
        wmap[wt.name] = wt
    folded = [c.attr["folded"] for c in (main, proj) if "folded" in c.attr]
    at = {k: v for k, v in main.attr.items() if k != "folded"}
    if folded:
        at["folded"] = ",".join(folded)
    emit("Conv", (cat,) + tuple(wt.name for wt in weights), y, at, main.origin)
    return nodes, weights
