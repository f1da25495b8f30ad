"""The payload schema of a version-1 or version-2 bundle, or of one plan of a version-3 bundle
(aicf_run/plans.py checks the rest): every check of docs/bundle-format.md.

`check_payload` walks the payload in document order and raises a one-line RunError naming the
first bad field by its path, e.g. "bad bundle field kernels[3].grid: ...". Types are checked
before values are used, so a malformed structure can never escape as a TypeError or KeyError.
Lists may be lists or tuples (the writer may hand tuples to msgpack; the reader gets lists).

Beyond the document, the CUDA launch limits every architecture shares (grid y/z <= 65535,
block x/y <= 1024 and z <= 64, 32-bit dynamic shared memory) are enforced here so a bundle that
passes cannot fail with an overflow deep inside the driver binding.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NoReturn

from aicf_run import tensormap
from aicf_run.convert import CONVERSIONS
from aicf_run.errors import RunError
from aicf_run.weights import Lazy, data_len, data_sha256

_RECOMPILE = "recompile the model with `aicfc compile`"
_ARCH = re.compile(r"sm_[0-9]{2,3}[af]?")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Element sizes of the dtypes a buffer may have. bfloat16 has no numpy dtype, so it may only
# appear on intermediate buffers, never on an input or output the user sees.
ITEMSIZE: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}
IO_DTYPES = frozenset(ITEMSIZE) - {"bfloat16"}
_MAX_SYMBOL = 256   # a kernel's constant array of tensor maps: a C identifier
_MAX_STAMPED = 4096  # blocks a kernel stamps under --timeline (aicfc/codegen/timeline.py CAP)
_MAX_PHASES = 8      # phase marks a kernel stamps (aicfc/codegen/timeline.py PHASES)
_MAX_PHASE_NAME = 40  # characters of a phase's name (aicfc/codegen/timeline.py LABEL_MAX)
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS = 1024


def check_payload(payload: Any, version: int, section_bytes: int | None = None,
                  digests: bool = True) -> None:
    """Raise RunError naming the first field of `payload` that breaks the schema of `version`.

    `section_bytes`: the length of the file's weights section (version 2), None for a payload
    in memory, whose weights are then all inline. `digests=False` skips hashing the inline
    weights (the writer checks them while it streams them to the file)."""
    if not isinstance(payload, dict):
        _fail("payload", f"must be a map, got {_describe(payload)}")
    format_version = _int(payload, "format_version", "")
    if format_version != version:
        _fail("format_version", f"is {format_version} but the header says {version}")
    compiler = _map(payload, "compiler", "")
    _str(compiler, "name", "compiler")
    _str(compiler, "version", "compiler")
    if "nvcc" in compiler:   # optional: bundles before session 74 lack it
        _str(compiler, "nvcc", "compiler")
    target = _map(payload, "target", "")
    _arch(target, "arch", "target")
    _map(target, "profile", "target")
    _str(payload, "precision", "")
    model = _map(payload, "model", "")
    _str(model, "name", "model")
    _sha256(model, "source_sha256", "model")

    memory = _map(payload, "memory", "")
    limits = {
        "arena": _int(memory, "arena_bytes", "memory", minimum=0),
        "weights": _int(memory, "weights_bytes", "memory", minimum=0),
    }
    if "state_bytes" in memory:   # [Note: state]; absent in bundles without state (and older ones)
        limits["state"] = _int(memory, "state_bytes", "memory", minimum=0)
    _int(memory, "intermediate_bytes", "memory", minimum=0)
    _records(memory, "inplace", "memory")

    buffers = _check_buffers(payload, limits)
    _check_io(payload, "inputs", buffers)
    _check_io(payload, "outputs", buffers)
    _check_state(payload, buffers)
    _check_weights(payload, buffers, version, section_bytes, digests)
    module_count = _check_modules(payload)
    _check_casts(payload, module_count, buffers)
    _check_kernels(payload, module_count, buffers)

    ir = _map(payload, "ir", "")
    for key in ("high", "lowered", "decision"):
        _str(ir, key, "ir")
    _records(payload, "decisions", "")


def _check_buffers(payload: dict, limits: dict[str, int]) -> list[dict]:
    buffers: list[dict] = []
    for where, buf in _records(payload, "buffers", ""):
        index = len(buffers)
        buffer_id = _int(buf, "id", where)
        if buffer_id != index:
            _fail(f"{where}.id", f"is {buffer_id}, expected {index} (ids are 0..n-1 in order)")
        _str(buf, "name", where)
        region = _str(buf, "region", where)
        if region not in limits:
            _fail(f"{where}.region", f"is {region!r}, expected one of {sorted(limits)}")
        offset = _int(buf, "offset", where, minimum=0)
        nbytes = _int(buf, "nbytes", where, minimum=0)
        dtype, shape = _tensor_type(buf, where, ITEMSIZE)
        needed = math.prod(shape) * ITEMSIZE[dtype]
        if nbytes != needed:
            _fail(f"{where}.nbytes", f"is {nbytes} but {dtype} {shape} needs {needed}")
        if offset + nbytes > limits[region]:
            _fail(where, f"offset {offset} + nbytes {nbytes} exceeds "
                         f"memory.{region}_bytes = {limits[region]}")
        buffers.append(buf)
    return buffers


def _check_io(payload: dict, key: str, buffers: list[dict]) -> None:
    names: set[str] = set()
    for where, item in _records(payload, key, ""):
        name = _str(item, "name", where)
        if not name or name in names:
            _fail(f"{where}.name", f"{name!r} is empty or repeated")
        names.add(name)
        dtype, shape = _tensor_type(item, where, IO_DTYPES)
        buffer_id = _buffer_ref(item, "buffer", where, len(buffers))
        buf = buffers[buffer_id]
        if buf["region"] != "arena":
            _fail(f"{where}.buffer", f"buffer {buffer_id} is in the weights region; "
                                     f"inputs and outputs live in the arena")
        if buf["dtype"] != dtype and (dtype, buf["dtype"]) not in CONVERSIONS:
            _fail(f"{where}.dtype", f"is {dtype}, but buffer {buffer_id} holds {buf['dtype']} "
                                    f"and aicf-run cannot convert between them")
        if list(buf["shape"]) != list(shape):
            _fail(where, f"shape {shape} differs from buffer {buffer_id}'s {buf['shape']}")


def _check_state(payload: dict, buffers: list[dict]) -> None:
    """[Note: state] each record names one buffer of the state region, read as the input and
    written as the output (the same bytes), of the record's dtype and shape."""
    if "state" not in payload:
        return
    names: set[str] = set()
    for where, item in _records(payload, "state", ""):
        name = _str(item, "name", where)
        if not name or name in names:
            _fail(f"{where}.name", f"{name!r} is empty or repeated")
        names.add(name)
        for key in ("output", "kernel", "reason"):
            _str(item, key, where)
        _int(item, "write_bytes", where, minimum=0)
        _int(item, "copy_bytes", where, minimum=0)
        dtype, shape = _tensor_type(item, where, ITEMSIZE)
        first = buffers[_buffer_ref(item, "buffer", where, len(buffers))]
        second = buffers[_buffer_ref(item, "output_buffer", where, len(buffers))]
        for buf in (first, second):
            if buf["region"] != "state" or buf["dtype"] != dtype or list(buf["shape"]) != list(shape):
                _fail(where, f"buffer {buf['id']} is not a state buffer of {dtype} {shape}")
        if first["offset"] != second["offset"]:
            _fail(where, "its input and output buffers are not the same bytes")


