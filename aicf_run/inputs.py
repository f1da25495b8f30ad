"""Host-side inputs and outputs: load `--input` files (or make random ones for timing), check
them, save outputs as .npy.

Everything here runs before the GPU is touched, so every mistake in the inputs is reported
(and testable) without one. Files are always loaded with allow_pickle=False: a .npy that holds
Python objects could run code when unpickled, so it is refused, never loaded.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from aicf_run.errors import RunError
from aicf_run.plans import input_shapes, select_plan

if TYPE_CHECKING:
    from aicf_run.bundle import Bundle

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK"
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# Random integer inputs (token ids) lie in [0, RANDOM_IDS): see random_inputs.
RANDOM_IDS = 100


def load_inputs(specs: list[str], bundle: Bundle) -> dict[str, np.ndarray]:
    """Load `--input` specs and check them against the bundle's inputs.

    A spec is `FILE.npy` (only when the bundle has exactly one input), `NAME=FILE.npy`, or a
    `FILE.npz` whose member names are input names. A spec that contains "=" but names no
    existing file is read as NAME=FILE.
    """
    names = [item["name"] for item in bundle.inputs]
    state = sorted(bundle.state_names)     # given by name, written before the run ([Note: state])
    loaded: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}

    def add(name: str, array: np.ndarray, source: str) -> None:
        if name not in names and name not in state:
            raise RunError(f"{source}: the bundle has no input named {name!r} "
                           f"(inputs: {', '.join(names + state) or 'none'})")
        if name in loaded:
            raise RunError(f"input {name!r} is given twice ({sources[name]} and {source}); "
                           f"give each input once")
        loaded[name] = array
        sources[name] = source

    for spec in specs:
        name, path = _split_spec(spec)
        if path.suffix.lower() == ".npz":
            if name is not None:
                raise RunError(f"{spec}: an .npz file names its own inputs; pass it as "
                               f"--input {path}")
            for member, array in _load_npz(path).items():
                add(member, array, f"{path}[{member}]")
            continue
        if path.suffix.lower() != ".npy":
            raise RunError(f"{path} is not an .npy or .npz file; save inputs with numpy.save "
                           f"or numpy.savez")
        if name is None:
            if len(names) != 1:
                raise RunError(f"{path}: the bundle has {len(names)} inputs "
                               f"({', '.join(names) or 'none'}); name it: --input NAME={path}")
            name = names[0]
        add(name, _load_npy(path), str(path))
    given = {name: array for name, array in loaded.items() if name not in state}
    return {**check_inputs(given, plan_for(given, bundle)), **{n: a for n, a in loaded.items() if n in state}}


def plan_for(inputs: Mapping[str, Any], bundle: Bundle) -> Bundle:
    """The plan of `bundle` whose input shapes equal `inputs`' (aicf_run.plans.select_plan: a
    lookup, NoPlanError when none); the bundle itself when it has one plan, or when an input is
    missing or unknown (check_inputs then names it). State tensors given by name are no part of the
    lookup ([Note: state] in aicf_run/executor.py)."""
    plans, state = bundle.plans, bundle.state_names
    given = {name: value for name, value in inputs.items() if name not in state}
    if len(plans) == 1 or set(given) != {item["name"] for item in bundle.inputs}:
        return bundle
    return plans[select_plan([plan.inputs for plan in plans], input_shapes(given))]


def check_inputs(inputs: Mapping[str, np.ndarray], bundle: Bundle) -> dict[str, np.ndarray]:
    """Check names, shapes and dtypes against the bundle; return C-contiguous native arrays."""
    expected = {item["name"]: item for item in bundle.inputs}
    for name in inputs:
        if name not in expected:
            raise RunError(f"unknown input {name!r}; the bundle's inputs are "
                           f"{', '.join(expected) or 'none'}")
    checked: dict[str, np.ndarray] = {}
    for name, item in expected.items():
        want = f"{item['dtype']} {list(item['shape'])}"
        if name not in inputs:
            raise RunError(f"missing input {name!r} ({want}); pass --input {name}=FILE.npy")
        array = inputs[name]
        if not isinstance(array, np.ndarray):
            raise RunError(f"input {name!r} must be a numpy array, got {type(array).__name__}")
        if array.dtype.name != item["dtype"] or array.dtype.hasobject:
            raise RunError(f"input {name!r} has dtype {array.dtype}, expected {item['dtype']}; "
                           f"convert it, e.g. array.astype(numpy.{item['dtype']})")
        if list(array.shape) != list(item["shape"]):
            raise RunError(f"input {name!r} has shape {list(array.shape)}, expected "
                           f"{list(item['shape'])} ({want})")
        # Byte order is an encoding, not a type: a big-endian float32 is still float32.
        checked[name] = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    return checked


def random_inputs(bundle: Bundle, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Fresh inputs for timing: standard normal floats; integers uniform in [0, RANDOM_IDS);
    bools false.

    An integer input is usually a token id (an embedding's Gather): ids below RANDOM_IDS are
    valid in any real vocabulary and spread the reads over many rows as real text does. Any id
    is safe: the compiled Gather wraps negative ids and clamps them into the table
    ([Note: Indirect index] in aicfc/ir/lowered.py), so no input reads outside a buffer.
    """
    rng = np.random.default_rng() if rng is None else rng
    arrays: dict[str, np.ndarray] = {}
    for item in bundle.inputs:
        dtype, shape = np.dtype(item["dtype"]), tuple(item["shape"])
        if dtype.kind == "f":
            arrays[item["name"]] = np.asarray(rng.standard_normal(shape)).astype(dtype)
        elif dtype.kind in "iu":
            arrays[item["name"]] = rng.integers(0, RANDOM_IDS, size=shape).astype(dtype)
        else:
            arrays[item["name"]] = np.zeros(shape, dtype)
    return arrays


