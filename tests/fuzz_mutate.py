"""Mutations of valid seeds for the fuzz targets (tests/fuzz_harness.py): bytes, decoded msgpack
trees, protobuf (ONNX) messages.

Every mutation takes its decisions from a `Choices`, which has two sources:
- `RandomChoices` (a seeded `random.Random`): the long `make fuzz` run. Each decision costs
  about a microsecond, so an execution costs what the code under test costs.
- `DrawChoices` (hypothesis's `data.draw`): the short derandomized runs inside `make test`,
  where hypothesis shrinks a failure to its smallest decisions. Its draws and engine cost
  milliseconds per example (profiled: 3 of 5.5 ms per bundle_bytes example, 10 of 15 ms per
  bundle_tree one), which is why the long run does not use it.
One mutation code serves both, so the short runs test what the long run runs.
"""
from __future__ import annotations

import math
import random
import struct
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import msgpack
import onnx
from google.protobuf.descriptor import FieldDescriptor

T = TypeVar("T")

FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324,
          3.4028235e38, 1.17549435e-38, 65504.0, 2.0**53 + 1]


class Choices:
    """The decisions a mutation makes; subclasses give `integer`, `binary` and `text`."""

    def integer(self, low: int, high: int) -> int:
        raise NotImplementedError

    def binary(self, max_size: int) -> bytes:
        raise NotImplementedError

    def text(self, max_size: int) -> str:
        raise NotImplementedError

    def choice(self, items: Sequence[T]) -> T:
        return items[self.integer(0, len(items) - 1)]

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def floating(self, width: int = 64) -> float:
        if self.boolean():
            value = self.choice(FLOATS)
        else:   # any bit pattern: subnormals, NaN payloads, huge and tiny values
            bits = self.integer(0, 2**width - 1)
            value = struct.unpack("<f" if width == 32 else "<d",
                                  bits.to_bytes(width // 8, "little"))[0]
        if width == 32 and math.isfinite(value) and abs(value) > 3.4028235e38:
            value = math.copysign(math.inf, value)
        return value


class RandomChoices(Choices):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def binary(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))

    def text(self, max_size: int) -> str:
        rng = self.rng
        chars = []
        for _ in range(rng.randint(0, max_size)):
            code = rng.choice([rng.randint(32, 126), rng.randint(0, 0x7FF), rng.randint(0, 0x10FFFF)])
            chars.append(chr(code if not 0xD800 <= code <= 0xDFFF else 0xFFFD))
        return "".join(chars)


class DrawChoices(Choices):
    """Decisions drawn by hypothesis (`st.data()`), so a failure shrinks."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(self.st.integers(low, high))

    def binary(self, max_size: int) -> bytes:
        return self.data.draw(self.st.binary(max_size=max_size))

    def text(self, max_size: int) -> str:
        return self.data.draw(self.st.text(max_size=max_size))


# --- bytes ----------------------------------------------------------------------------------

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               2**63 - 1, 2**64 - 1]


def mutated_bytes(c: Choices, data: bytes, start: int = 0) -> bytes:
    """`data` with 1-8 edits at or after `start`: flips, overwrites with boundary integers
    (msgpack and protobuf lengths), insertions, deletions, duplicated spans, truncation."""
    buf = bytearray(data)
    for _ in range(c.integer(1, 8)):
        if len(buf) <= start:
            break
        pos = c.integer(start, len(buf) - 1)
        kind = c.choice(["flip", "byte", "int", "insert", "delete", "dup", "cut"])
        if kind == "flip":
            buf[pos] ^= 1 << c.integer(0, 7)
        elif kind == "byte":
            buf[pos] = c.integer(0, 255)
        elif kind == "int":
            width = c.choice([1, 2, 4, 8])
            value = c.choice(INTERESTING) % (1 << 8 * width)
            buf[pos:pos + width] = value.to_bytes(width, c.choice(["big", "little"]))
        elif kind == "insert":
            buf[pos:pos] = c.binary(16) or b"\0"
        elif kind == "delete":
            del buf[pos:pos + c.integer(1, 64)]
        elif kind == "dup":
            span = bytes(buf[pos:pos + c.integer(1, 64)])
            where = c.integer(start, len(buf))
            buf[where:where] = span
        else:
            del buf[pos:]
    return bytes(buf)


# --- msgpack trees --------------------------------------------------------------------------

BOUNDARY_INTS = [0, 1, -1, 2, 3, 255, 256, 1023, 1024, 1025, 65535, 65536, 2**31 - 1, 2**31,
                 2**32 - 1, 2**32, 2**40, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, -(2**31)]
WORDS = ["", "a", "float32", "float16", "bfloat16", "int64", "bool", "arena", "weights", "sm_90",
         "sm_90a", "sm_80", "fp16", "f16", "f32", "add", "time_us", "0" * 64, "x", "y", "../x"]


def random_value(c: Choices, depth: int = 2) -> Any:
    """Any msgpack value: boundary and arbitrary ints, floats, words the schema uses, text,
    bytes, and (while `depth` lasts) small lists and maps of those."""
    kind = c.integer(0, 9 if depth > 0 else 7)
    if kind == 0:
        return c.choice([None, True, False])
    if kind == 1:
        return c.choice(BOUNDARY_INTS)
    if kind == 2:
        return c.integer(-(2**63), 2**64 - 1)
    if kind == 3:
        return c.floating()
    if kind == 4:
        return c.choice(WORDS)
    if kind == 5:
        return c.text(12)
    if kind == 6:
        return c.binary(32)
    if kind == 7:
        return c.integer(-3, 300)
    if kind == 8:
        return [random_value(c, depth - 1) for _ in range(c.integer(0, 4))]
    return {_random_key(c): random_value(c, depth - 1) for _ in range(c.integer(0, 4))}


def _random_key(c: Choices) -> Any:
    return c.choice([lambda: c.choice(WORDS), lambda: c.text(6), lambda: c.integer(-2, 2)])()


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _walk(c: Choices, holder: list) -> tuple[Any, Any]:
    """(container, key) of a node of the tree in `holder[0]`, reached by a random descent that
    stops at each level with probability 1/4 (the root's holder counts as a level, so the whole
    payload can be replaced too). Costs the depth, not the size, of the tree."""
    parent, key = holder, 0
    while True:
        node = parent[key]
        if not isinstance(node, (dict, list)) or not node or c.integer(0, 3) == 0:
            return parent, key
        parent, key = node, c.choice(list(node) if isinstance(node, dict) else range(len(node)))


def mutated_tree(c: Choices, tree: Any) -> Any:
    """A deep copy of a decoded msgpack `tree` with 1-4 edits: values replaced (other types,
    boundary ints, nested containers), keys deleted or added, list items removed, repeated or
    multiplied (nested sizes), containers nested deeply, types changed."""
    holder = [msgpack.unpackb(msgpack.packb(tree, use_bin_type=True), raw=False, strict_map_key=False)]
    for _ in range(c.integer(1, 4)):
        if not holder:
            break
        parent, key = _walk(c, holder)
        value = parent[key]
        kind = c.choice(["replace", "replace", "tweak", "delete", "add", "grow", "deep", "retype"])
        if kind == "replace":
            parent[key] = random_value(c)
        elif kind == "tweak" and isinstance(value, int) and not isinstance(value, bool):
            new = c.choice([value + 1, value - 1, -value, value * 2**20, value * 2**33, 0])
            parent[key] = min(max(new, -(2**63)), 2**64 - 1)   # what msgpack can hold
        elif kind == "delete":
            del parent[key]
        elif kind == "add" and isinstance(value, dict):
            value[_random_key(c)] = random_value(c)
        elif kind == "grow" and isinstance(value, list) and value:
            # Nested sizes, bounded to about 256 kB packed so one execution stays fast (a 1 MB
            # bundle of 10 000 kernels took 2.5 s to read and explain). The copies share one
            # object, so this is the last edit: growing inside a grown list again would
            # multiply (execution 72290 of seed 1 packed to over 6 GB).
            size = len(msgpack.packb(value[0], use_bin_type=True))
            count = c.choice([1, 2, 100, 10_000])
            value.extend(value[:1] * max(1, min(count, (1 << 18) // size)))
            break
        elif kind == "deep":
            parent[key] = _deep(c.choice([10, 100, 400]))
        elif kind == "retype":
            if isinstance(value, str):
                parent[key] = value.encode()
            elif isinstance(value, bytes):
                parent[key] = value.decode("latin-1")
            elif isinstance(value, int) and not isinstance(value, bool):
                parent[key] = float(value)
            elif isinstance(value, dict):
                parent[key] = list(value.values())
            elif isinstance(value, list):
                parent[key] = dict(enumerate(value))
    return holder[0] if holder else None


# --- protobuf (ONNX) ------------------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
}
PROTO_INTS = [0, 1, -1, 2, 3, 7, 64, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, -(2**31), -(2**63),
              2**63 - 1]
PATHS = ["../outside.bin", "/etc/passwd", "weights.bin", "missing.bin", "sub/../../x", "",
         "weights.bin\0x", ".", "..", "a" * 300]


def _fields(msg: Any) -> Iterator[tuple[Any, Any, int | None]]:
    """Every (message, field, index) of a protobuf tree; index None for the whole field."""
    for fd in msg.DESCRIPTOR.fields:
        if fd.is_repeated:
            seq = getattr(msg, fd.name)
            yield msg, fd, None
            for i, item in enumerate(seq):
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    yield from _fields(item)
                else:
                    yield msg, fd, i
        else:
            yield msg, fd, None
            if fd.type == FieldDescriptor.TYPE_MESSAGE and msg.HasField(fd.name):
                yield from _fields(getattr(msg, fd.name))


def _scalar(c: Choices, fd: Any, names: list[str]) -> Any:
    if fd.type in _INT_RANGES:
        low, high = _INT_RANGES[fd.type]
        if c.boolean():
            return c.choice([v for v in PROTO_INTS if low <= v <= high])
        return c.integer(low, high) if c.boolean() else c.integer(max(low, -3), 100)
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return c.choice([v.number for v in fd.enum_type.values])
    if fd.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return c.floating(32 if fd.type == FieldDescriptor.TYPE_FLOAT else 64)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return c.boolean()
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return c.binary(64)
    return c.choice(names + PATHS) if c.boolean() else c.text(12)


def mutated_model(c: Choices, model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with 1-4 edits: any field (attributes, shapes, dtypes, names, so
    dangling inputs, opsets) set, cleared, repeated or removed; plus the edits a random walk
    rarely makes: huge or negative dims, external-data paths, a dangling node input."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    names = sorted({n for node in g.node for n in [*node.input, *node.output]}
                   | {t.name for t in g.initializer} | {"dangling"})
    for _ in range(c.integer(1, 4)):
        kind = c.choice(["field", "field", "field", "dim", "external", "dangling", "attribute",
                         "values", "dtype"])
        try:
            if kind == "attribute":
                _edit_attribute(c, g)
            elif kind == "values" and len(g.initializer):
                _edit_values(c, c.choice(list(g.initializer)))
            elif kind == "dtype":
                _edit_dtype(c, g)
            elif kind == "dim":
                values_info = [*g.input, *g.output, *g.value_info]
                dims = [d for v in values_info for d in v.type.tensor_type.shape.dim]
                if dims:
                    c.choice(dims).dim_value = c.choice([0, -1, 2**31, 2**40, 2**62])
            elif kind == "external" and len(g.initializer):
                tensor = c.choice(list(g.initializer))
                tensor.data_location = onnx.TensorProto.EXTERNAL
                tensor.ClearField("raw_data")
                del tensor.external_data[:]
                for key, value in [("location", c.choice(PATHS)),
                                   ("offset", c.choice(["0", "-1", "8", "x", str(2**40)])),
                                   ("length", c.choice(["4", "16", "-4", str(2**62)]))]:
                    if c.boolean() or key == "location":
                        entry = tensor.external_data.add()
                        entry.key, entry.value = key, value
            elif kind == "dangling" and len(g.node):
                node = c.choice(list(g.node))
                node.input.append(c.choice(["dangling", ""] + names))
            else:
                _edit_field(c, model, names)
        except (ValueError, TypeError, OverflowError):
            pass   # protobuf refused the value (out of range for the field); keep the model
    return model


def _edit_field(c: Choices, model: onnx.ModelProto, names: list[str]) -> None:
    msg, fd, index = c.choice(list(_fields(model)))
    if fd.is_repeated:
        seq = getattr(msg, fd.name)
        op = c.choice(["add", "remove", "set"] if len(seq) else ["add"])
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if op == "remove":
                del seq[c.integer(0, len(seq) - 1)]
            elif len(seq):
                seq.add().CopyFrom(seq[c.integer(0, len(seq) - 1)])
            else:
                seq.add()
        elif op == "remove":
            del seq[c.integer(0, len(seq) - 1)]
        elif op == "set" and index is not None:
            seq[index] = _scalar(c, fd, names)
        else:
            seq.append(_scalar(c, fd, names))
    elif fd.type == FieldDescriptor.TYPE_MESSAGE or c.integer(0, 4) == 0:
        msg.ClearField(fd.name)
    else:
        setattr(msg, fd.name, _scalar(c, fd, names))


ATTRIBUTE_INTS = [0, 1, -1, 2, -2, 3, 4, 7, 64, -64, 2**31 - 1, -(2**31), 2**62, -(2**63)]


def _edit_attribute(c: Choices, g: onnx.GraphProto) -> None:
    """A node attribute set to a boundary value of its own kind (axis, perm, pads, epsilon...),
    or to another kind, or removed: the values the random field walk reaches only rarely."""
    nodes = [n for n in g.node if len(n.attribute)]
    if not nodes:
        return
    node = c.choice(nodes)
    attr = node.attribute[c.integer(0, len(node.attribute) - 1)]
    how = c.choice(["value", "value", "value", "kind", "remove"])
    if how == "remove":
        node.attribute.remove(attr)
    elif how == "kind":
        attr.type = c.choice([v.number for v in onnx.AttributeProto.AttributeType.DESCRIPTOR.values])
    elif attr.type == onnx.AttributeProto.INT:
        attr.i = c.choice(ATTRIBUTE_INTS)
    elif attr.type == onnx.AttributeProto.INTS:
        values = list(attr.ints) or [0]
        op = c.choice(["set", "drop", "add"])
        if op == "set":
            values[c.integer(0, len(values) - 1)] = c.choice(ATTRIBUTE_INTS)
        elif op == "drop":
            values.pop()
        else:
            values.append(c.choice(ATTRIBUTE_INTS))
        attr.ClearField("ints")
        attr.ints.extend(values)
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = c.floating(32)
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = c.choice([b"", b"NOTSET", b"SAME_UPPER", b"VALID", b"tanh", b"none", c.binary(8)])


def _edit_values(c: Choices, tensor: onnx.TensorProto) -> None:
    """Elements of an initializer (a Reshape's shape, a Slice's ends, a weight) set to boundary
    values: shape arithmetic and constant folding meet them."""
    from onnx import numpy_helper
    import numpy as np
    try:
        array = numpy_helper.to_array(tensor).copy()
    except Exception:   # noqa: BLE001: already mutated past what numpy_helper reads
        return
    if not array.size:
        return
    flat = array.reshape(-1)
    for _ in range(c.integer(1, 3)):
        i = c.integer(0, flat.size - 1)
        if np.issubdtype(flat.dtype, np.integer):
            info = np.iinfo(flat.dtype)
            flat[i] = c.choice([0, -1, 1, 2, -2, int(info.max), int(info.min), 1 << 20])
        elif np.issubdtype(flat.dtype, np.floating):
            flat[i] = c.floating(32)
        elif flat.dtype == np.bool_:
            flat[i] = not flat[i]
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _edit_dtype(c: Choices, g: onnx.GraphProto) -> None:
    """An input's, output's or initializer's element type changed to another ONNX type."""
    types = [v.number for v in onnx.TensorProto.DataType.DESCRIPTOR.values]
    holders = [*g.input, *g.output, *g.value_info]
    if len(g.initializer) and c.boolean():
        c.choice(list(g.initializer)).data_type = c.choice(types)
    elif holders:
        c.choice(holders).type.tensor_type.elem_type = c.choice(types)