def _check_weights(payload: dict, buffers: list[dict], version: int, section_bytes: int | None,
                   digests: bool) -> None:
    """Each weights buffer has one entry: inline `data`, or (version 2) `offset` and `nbytes`
    in the weights section, where the entries lie end to end in order and fill it exactly."""
    seen: set[int] = set()
    end = 0
    for where, weight in _records(payload, "weights", ""):
        buffer_id = _buffer_ref(weight, "buffer", where, len(buffers))
        buf = buffers[buffer_id]
        if buf["region"] != "weights":
            _fail(f"{where}.buffer", f"buffer {buffer_id} is not in the weights region")
        if buffer_id in seen:
            _fail(f"{where}.buffer", f"buffer {buffer_id} already has a weights entry")
        seen.add(buffer_id)
        digest = _sha256(weight, "sha256", where)
        if "data" in weight or version < 2:
            data = _typed(weight, "data", where, (bytes, bytearray, memoryview, Lazy), "bytes (msgpack bin)")
            if data_len(data) != buf["nbytes"]:
                _fail(f"{where}.data", f"is {data_len(data)} bytes but buffer {buffer_id} "
                                       f"has nbytes {buf['nbytes']}")
            if digests and data_sha256(data) != digest:
                _fail(f"{where}.sha256", "does not match its data; the file is corrupt")
            continue
        if section_bytes is None:
            _fail(f"{where}.data", "is missing (a payload in memory holds its weights inline)")
        offset = _int(weight, "offset", where, minimum=0)
        if offset != end and version < 3:   # version 3: blobs of the section ([Note: plans])
            _fail(f"{where}.offset", f"is {offset}, expected {end} (section weights lie end to "
                                     f"end in order)")
        nbytes = _int(weight, "nbytes", where, minimum=0)
        if nbytes != buf["nbytes"]:
            _fail(f"{where}.nbytes", f"is {nbytes} but buffer {buffer_id} has nbytes {buf['nbytes']}")
        end = offset + nbytes
        if end > section_bytes:
            _fail(where, f"ends at byte {end} of the weights section, which has {section_bytes}")
    if section_bytes is not None and end != section_bytes and version < 3:
        _fail("weights", f"fill {end} bytes of the {section_bytes}-byte weights section; the "
                         f"file is corrupt")
    for buf in buffers:
        if buf["region"] == "weights" and buf["id"] not in seen:
            _fail(f"buffers[{buf['id']}]", "is a weights buffer with no entry in weights")