def save_outputs(outputs: Mapping[str, np.ndarray], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write each output to `<out_dir>/<name>.npy`; returns {output name: path}.

    Characters outside [A-Za-z0-9._-] in a name become "_", so no name can leave `out_dir`.
    Each file is written to a temporary name and renamed, so no half-written .npy is left.
    """
    folder = Path(out_dir)
    paths: dict[str, Path] = {}
    owners: dict[Path, str] = {}
    for name in outputs:
        safe = _UNSAFE_NAME_CHARS.sub("_", name)
        if safe in ("", ".", ".."):
            raise RunError(f"output name {name!r} cannot be a file name; recompile the model "
                           f"with a named output")
        path = folder / f"{safe}.npy"
        if path in owners:
            raise RunError(f"outputs {owners[path]!r} and {name!r} would both be saved as "
                           f"{path}; rename one of them in the model")
        paths[name] = path
        owners[path] = name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, path in paths.items():
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                with open(temp, "wb") as f:
                    np.save(f, outputs[name], allow_pickle=False)
                os.replace(temp, path)
            finally:
                temp.unlink(missing_ok=True)
    except OSError as err:
        raise RunError(f"cannot write outputs to {folder}: {err.strerror or err}; pick a "
                       f"writable --output-dir") from None
    return paths


def _split_spec(spec: str) -> tuple[str | None, Path]:
    name, sep, file = spec.partition("=")
    if sep and name and not os.path.exists(spec):
        return name, Path(file)
    return None, Path(spec)


def _load_npy(path: Path) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            _check_npy_header(f, size, str(path))
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise RunError(f"input file {path} does not exist; check the --input path") from None
    except RunError:
        raise
    except (OSError, ValueError, EOFError, MemoryError) as err:
        raise RunError(f"cannot read {path} ({_one_line(err)}); save it with numpy.save") from None


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        # np.load would hide which member is bad, so check each member's header first.
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    _check_npy_header(member, info.file_size, f"{path}[{info.filename}]")
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise RunError(f"input file {path} does not exist; check the --input path") from None
    except RunError:
        raise
    except (OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile) as err:
        raise RunError(f"cannot read {path} ({_one_line(err)}); save it with numpy.savez") from None


def _check_npy_header(f: IO[bytes], size: int, label: str) -> None:
    """Refuse pickled arrays and headers that claim more data than the file holds.

    Reading the header first means a forged shape can never make np.load allocate gigabytes.
    """
    if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
        raise RunError(f"{label} is not a .npy array (bad header); save it with numpy.save")
    f.seek(0)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        return  # a newer header format: np.load's own checks apply
    if dtype.hasobject:
        raise RunError(f"{label} holds Python objects (pickled); save a plain numeric array "
                       f"with numpy.save")
    needed = math.prod(shape) * dtype.itemsize
    if needed > size - f.tell():
        raise RunError(f"{label} is truncated: its header says {needed} data bytes, the file "
                       f"has {max(size - f.tell(), 0)}; save it again with numpy.save")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
