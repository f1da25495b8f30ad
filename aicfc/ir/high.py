"""High IR: the operator graph with static shapes, dtypes and weights.

    graph mlp {
      input %x: f32[4,64]
      weight %w1: f32[64,128] sha256="9f2c..."
      %h: f32[4,128] = MatMul(%x, %w1) from "mm1"
      %y: f32[4,128] = Relu(%h) from "relu1"
      output %y
    }

Nodes keep `origin`, the ONNX node they came from, through every rewrite: it is how `explain`
maps kernels back to the user's model. Weight bytes are not in the text; `parse` takes them
as a table keyed by name (the bundle stores them beside the text).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from aicfc.errors import AicfError
from aicfc.ir import text
from aicfc.ir.ops import OPS, OpTypeError
from aicfc.ir.types import TensorType, Value, Weight


@dataclass(frozen=True, slots=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    output: str
    type: TensorType
    attrs: tuple[tuple[str, Any], ...] = ()
    origin: str = ""

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)


def make_attrs(d: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes as a sorted tuple (hashable, canonical); lists become tuples."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    inputs: tuple[Value, ...]
    weights: tuple[Weight, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]

    def replace(self, **changes: Any) -> Graph:
        """Like dataclasses.replace, but returns self when nothing changes."""
        new = dataclasses.replace(self, **changes)
        return self if new == self else new

    def types(self) -> dict[str, TensorType]:
        out = {v.name: v.type for v in self.inputs}
        out.update({w.name: w.type for w in self.weights})
        out.update({n.output: n.type for n in self.nodes})
        return out

    def weight_map(self) -> dict[str, Weight]:
        return {w.name: w for w in self.weights}

    def users(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def __str__(self) -> str:
        return print_graph(self)


def print_graph(g: Graph) -> str:
    lines = [f"graph {text.attr_value(g.name)} {{"]
    lines += [f"  input {text.name(v.name)}: {v.type}" for v in g.inputs]
    for w in g.weights:
        lines.append(f"  weight {text.name(w.name)}: {w.type} sha256=\"{w.sha256}\"")
    for n in g.nodes:
        args = ", ".join(text.name(i) for i in n.inputs)
        attrs = text.attrs(n.attrs)
        line = f"  {text.name(n.output)}: {n.type} = {n.op}({args})"
        line += f" {attrs}" if attrs else ""
        line += f" from {text.attr_value(n.origin)}" if n.origin else ""
        lines.append(line)
    lines += [f"  output {text.name(o)}" for o in g.outputs]
    lines.append("}")
    return "\n".join(lines) + "\n"


def parse_graph(source: str, weight_data: dict[str, bytes]) -> Graph:
    """Parse `print_graph` output; weight bytes come from `weight_data` and are checked by hash."""
    c = text.Cursor(source)
    c.expect("graph")
    name = str(c.attr_value())
    c.expect("{")
    inputs, weights, nodes, outputs = [], [], [], []
    while not c.accept("}"):
        if c.accept("input"):
            v = c.value()
            c.expect(":")
            inputs.append(Value(v, c.ttype()))
        elif c.accept("weight"):
            v = c.value()
            c.expect(":")
            t = c.ttype()
            c.expect("sha256")
            c.expect("=")
            digest = c.string()
            if v not in weight_data:
                raise AicfError(f"IR text: no data given for weight {v!r}")
            w = Weight(v, t, weight_data[v])
            if w.sha256 != digest or len(w.data) != t.nbytes:
                raise AicfError(f"IR text: data of weight {v!r} does not match its sha256")
            weights.append(w)
        elif c.accept("output"):
            outputs.append(c.value())
        else:
            out = c.value()
            c.expect(":")
            t = c.ttype()
            c.expect("=")
            op = c.ident()
            c.expect("(")
            args: list[str] = []
            while not c.accept(")"):
                args.append(c.value())
                if not c.accept(","):
                    c.expect(")")
                    break
            attrs = c.attrs()
            origin = str(c.attr_value()) if c.accept("from") else ""
            nodes.append(Node(op, tuple(args), out, t, make_attrs(attrs), origin))
    return Graph(name, tuple(inputs), tuple(weights), tuple(nodes), tuple(outputs))


def verify_graph(g: Graph) -> None:
    """Every use defined before it, names unique, every node's type equal to its op's type rule."""
    defined: dict[str, TensorType] = {}

    def define(name: str, t: TensorType, what: str) -> None:
        if name in defined:
            raise AicfError(f"High IR verifier: {what} {name!r} is defined twice")
        defined[name] = t

    for v in g.inputs:
        define(v.name, v.type, "input")
    for w in g.weights:
        if len(w.data) != w.type.nbytes:
            raise AicfError(f"High IR verifier: weight {w.name!r} holds {len(w.data)} bytes, its type needs {w.type.nbytes}")
        define(w.name, w.type, "weight")
    for n in g.nodes:
        where = f"High IR verifier: node {n.output!r} ({n.op}{' from ' + repr(n.origin) if n.origin else ''})"
        op = OPS.get(n.op)
        if op is None:
            raise AicfError(f"{where}: unknown op")
        lo, hi = op.arity
        if not lo <= len(n.inputs) <= hi:
            raise AicfError(f"{where}: takes {lo}..{hi} inputs, has {len(n.inputs)}")
        for i in n.inputs:
            if i not in defined:
                raise AicfError(f"{where}: input {i!r} is used before it is defined")
        try:
            expected = op.infer([defined[i] for i in n.inputs], n.attr)
        except (OpTypeError, KeyError) as e:
            raise AicfError(f"{where}: {e}") from None
        if expected != n.type:
            raise AicfError(f"{where}: type is {n.type}, its op gives {expected}")
        define(n.output, n.type, "value")
    for o in g.outputs:
        if o not in defined:
            raise AicfError(f"High IR verifier: output {o!r} is not defined")


def evaluate_graph(g: Graph, inputs: dict[str, np.ndarray], dtype: Any = None) -> dict[str, np.ndarray]:
    """Run the graph with numpy. `dtype=np.float64` evaluates in float64 (a reference)."""
    env: dict[str, np.ndarray] = {}
    for v in g.inputs:
        env[v.name] = np.asarray(inputs[v.name], dtype=dtype or v.type.np_dtype)
    for w in g.weights:
        a = w.array()
        env[w.name] = a.astype(dtype) if dtype is not None and a.dtype.kind == "f" else a
    for n in g.nodes:
        env[n.output] = np.asarray(OPS[n.op].evaluate([env[i] for i in n.inputs], n.attr))
    return {o: env[o] for o in g.outputs}