def _check_modules(payload: dict) -> int:
    count = 0
    for where, module in _records(payload, "modules", ""):
        _str(module, "name", where)
        _arch(module, "arch", where)
        cubin = _bytes(module, "cubin", where)
        if hashlib.sha256(cubin).hexdigest() != _sha256(module, "cubin_sha256", where):
            _fail(f"{where}.cubin_sha256", "does not match its cubin; the file is corrupt")
        _sha256(module, "source_sha256", where)
        _str(module, "source", where)
        count += 1
    return count


CAST_KEYS = ("module", "symbol", "grid", "block")
LAUNCH_MODES = ("dependent", "stream")


def _check_casts(payload: dict, module_count: int, buffers: list[dict]) -> None:
    """The optional `cast` of a converted input or output: the GPU kernel converting it
    (aicfc/codegen/io_cast.py). Bundles from before it have none and convert on the host."""
    for key in ("inputs", "outputs"):
        for where, item in _records(payload, key, ""):
            if "cast" not in item:
                continue
            cast = _map(item, "cast", where)
            where = f"{where}.cast"
            extra = sorted(str(k) for k in cast if k not in CAST_KEYS)
            if extra:
                _fail(where, f"has unknown keys {extra}; a cast has exactly {', '.join(CAST_KEYS)}")
            if item["dtype"] == buffers[item["buffer"]]["dtype"]:
                _fail(where, f"converts nothing: the tensor and buffer {item['buffer']} are both "
                             f"{item['dtype']}")
            module = _int(cast, "module", where, minimum=0)
            if module >= module_count:
                _fail(f"{where}.module", f"is {module}, but there are {module_count} modules")
            if not _str(cast, "symbol", where):
                _fail(f"{where}.symbol", "is empty")
            _dims(cast, "grid", where, _MAX_GRID)
            block = _dims(cast, "block", where, _MAX_BLOCK)
            if math.prod(block) > _MAX_THREADS:
                _fail(f"{where}.block", f"{block} is {math.prod(block)} threads, over {_MAX_THREADS}")


def launch_records(kernel: dict) -> list[dict]:
    """A launch's kernel records: its own, then those its `joined` list says run in it ([Note: a gemv joined to the
    launch before it] in aicfc/codegen/join.py)."""
    return [kernel, *kernel.get("joined", [])]


def kernel_records(kernels: list[dict]) -> list[dict]:
    """Every kernel record of a payload's `kernels` (its launches), in the order they run."""
    return [r for k in kernels for r in launch_records(k)]


def _check_kernels(payload: dict, module_count: int, buffers: list[dict]) -> None:
    for where, kernel in _records(payload, "kernels", ""):
        _check_kernel(kernel, where, module_count, buffers)
        if "joined" in kernel:   # optional: [Note: a gemv joined to the launch before it] (aicfc/codegen/join.py)
            for joined_where, record in _records(kernel, "joined", where):
                _check_kernel(record, joined_where, module_count, buffers)
                if record.get("into") != kernel["name"]:
                    _fail(f"{joined_where}.into", f"{_describe(record.get('into'))} is not the launch's kernel "
                                                  f"{kernel['name']!r}")


def _check_kernel(kernel: dict, where: str, module_count: int, buffers: list[dict]) -> None:
    """One kernel record: a launch of `kernels`, or a kernel its `joined` list says runs in that launch."""
    buffer_count = len(buffers)
    _str(kernel, "name", where)
    module = _int(kernel, "module", where, minimum=0)
    if module >= module_count:
        _fail(f"{where}.module", f"is {module}, but there are {module_count} modules")
    if not _str(kernel, "symbol", where):
        _fail(f"{where}.symbol", "is empty")
    _str(kernel, "family", where)
    for key, value in _map(kernel, "params", where).items():
        if not isinstance(key, str) or not (_is_int(value) or isinstance(value, str)):
            _fail(f"{where}.params", f"entry {key!r}: {_describe(value)} must map a str "
                                     f"to an int or a str")
    _dims(kernel, "grid", where, _MAX_GRID)
    block = _dims(kernel, "block", where, _MAX_BLOCK)
    if math.prod(block) > _MAX_THREADS:
        _fail(f"{where}.block", f"{block} is {math.prod(block)} threads, over {_MAX_THREADS}")
    _int(kernel, "smem_bytes", where, minimum=0, maximum=2**31 - 1)
    # optional: bundles from before dependent launches ([Note: PDL]) launch every kernel plainly
    if kernel.get("launch", "stream") not in LAUNCH_MODES:
        _fail(f"{where}.launch", f"{_describe(kernel['launch'])} is not one of {', '.join(LAUNCH_MODES)}")
    registers = _get(kernel, "registers", where)
    if registers is not None and not _is_int(registers):
        _fail(f"{where}.registers", f"must be an int or nil, got {_describe(registers)}")
    for i, arg in enumerate(_list(kernel, "args", where)):
        if not _is_int(arg) or not 0 <= arg < buffer_count:
            _fail(f"{where}.args[{i}]", f"{_describe(arg)} is not a buffer id "
                                        f"(0..{buffer_count - 1})")
    for key in ("onnx_nodes", "properties", "rewrites"):
        for i, text in enumerate(_list(kernel, key, where)):
            if not isinstance(text, str):
                _fail(f"{where}.{key}[{i}]", f"must be a str, got {_describe(text)}")
    _map(kernel, "predicted", where)
    _records(kernel, "candidates", where)
    if "tensor_maps" in kernel:   # optional: bundles from before TMA kernels have none
        for map_where, record in _records(kernel, "tensor_maps", where):
            _check_tensor_map(record, map_where, buffers)
    if "maps_symbol" in kernel:   # optional: [Note: TMA maps in constant memory] (aicfc/codegen/tma.py)
        _check_symbol(_str(kernel, "maps_symbol", where), f"{where}.maps_symbol")
        if not kernel.get("tensor_maps"):
            _fail(f"{where}.maps_symbol", "names a constant array, but the kernel has no tensor_maps")
    if "trigger_from" in kernel:   # optional: [Note: PDL] (aicfc/codegen/pdl.py), the first block that triggers
        _int(kernel, "trigger_from", where, minimum=0, maximum=2**31 - 1)
    if "timeline" in kernel:   # optional: [Note: timeline] (aicfc/codegen/timeline.py), aicfc compile --timeline
        stamps = _map(kernel, "timeline", where)
        _check_symbol(_str(stamps, "symbol", f"{where}.timeline"), f"{where}.timeline.symbol")
        blocks = _int(stamps, "blocks", f"{where}.timeline", minimum=1, maximum=_MAX_STAMPED)
        if blocks > math.prod(kernel["grid"]):
            _fail(f"{where}.timeline.blocks", f"is {blocks}, more than the kernel's {math.prod(kernel['grid'])} blocks")
        count = _int(stamps, "stamps", f"{where}.timeline", minimum=3, maximum=3 + _MAX_PHASES)
        if "phases" in stamps:   # optional: the names of the kernel's phase marks, by index
            phases = _list(stamps, "phases", f"{where}.timeline")
            if len(phases) > count - 3:
                _fail(f"{where}.timeline.phases", f"names {len(phases)} phases, more than the {count - 3} stamped")
            for i, name in enumerate(phases):
                if not isinstance(name, str) or len(name) > _MAX_PHASE_NAME:
                    _fail(f"{where}.timeline.phases[{i}]", f"is not a str of at most {_MAX_PHASE_NAME} characters")


def _check_symbol(symbol: str, where: str) -> None:
    """A name the runtime looks up in a module: a C identifier of at most _MAX_SYMBOL characters."""
    if not (0 < len(symbol) <= _MAX_SYMBOL and symbol.isidentifier() and symbol.isascii()):
        _fail(where, f"{_describe(symbol)} is not a C identifier of at most {_MAX_SYMBOL} characters")


def _check_tensor_map(record: dict, where: str, buffers: list[dict]) -> None:
    """One [Note: TMA record] (aicfc/codegen/tma.py): the driver's rules for
    cuTensorMapEncodeTiled, and every element the map spans inside its buffer."""
    extra = sorted(str(key) for key in record if key not in tensormap.KEYS + (tensormap.IM2COL,))
    if extra:
        _fail(where, f"has unknown keys {extra}; a tensor map has exactly "
                     f"{', '.join(tensormap.KEYS)} (and optionally {tensormap.IM2COL})")
    buffer_id = _buffer_ref(record, "buffer", where, len(buffers))
    buf = buffers[buffer_id]
    dtype = _str(record, "dtype", where)
    if dtype not in tensormap.DATA_TYPES:
        _fail(f"{where}.dtype", f"{dtype!r} is not one of {', '.join(tensormap.DATA_TYPES)}")
    if buf["dtype"] != tensormap.BUFFER_DTYPES[dtype]:
        _fail(f"{where}.dtype", f"is {dtype}, but buffer {buffer_id} holds {buf['dtype']}")
    esize = tensormap.DATA_TYPES[dtype][1]
    offset = _int(record, "offset", where, minimum=0)
    dims = _int_list(record, "dims", where, 1, tensormap.MAX_DIM, range(1, tensormap.MAX_RANK + 1))
    box = _int_list(record, "box", where, 1, tensormap.MAX_BOX, (len(dims),))
    strides = _int_list(record, "strides", where, 1, tensormap.MAX_STRIDE - 1, (len(dims) - 1,))
    for i, stride in enumerate(strides):
        if stride % 16:
            _fail(f"{where}.strides[{i}]", f"is {stride} bytes, not a multiple of 16 (TMA)")
    swizzle = _int(record, "swizzle", where)
    if swizzle not in tensormap.SWIZZLES:
        _fail(f"{where}.swizzle", f"is {swizzle}, not one of "
                                  f"{', '.join(map(str, tensormap.SWIZZLES))} (bytes)")
    inner = box[0] * esize
    if inner % 16 or (swizzle and inner > swizzle):
        _fail(f"{where}.box", f"inner box of {inner} bytes must be a multiple of 16"
                              + (f" and at most the {swizzle}-byte swizzle" if swizzle else ""))
    if tensormap.IM2COL in record:
        why = tensormap.im2col_problem(record[tensormap.IM2COL], len(dims), box)
        if why:
            _fail(f"{where}.{tensormap.IM2COL}", why)
    start = buf["offset"] + offset * esize   # region bases are 256-byte aligned
    if start % tensormap.ADDRESS_ALIGN:
        _fail(f"{where}.offset", f"element {offset} of buffer {buffer_id} is at byte {start} of "
                                 f"the {buf['region']}, not {tensormap.ADDRESS_ALIGN}-byte aligned")
    # The last element the map spans, (dims[0]-1, ..., dims[r-1]-1), must end inside the buffer.
    end = (offset + dims[0]) * esize + sum((d - 1) * s for d, s in zip(dims[1:], strides))
    if end > buf["nbytes"]:
        _fail(where, f"spans bytes up to {end} of buffer {buffer_id}, which has "
                     f"{buf['nbytes']} (dims {dims}, strides {strides}, offset {offset})")


# --- field helpers: each returns the checked value or raises naming `where.key` ---


def _fail(field: str, problem: str) -> NoReturn:
    raise RunError(f"bad bundle field {field}: {problem}; {_RECOMPILE}")


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _describe(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, str, list, tuple, dict)) and len(value) > 8:
        return f"a {type(value).__name__} of length {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        _fail(_path(where, key), "is missing")
    return obj[key]


def _typed(obj: dict, key: str, where: str, kind: type | tuple[type, ...], noun: str) -> Any:
    value = _get(obj, key, where)
    if not isinstance(value, kind) or isinstance(value, bool):
        _fail(_path(where, key), f"must be {noun}, got {_describe(value)}")
    return value


def _map(obj: dict, key: str, where: str) -> dict:
    return _typed(obj, key, where, dict, "a map")


def _list(obj: dict, key: str, where: str) -> list | tuple:
    return _typed(obj, key, where, (list, tuple), "a list")


def _str(obj: dict, key: str, where: str) -> str:
    return _typed(obj, key, where, str, "a str")


def _bytes(obj: dict, key: str, where: str) -> bytes:
    return _typed(obj, key, where, (bytes, bytearray), "bytes (msgpack bin)")


def _int(obj: dict, key: str, where: str, minimum: int | None = None,
         maximum: int | None = None) -> int:
    value = _typed(obj, key, where, int, "an int")
    if minimum is not None and value < minimum:
        _fail(_path(where, key), f"is {value}, below {minimum}")
    if maximum is not None and value > maximum:
        _fail(_path(where, key), f"is {value}, above {maximum}")
    return value


def _records(obj: dict, key: str, where: str) -> list[tuple[str, dict]]:
    """A list of maps, each paired with its path, e.g. ("kernels[3]", {...})."""
    records = []
    for i, item in enumerate(_list(obj, key, where)):
        item_path = f"{_path(where, key)}[{i}]"
        if not isinstance(item, dict):
            _fail(item_path, f"must be a map, got {_describe(item)}")
        records.append((item_path, item))
    return records


def _arch(obj: dict, key: str, where: str) -> str:
    arch = _str(obj, key, where)
    if not _ARCH.fullmatch(arch):
        _fail(_path(where, key), f"{arch!r} is not an architecture like 'sm_90'")
    return arch


def _sha256(obj: dict, key: str, where: str) -> str:
    digest = _str(obj, key, where)
    if not _SHA256_HEX.fullmatch(digest):
        _fail(_path(where, key), "must be 64 lowercase hex digits")
    return digest


def _tensor_type(obj: dict, where: str, dtypes: frozenset[str] | dict) -> tuple[str, list[int]]:
    dtype = _str(obj, "dtype", where)
    if dtype not in dtypes:
        _fail(f"{where}.dtype", f"{dtype!r} is not one of {', '.join(sorted(dtypes))}")
    shape = list(_list(obj, "shape", where))
    if not all(_is_int(dim) and dim >= 0 for dim in shape):
        _fail(f"{where}.shape", f"{_describe(shape)} must be non-negative ints")
    return dtype, shape


def _buffer_ref(obj: dict, key: str, where: str, buffer_count: int) -> int:
    buffer_id = _int(obj, key, where)
    if not 0 <= buffer_id < buffer_count:
        _fail(_path(where, key), f"{buffer_id} is not a buffer id (0..{buffer_count - 1})")
    return buffer_id


def _int_list(obj: dict, key: str, where: str, low: int, high: int,
              lengths: range | tuple[int, ...]) -> list[int]:
    values = list(_list(obj, key, where))
    if len(values) not in lengths:
        expected = (f"{lengths[0]}..{lengths[-1]}" if isinstance(lengths, range)
                    else str(lengths[0]))
        _fail(_path(where, key), f"has {len(values)} entries, expected {expected}")
    for i, value in enumerate(values):
        if not _is_int(value) or not low <= value <= high:
            _fail(f"{_path(where, key)}[{i}]", f"{_describe(value)} is not an int in "
                                              f"{low}..{high}")
    return values


def _dims(obj: dict, key: str, where: str, maximum: tuple[int, int, int]) -> list[int]:
    dims = list(_list(obj, key, where))
    if len(dims) != 3 or not all(_is_int(d) and 1 <= d <= m for d, m in zip(dims, maximum)):
        _fail(_path(where, key), f"must be 3 positive ints at most {list(maximum)}, "
                                 f"got {_describe(dims)}")
    return dims
