"""TMA tensor maps: the runtime's encoding (aicf_run/tensormap.py), the bundle's `tensor_maps`
field (schema, payload), and their launch paths (executor, `aicfc tune`'s KernelBench).

A kernel with maps takes a pointer to them (`const AicfTmap*`, the maps 128 bytes apart in global
memory, placed there by `tensormap.upload`) as its first argument, then its buffer pointers.

The CPU tests call `cuTensorMapEncodeTiled` on a fake driver library that records the ctypes
arguments and writes 128 known bytes, and launch on the fake GPU of tests/test_run_cli.py and a
fake driver for KernelBench. The `gpu` tests encode on the real driver and launch one real TMA
copy that reads its map from global memory.
"""

from __future__ import annotations

import copy
import ctypes
import random
import struct
import types
from typing import Any, Callable

import numpy as np
import pytest

import aicf_run.graph
from aicf_run import tensormap
from aicf_run.bundle import Bundle, validate_payload
from aicf_run.errors import RunError
from tests.test_bundle_format import make_payload, sha

KNOWN = bytes(range(128))   # what the fake driver writes as the first encoded map
INVALID_VALUE = 1


def known(n: int) -> bytes:
    """The map the fake driver writes on its call `n` (from 0): KNOWN rotated by n bytes, so
    that maps encoded one after another can be told apart (known(0) is KNOWN)."""
    return KNOWN[n:] + KNOWN[:n]


class FakeEncodeLib:
    """cuTensorMapEncodeTiled and cuGetErrorName of a driver, on the CPU: every call's ctypes
    arguments are decoded into `calls`, and call n writes known(n); `result` is the CUresult
    it returns."""

    NAMES = {INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE"}

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.calls: list[dict[str, Any]] = []

    def cuTensorMapEncodeTiled(self, tensor_map: Any, dtype: Any, rank: Any, address: Any,
                               dims: Any, strides: Any, box: Any, element_strides: Any,
                               interleave: Any, swizzle: Any, l2: Any, oob: Any) -> int:
        r = rank.value
        self.calls.append({
            "map": tensor_map.value, "dtype": dtype.value, "rank": r, "address": address.value,
            "dims": list(dims)[:r], "strides": list(strides)[:r - 1], "box": list(box)[:r],
            "element_strides": list(element_strides)[:r], "interleave": interleave.value,
            "swizzle": swizzle.value, "l2": l2.value, "oob": oob.value})
        if self.result == 0:
            ctypes.memmove(tensor_map.value, known(len(self.calls) - 1), len(KNOWN))
        return self.result

    def cuTensorMapEncodeIm2col(self, tensor_map: Any, dtype: Any, rank: Any, address: Any,
                                dims: Any, strides: Any, lower: Any, upper: Any, channels: Any,
                                pixels: Any, element_strides: Any, interleave: Any, swizzle: Any,
                                l2: Any, oob: Any) -> int:
        r = rank.value
        self.calls.append({
            "im2col": True, "map": tensor_map.value, "dtype": dtype.value, "rank": r,
            "address": address.value, "dims": list(dims)[:r], "strides": list(strides)[:r - 1],
            "lower": list(lower)[:r - 2], "upper": list(upper)[:r - 2], "channels": channels.value,
            "pixels": pixels.value, "element_strides": list(element_strides)[:r],
            "interleave": interleave.value, "swizzle": swizzle.value, "l2": l2.value, "oob": oob.value})
        if self.result == 0:
            ctypes.memmove(tensor_map.value, known(len(self.calls) - 1), len(KNOWN))
        return self.result

    def cuGetErrorName(self, result: int, name: Any) -> int:
        if result not in self.NAMES:
            return INVALID_VALUE
        name.contents.value = self.NAMES[result].encode()
        return 0


def record(**changes: Any) -> dict[str, Any]:
    """A valid record: a 64x64 fp16 tile, K-major rows of 128 bytes, 128-byte swizzle."""
    base = {"buffer": 0, "dtype": "f16", "offset": 0, "dims": [64, 64], "strides": [128],
            "box": [64, 64], "swizzle": 128}
    return base | changes


BASE = 0x7F00_0000_0000


# --- encode: the marshaling ---


def test_encode_passes_every_field_to_the_driver() -> None:
    lib = FakeEncodeLib()
    blob = tensormap.encode(record(offset=8, dims=[96, 80, 3], strides=[256, 20480],
                                   box=[64, 128, 1]), BASE, lib=lib)
    assert blob == KNOWN
    (call,) = lib.calls
    assert call["map"] % 64 == 0, "CUtensorMap is 64-byte aligned"
    assert call == {"map": call["map"], "dtype": 6, "rank": 3, "address": BASE + 8 * 2,
                    "dims": [96, 80, 3], "strides": [256, 20480], "box": [64, 128, 1],
                    "element_strides": [1, 1, 1], "interleave": 0, "swizzle": 3, "l2": 3,
                    "oob": 0}


IM2COL = {"lower": [-1, -1], "upper": [-2, -2], "element_strides": [1, 2, 2, 1]}


def im2col_record(**changes: Any) -> dict[str, Any]:
    """A valid im2col record: a [2, 15, 15, 64] fp16 NHWC image, 128 pixels of 64 channels a
    copy, a 3x3/2 convolution's corners (pad 1, 8x8 out)."""
    return record(dims=[64, 15, 15, 2], strides=[128, 1920, 28800], box=[64, 128, 1, 1],
                  im2col=copy.deepcopy(IM2COL)) | changes


def test_encode_im2col_passes_every_field_to_the_driver() -> None:
    lib = FakeEncodeLib()
    assert tensormap.encode(im2col_record(offset=8), BASE, lib=lib) == KNOWN
    (call,) = lib.calls
    assert call == {"im2col": True, "map": call["map"], "dtype": 6, "rank": 4, "address": BASE + 16,
                    "dims": [64, 15, 15, 2], "strides": [128, 1920, 28800], "lower": [-1, -1],
                    "upper": [-2, -2], "channels": 64, "pixels": 128, "element_strides": [1, 2, 2, 1],
                    "interleave": 0, "swizzle": 3, "l2": 3, "oob": 0}


def test_im2col_refusal_names_the_entry() -> None:
    with pytest.raises(RunError) as info:
        tensormap.encode(im2col_record(), BASE, lib=FakeEncodeLib(result=INVALID_VALUE), name="map 0")
    assert str(info.value).startswith("map 0: cuTensorMapEncodeIm2col refused f16 dims [64, 15, 15, 2]")


@pytest.mark.parametrize("im2col,why", [
    ({"lower": [-1], "upper": [-2, -2], "element_strides": [1, 2, 2, 1]}, "im2col.lower"),
    ({"lower": [-129, 0], "upper": [-2, -2], "element_strides": [1, 2, 2, 1]}, "im2col.lower"),
    ({"lower": [-1, -1], "upper": [128, 0], "element_strides": [1, 2, 2, 1]}, "im2col.upper"),
    ({"lower": [-1, -1], "upper": [-2, -2], "element_strides": [1, 9, 2, 1]}, "im2col.element_strides"),
    ({"lower": [-1, -1], "upper": [-2, -2]}, "im2col must be a map"),
    ([1, 2], "im2col must be a map"),
])
def test_im2col_problems(im2col: Any, why: str) -> None:
    assert why in tensormap.problem(im2col_record(im2col=im2col))


def test_im2col_box_and_rank() -> None:
    assert "[channels, pixels, 1, ...]" in tensormap.problem(im2col_record(box=[64, 128, 2, 1]))
    assert "rank 3 to 5" in tensormap.problem(record(im2col=copy.deepcopy(IM2COL)))


def test_compiler_im2col_record_is_what_the_runtime_encodes() -> None:
    """aicfc's TensorMap with an Im2col writes the record aicf_run checks and encodes."""
    from aicfc.codegen.tma import Im2col, TensorMap
    m = TensorMap("x", "f16", 0, (64, 15, 15, 2), (128, 1920, 28800), (64, 128, 1, 1), 128,
                  Im2col((-1, -1), (-2, -2), (1, 2, 2, 1)))
    assert m.problems() is None
    rec = m.record({"x": 0})
    assert tensormap.problem(rec) is None and rec == im2col_record()
    assert "corner" in TensorMap("x", "f16", 0, (64, 15, 15, 2), (128, 1920, 28800), (64, 128, 1, 1), 128,
                                 Im2col((-200, -1), (-2, -2), (1, 2, 2, 1))).problems()


@pytest.mark.parametrize("dtype,enum,itemsize", [("f16", 6, 2), ("bf16", 9, 2), ("f32", 7, 4)])
def test_encode_data_types(dtype: str, enum: int, itemsize: int) -> None:
    lib = FakeEncodeLib()
    tensormap.encode(record(dtype=dtype, offset=16, box=[128 // itemsize, 8]), BASE, lib=lib)
    assert lib.calls[0]["dtype"] == enum and lib.calls[0]["address"] == BASE + 16 * itemsize


@pytest.mark.parametrize("swizzle,enum", [(0, 0), (32, 1), (64, 2), (128, 3)])
def test_encode_swizzles(swizzle: int, enum: int) -> None:
    lib = FakeEncodeLib()
    tensormap.encode(record(swizzle=swizzle, box=[16, 8]), BASE, lib=lib)
    assert lib.calls[0]["swizzle"] == enum


def test_encode_rank_one() -> None:
    lib = FakeEncodeLib()
    assert tensormap.encode(record(dims=[1000], strides=[], box=[64]), BASE, lib=lib) == KNOWN
    assert lib.calls[0]["rank"] == 1 and lib.calls[0]["dims"] == [1000]


def test_encode_uses_the_graph_modules_library(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = FakeEncodeLib()
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: lib)
    assert tensormap.encode(record(), BASE) == KNOWN and len(lib.calls) == 1


def test_driver_refusal_is_one_line_naming_the_map_and_the_error() -> None:
    lib = FakeEncodeLib(result=INVALID_VALUE)
    with pytest.raises(RunError) as info:
        tensormap.encode(record(), BASE, lib=lib, name="kernel 3 (k3) tensor_maps[1]")
    message = str(info.value)
    assert message.startswith("kernel 3 (k3) tensor_maps[1]: cuTensorMapEncodeTiled refused f16 "
                              "dims [64, 64] strides [128] box [64, 64] swizzle 128")
    assert "CUDA_ERROR_INVALID_VALUE (1)" in message and "aicfc compile" in message
    assert "\n" not in message


def test_a_driver_without_the_call_is_a_run_error() -> None:
    lib = types.SimpleNamespace()
    with pytest.raises(RunError, match="no cuTensorMapEncodeTiled .*update the NVIDIA driver"):
        tensormap.encode(record(), BASE, lib=lib)


def test_an_unloadable_driver_is_a_run_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise RunError("cannot load the CUDA driver library")
    monkeypatch.setattr(aicf_run.graph, "libcuda", missing)
    with pytest.raises(RunError, match="cannot load the CUDA driver library libcuda.so.1 to "
                                       "encode TMA tensor maps"):
        tensormap.encode(record(), BASE)


BAD_RECORDS: list[tuple[str, Any, str]] = [
    ("not_a_map", [1, 2], "must be a map"),
    ("missing_key", {k: v for k, v in record().items() if k != "box"}, "keys are"),
    ("unknown_key", record(fill="nan"), "keys are"),
    ("int_key", {**record(), 1: 2}, "keys are"),
    ("dtype", record(dtype="f64"), "dtype 'f64'"),
    ("dtype_unhashable", record(dtype=["f16"]), "dtype ['f16']"),
    ("buffer", record(buffer=-1), "buffer -1"),
    ("offset_negative", record(offset=-2), "offset -2"),
    ("offset_float", record(offset=1.0), "offset 1.0"),
    ("rank_0", record(dims=[], strides=[], box=[]), "dims []"),
    ("rank_6", record(dims=[64] * 6, strides=[128] * 5, box=[64] * 6), "dims"),
    ("dim_zero", record(dims=[0, 64]), "dims"),
    ("dim_over_2_32", record(dims=[64, 2**32 + 1]), "dims"),
    ("dim_bool", record(dims=[64, True]), "dims"),
    ("box_length", record(box=[64]), "box [64]"),
    ("box_over_256", record(box=[64, 257]), "box"),
    ("strides_length", record(strides=[]), "strides []"),
    ("stride_misaligned", record(strides=[120]), "multiples of 16"),
    ("stride_2_40", record(strides=[2**40]), "below 2^40"),
    ("stride_huge", record(strides=[2**70]), "below 2^40"),
    ("swizzle", record(swizzle=48), "swizzle 48"),
    ("swizzle_bool", record(swizzle=True, box=[8, 8]), "swizzle True"),
    ("swizzle_unhashable", record(swizzle=[128]), "swizzle [128]"),
    ("inner_box_over_swizzle", record(box=[128, 64]), "over the 128-byte swizzle"),
    ("inner_box_not_16", record(box=[4, 64], swizzle=0), "not a multiple of 16"),
]


@pytest.mark.parametrize("bad,fragment", [(r, f) for _, r, f in BAD_RECORDS],
                         ids=[case for case, _, _ in BAD_RECORDS])
def test_bad_records_never_reach_the_driver(bad: Any, fragment: str) -> None:
    lib = FakeEncodeLib()
    with pytest.raises(RunError) as info:
        tensormap.encode(bad, BASE, lib=lib, name="map 0")
    message = str(info.value)
    assert message.startswith("map 0: bad tensor map record: ") and fragment in message, message
    assert "\n" not in message and lib.calls == []


def test_fuzzed_records_raise_only_run_error() -> None:
    from tests.test_bundle_format import _replace_random_field
    rng = random.Random(77)
    for _ in range(500):
        bad = record()
        for _ in range(rng.randint(1, 3)):
            bad = _replace_random_field(bad, rng)
        try:
            assert tensormap.encode(bad, BASE, lib=FakeEncodeLib()) == KNOWN
        except RunError as err:
            assert "\n" not in str(err)


@pytest.mark.parametrize("address,offset", [(BASE + 8, 0), (BASE, 3), (0, 0), (2**64 - 64, 64)])
def test_misaligned_or_impossible_start_is_refused(address: int, offset: int) -> None:
    lib = FakeEncodeLib()
    with pytest.raises(RunError, match="not a 16-byte aligned device address"):
        tensormap.encode(record(offset=offset), address, lib=lib)
    assert lib.calls == []


def test_arg_format_is_the_maps_pointer_then_the_buffer_pointers() -> None:
    # However many maps a kernel has, it takes one pointer to them, first.
    assert tensormap.arg_format(2, 3) == tensormap.arg_format(1, 3) == "PPPP"
    assert tensormap.arg_format(1, 0) == "P"
    assert tensormap.arg_format(0, 2) == "PP" and tensormap.arg_format(0, 0) == ""
    # PyCUDA packs a prepared call with its vendored copy of `struct` in native mode ('@'):
    # the table's address is the first 8 bytes, the buffers' follow.
    packed = struct.pack("@" + tensormap.arg_format(2, 3), 0x7F00_0000_0100, 11, 12, 13)
    assert len(packed) == 4 * 8
    assert struct.unpack("@4P", packed) == (0x7F00_0000_0100, 11, 12, 13)
    assert not hasattr(tensormap, "FORMAT"), "no map goes by value any more"


# --- upload: every kernel's maps in one device allocation ---
# (on BenchDriver, below: the slice of pycuda.driver that upload uses)


def test_upload_without_maps_allocates_nothing() -> None:
    driver = BenchDriver()
    assert tensormap.upload(driver, [], "nothing") == (None, [])
    assert tensormap.upload(driver, [(), []], "two kernels") == (None, [0, 0])
    assert driver.bases == [] and driver.copies == []


def test_upload_places_the_tables_one_after_another() -> None:
    driver = BenchDriver()
    first, second = [known(0), known(1)], [known(2)]
    allocation, addresses = tensormap.upload(driver, [first, second], "the bundle")
    (base,) = driver.bases
    assert int(allocation) == base
    assert addresses == [base, base + 128 * len(first)]
    assert driver.sizes[base] == 3 * 128
    assert driver.copies == [(base, known(0) + known(1) + known(2))], "one copy, in order"
    assert driver.freed == [], "the caller frees it"


def test_upload_gives_a_kernel_without_maps_no_table() -> None:
    driver = BenchDriver()
    allocation, addresses = tensormap.upload(driver, [[known(0)], (), [known(1), known(2)], ()],
                                             "the bundle")
    base = int(allocation)
    assert addresses == [base, 0, base + 128, 0]
    assert driver.copies == [(base, known(0) + known(1) + known(2))]


def test_upload_failure_is_a_run_error() -> None:
    driver = BenchDriver()
    driver.fail_alloc = True
    with pytest.raises(RunError) as info:
        tensormap.upload(driver, [[KNOWN]], "kernel k")
    assert str(info.value) == ("cannot place the tensor maps of kernel k in GPU memory "
                               "(cuMemAlloc failed: out of memory); free GPU memory")
    assert driver.copies == []


# --- the bundle schema ---


def tma_payload() -> dict[str, Any]:
    """make_payload() plus an fp16 [64, 64] arena buffer 3 and one map over it on kernel 0."""
    payload = make_payload()
    payload["buffers"].append({"id": 3, "name": "a", "region": "arena", "offset": 768,
                               "nbytes": 8192, "dtype": "float16", "shape": [64, 64]})
    payload["memory"]["arena_bytes"] = 768 + 8192
    payload["kernels"][0]["tensor_maps"] = [record(buffer=3)]
    return payload


def _map_set(key: str, value: Any) -> Callable[[dict], None]:
    def mutate(payload: dict) -> None:
        payload["kernels"][0]["tensor_maps"][0][key] = value
    return mutate


def _map_pop(key: str) -> Callable[[dict], None]:
    return lambda payload: payload["kernels"][0]["tensor_maps"][0].pop(key)


def _set_maps(value: Any) -> Callable[[dict], None]:
    def mutate(payload: dict) -> None:
        payload["kernels"][0]["tensor_maps"] = value
    return mutate


MAP = "kernels[0].tensor_maps[0]"
SCHEMA_CASES: list[tuple[str, Callable[[dict], None], str]] = [
    ("maps_not_a_list", _set_maps({"0": 1}), "kernels[0].tensor_maps:"),
    ("map_not_a_map", _set_maps([7]), f"{MAP}:"),
    ("missing_key", _map_pop("box"), f"{MAP}.box: is missing"),
    ("missing_swizzle", _map_pop("swizzle"), f"{MAP}.swizzle: is missing"),
    ("unknown_key", _map_set("fill", "nan"), f"{MAP}: has unknown keys ['fill']"),
    ("buffer_out_of_range", _map_set("buffer", 9), f"{MAP}.buffer"),
    ("buffer_not_int", _map_set("buffer", "a"), f"{MAP}.buffer"),
    ("dtype_unknown", _map_set("dtype", "f64"), f"{MAP}.dtype"),
    ("dtype_not_the_buffers", _map_set("dtype", "bf16"), f"{MAP}.dtype"),
    ("offset_negative", _map_set("offset", -1), f"{MAP}.offset"),
    ("offset_misaligned", _map_set("offset", 3), f"{MAP}.offset"),
    ("dims_empty", _map_set("dims", []), f"{MAP}.dims"),
    ("dims_rank_6", _map_set("dims", [1] * 6), f"{MAP}.dims"),
    ("dims_zero", _map_set("dims", [0, 64]), f"{MAP}.dims[0]"),
    ("dims_str", _map_set("dims", [64, "64"]), f"{MAP}.dims[1]"),
    ("dims_over_2_32", _map_set("dims", [64, 2**32 + 1]), f"{MAP}.dims[1]"),
    ("dims_not_a_list", _map_set("dims", 64), f"{MAP}.dims"),
    ("box_length", _map_set("box", [64]), f"{MAP}.box"),
    ("box_zero", _map_set("box", [64, 0]), f"{MAP}.box[1]"),
    ("box_over_256", _map_set("box", [64, 257]), f"{MAP}.box[1]"),
    ("inner_box_over_swizzle", _map_set("box", [128, 64]), f"{MAP}.box"),
    ("inner_box_not_16", lambda p: p["kernels"][0]["tensor_maps"][0].update(box=[4, 8], swizzle=0),
     f"{MAP}.box"),
    ("strides_length", _map_set("strides", [128, 128]), f"{MAP}.strides"),
    ("stride_misaligned", _map_set("strides", [120]), f"{MAP}.strides[0]"),
    ("stride_zero", _map_set("strides", [0]), f"{MAP}.strides[0]"),
    ("stride_2_40", _map_set("strides", [2**40]), f"{MAP}.strides[0]"),
    ("stride_bool", _map_set("strides", [True]), f"{MAP}.strides[0]"),
    ("swizzle", _map_set("swizzle", 48), f"{MAP}.swizzle"),
    ("swizzle_bool", _map_set("swizzle", True), f"{MAP}.swizzle"),
    ("past_the_buffer_by_dims", _map_set("dims", [64, 65]), f"{MAP}: spans bytes up to 8320"),
    ("past_the_buffer_by_offset", _map_set("offset", 8), f"{MAP}: spans bytes up to 8208"),
    ("past_the_buffer_by_stride", _map_set("strides", [144]), f"{MAP}: spans"),
    ("past_the_buffer_by_rank", lambda p: p["kernels"][0]["tensor_maps"][0].update(
        dims=[64, 64, 2], strides=[128, 8192], box=[64, 64, 1]), f"{MAP}: spans"),
]


def _im2col_map(**changes: Any) -> Callable[[dict], None]:
    """Kernel 0's map over buffer 3 (fp16 [64, 64]) as an im2col map of a [1, 8, 8, 64] image."""
    def mutate(payload: dict) -> None:
        payload["kernels"][0]["tensor_maps"] = [im2col_record(
            buffer=3, dims=[64, 8, 8, 1], strides=[128, 1024, 8192], box=[64, 64, 1, 1],
            im2col={"lower": [-1, -1], "upper": [-1, -1], "element_strides": [1, 1, 1, 1]}) | changes]
    return mutate


SCHEMA_CASES += [
    ("im2col_not_a_map", _im2col_map(im2col=3), f"{MAP}.im2col: im2col must be a map"),
    ("im2col_corner", _im2col_map(im2col={"lower": [-1, -1], "upper": [-1, 200], "element_strides": [1] * 4}),
     f"{MAP}.im2col: im2col.upper"),
    ("im2col_box", _im2col_map(box=[64, 64, 2, 1]), f"{MAP}.im2col: an im2col box"),
]


SCHEMA_CASES += [
    ("maps_symbol_not_a_str", lambda p: p["kernels"][0].update(maps_symbol=7), "kernels[0].maps_symbol"),
    ("maps_symbol_not_an_identifier", lambda p: p["kernels"][0].update(maps_symbol="k0 maps"),
     "kernels[0].maps_symbol"),
    ("maps_symbol_without_maps", lambda p: p["kernels"][0].update(maps_symbol="k0_tmaps", tensor_maps=[]),
     "kernels[0].maps_symbol"),
]


def test_schema_accepts_a_maps_symbol() -> None:
    payload = tma_payload()
    payload["kernels"][0]["maps_symbol"] = "k0_tmaps"
    validate_payload(payload)


def test_schema_accepts_an_im2col_map() -> None:
    payload = tma_payload()
    _im2col_map()(payload)
    validate_payload(payload)


@pytest.mark.parametrize("mutate,field", [(m, f) for _, m, f in SCHEMA_CASES],
                         ids=[case for case, _, _ in SCHEMA_CASES])
def test_schema_names_the_bad_tensor_map_field(mutate: Callable, field: str) -> None:
    payload = tma_payload()
    mutate(payload)
    with pytest.raises(RunError) as info:
        validate_payload(payload)
    message = str(info.value)
    assert message.startswith("bad bundle field ") and field in message, message
    assert "aicfc compile" in message and "\n" not in message


def test_schema_accepts_maps_up_to_the_last_byte() -> None:
    payload = tma_payload()
    validate_payload(payload)
    maps = payload["kernels"][0]["tensor_maps"]
    # The same bytes as rank 3 (two 32-row halves), and a rank-1 map over the whole buffer.
    maps.append(record(buffer=3, dims=[64, 32, 2], strides=[128, 4096], box=[64, 32, 1]))
    maps.append(record(buffer=3, dtype="f16", dims=[4096], strides=[], box=[256], swizzle=0))
    maps.append(record(buffer=3, offset=64, dims=[64, 63], box=[64, 1]))
    validate_payload(payload)


def test_bundles_without_tensor_maps_stay_valid() -> None:
    payload = make_payload()
    assert "tensor_maps" not in payload["kernels"][0]
    validate_payload(payload)
    payload["kernels"][0]["tensor_maps"] = []
    validate_payload(payload)


def test_fuzzed_tensor_maps_raise_only_run_error() -> None:
    from tests.test_bundle_format import _replace_random_field
    rng = random.Random(4321)
    base = tma_payload()
    for _ in range(400):
        payload = copy.deepcopy(base)
        target = payload["kernels"][0]["tensor_maps"]
        for _ in range(rng.randint(1, 3)):
            target = _replace_random_field(target, rng)
        payload["kernels"][0]["tensor_maps"] = target
        try:
            validate_payload(payload)
        except RunError as err:
            assert "\n" not in str(err)


# --- the executor: maps encoded at load, uploaded once, their table passed first ---


@pytest.fixture
def fake_tma_gpu(fake_gpu: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """tests/test_run_cli.py's fake GPU with a fake cuTensorMapEncodeTiled (`fake_gpu.encoder`),
    every host-to-device copy recorded in `fake_gpu.copies` as (address, bytes), and TMA
    variants of its "add" kernel: "add_tma<n>" takes a pointer to its n maps as its first
    argument and, whenever it runs (launched or replayed in a graph), reads them from device
    memory into `fake_gpu.maps` as (that address, (map, ...)); its other arguments are add's."""
    from tests.test_run_cli import FakeFunction, FakeModule
    encoder = FakeEncodeLib()
    fake_gpu.libcuda.cuTensorMapEncodeTiled = encoder.cuTensorMapEncodeTiled
    fake_gpu.encoder = encoder
    fake_gpu.maps = []
    fake_gpu.copies = []
    memcpy_htod = fake_gpu.memcpy_htod
    get_function = FakeModule.get_function
    execute = FakeFunction._execute

    def record_htod(pointer: Any, source: Any) -> None:
        # Like PyCUDA, the destination is an allocation or an address; the fake's is an int.
        fake_gpu.copies.append((int(pointer), memoryview(source).cast("B").tobytes()))
        memcpy_htod(int(pointer), source)

    def tma_get_function(self: Any, symbol: str) -> Any:
        base, tma, n = symbol.partition("_tma")
        function = get_function(self, base if tma and n.isdigit() else symbol)
        function.symbol, function.tmaps = symbol, int(n) if tma else 0
        return function

    def tma_execute(self: Any, grid: tuple, block: tuple, args: tuple[int, ...],
                    shared_size: int) -> None:
        n = getattr(self, "tmaps", 0)
        if n:
            table, args = args[0], args[1:]
            assert table % tensormap.MAP_ALIGN == 0, "a CUtensorMap is 64-byte aligned"
            blob = fake_gpu.read(table, n * tensormap.MAP_BYTES)   # asserts it is in bounds
            fake_gpu.maps.append((table, tuple(blob[i:i + tensormap.MAP_BYTES]
                                               for i in range(0, len(blob),
                                                              tensormap.MAP_BYTES))))
        execute(self, grid, block, args, shared_size)

    monkeypatch.setattr(fake_gpu, "memcpy_htod", record_htod)
    monkeypatch.setattr(FakeModule, "get_function", tma_get_function)
    monkeypatch.setattr(FakeFunction, "_execute", tma_execute)
    return fake_gpu


def _x_map(**changes: Any) -> dict[str, Any]:
    """A map over make_payload()'s x (buffer 0, float32 [2, 3]): rows of 8 bytes read as 2x2."""
    return {"buffer": 0, "dtype": "f32", "offset": 0, "dims": [2, 2], "strides": [16],
            "box": [4, 2], "swizzle": 0} | changes


def _copies_to(fake: Any, allocation: Any) -> list[bytes]:
    return [data for address, data in fake.copies if address == int(allocation)]


@pytest.mark.parametrize("graph", [True, False])
def test_executor_encodes_at_load_and_passes_maps_first(fake_tma_gpu: Any, graph: bool) -> None:
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from tests.test_run_cli import WEIGHT, X
    payload = make_payload()
    payload["kernels"][0] |= {"symbol": "add_tma2",
                              "tensor_maps": [_x_map(), _x_map(offset=4, dims=[2, 1])]}
    device = open_device()
    executor = Executor(Bundle.from_payload(payload), device, graph=graph)
    launch = executor._launches[0]
    table, arena = launch.pointers[:2]   # x is at offset 0 of the arena
    calls = fake_tma_gpu.encoder.calls
    assert [(c["address"], c["dims"], c["strides"]) for c in calls] == [
        (arena, [2, 2], [16]), (arena + 16, [2, 1], [16])]
    assert launch.maps == (known(0), known(1))
    # One allocation holds the maps, filled by one copy of them in order; its address is the
    # kernel's first pointer, its buffers' pointers follow.
    maps = int(executor._maps)
    assert table == maps and len(fake_tma_gpu.memory[maps]) == 2 * tensormap.MAP_BYTES
    assert _copies_to(fake_tma_gpu, maps) == [known(0) + known(1)]
    assert len(launch.pointers) == 1 + len(payload["kernels"][0]["args"])
    assert launch.function.arg_format == "PPPP"
    for _ in range(2):
        np.testing.assert_array_equal(executor.run({"x": X})["y"], X + WEIGHT)
    assert fake_tma_gpu.maps == [(maps, (known(0), known(1)))] * 2, \
        "every run (a graph replay or a launch) reads the maps from the table"
    assert len(calls) == 2, "maps are encoded once, at load"
    assert _copies_to(fake_tma_gpu, maps) == [known(0) + known(1)], "and uploaded once"
    device.close()
    assert fake_tma_gpu.memory == {}, "the arena, the weights and the maps are freed"


def test_executor_gives_each_kernel_with_maps_its_own_table(fake_tma_gpu: Any) -> None:
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from tests.test_run_cli import WEIGHT, X
    payload = make_payload()
    first = payload["kernels"][0]
    first |= {"symbol": "add_tma2", "tensor_maps": [_x_map(), _x_map(offset=4, dims=[2, 1])]}
    # y += w twice more: by a kernel without maps, then by one with one map over y.
    plain = copy.deepcopy(first) | {"name": "add_1", "symbol": "add", "args": [1, 2, 1],
                                    "tensor_maps": []}
    last = copy.deepcopy(first) | {"name": "add_2", "symbol": "add_tma1", "args": [1, 2, 1],
                                   "tensor_maps": [_x_map(buffer=1)]}
    payload["kernels"] += [plain, last]
    device = open_device()
    executor = Executor(Bundle.from_payload(payload), device)
    arena = executor._launches[0].pointers[1]
    assert [c["address"] for c in fake_tma_gpu.encoder.calls] == [arena, arena + 16, arena + 256]
    maps = int(executor._maps)
    assert _copies_to(fake_tma_gpu, maps) == [known(0) + known(1) + known(2)]
    assert len(fake_tma_gpu.memory[maps]) == 3 * tensormap.MAP_BYTES
    assert [launch.maps for launch in executor._launches] == [(known(0), known(1)), (),
                                                              (known(2),)]
    assert [launch.function.arg_format for launch in executor._launches] == ["PPPP", "PPP",
                                                                             "PPPP"]
    assert executor._launches[1].pointers == (arena + 256, int(executor._weights), arena + 256)
    assert [launch.pointers[0] for launch in executor._launches[::2]] == [maps, maps + 256]
    np.testing.assert_array_equal(executor.run({"x": X})["y"], X + 3 * WEIGHT)
    assert fake_tma_gpu.maps == [(maps, (known(0), known(1))), (maps + 256, (known(2),))]
    device.close()
    assert fake_tma_gpu.memory == {}


def test_executor_refused_map_is_a_run_error(fake_tma_gpu: Any) -> None:
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    fake_tma_gpu.encoder.result = INVALID_VALUE
    payload = make_payload()
    payload["kernels"][0]["tensor_maps"] = [_x_map()]
    device = open_device()
    with pytest.raises(RunError, match=r"^kernel 0 \(add_0\) tensor_maps\[0\]: cuTensorMap"
                                       r"EncodeTiled refused .*CUDA_ERROR_INVALID_VALUE"):
        Executor(Bundle.from_payload(payload), device)
    device.close()
    assert fake_tma_gpu.memory == {}


def test_executor_without_maps_keeps_the_pointer_format(fake_tma_gpu: Any) -> None:
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from tests.test_run_cli import WEIGHT, X
    device = open_device()
    executor = Executor(Bundle.from_payload(make_payload()), device)
    launch = executor._launches[0]
    assert launch.maps == () and launch.function.arg_format == "PPP"
    assert len(launch.pointers) == 3 and executor._maps is None
    assert fake_tma_gpu.encoder.calls == [] and fake_tma_gpu.allocations == 2   # arena, weights
    np.testing.assert_array_equal(executor.run({"x": X})["y"], X + WEIGHT)
    device.close()
    assert fake_tma_gpu.memory == {}


# --- the tuning bench: maps over its own argument buffers, uploaded for each timing ---


class BenchDriver:
    """The slice of pycuda.driver KernelBench and tensormap.upload use: every launch is recorded
    with its args in `calls`, every allocation's base in `bases` (its size in `sizes`), every
    host-to-device copy in `copies` as (address, bytes), every free in `freed`; with
    `fail_alloc` allocations fail."""

    class Error(Exception):
        pass

    function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dyn_smem")

    def __init__(self) -> None:
        self.clock = 0.0
        self.calls: list[tuple[str, str, tuple]] = []
        self.bases: list[int] = []
        self.sizes: dict[int, int] = {}
        self.copies: list[tuple[int, bytes]] = []
        self.freed: list[int] = []
        self.fail_alloc = False

    def module_from_buffer(self, cubin: bytes) -> Any:
        def get_function(name: str) -> Any:
            if name != "k_c0":   # no spin kernel: the plain timing path
                raise self.Error("named symbol not found")
            return BenchFunction(self, name)
        return types.SimpleNamespace(get_function=get_function)

    def mem_alloc(self, n: int) -> Any:
        if self.fail_alloc:
            raise self.Error("cuMemAlloc failed: out of memory")
        base = 0x10_0000 * (len(self.bases) + 1)
        self.bases.append(base)
        self.sizes[base] = n
        driver = self

        class Allocation(int):
            def free(self) -> None:
                assert int(self) not in driver.freed, "freed twice"
                driver.freed.append(int(self))
        return Allocation(base)

    def memcpy_htod(self, dest: Any, array: Any) -> None:
        assert int(dest) in self.sizes and int(dest) not in self.freed
        data = memoryview(array).tobytes()
        assert len(data) <= self.sizes[int(dest)]
        self.copies.append((int(dest), data))

    def Event(self) -> Any:
        driver = self

        class Event:
            t = 0.0

            def record(self) -> None:
                self.t = driver.clock

            def synchronize(self) -> None:
                pass

            def time_since(self, other: Any) -> float:
                return (self.t - other.t) / 1e3
        return Event()


class BenchFunction:
    num_regs = 40
    max_threads_per_block = 1024

    def __init__(self, driver: BenchDriver, name: str) -> None:
        self.driver, self.name, self.arg_format = driver, name, ""

    def prepare(self, arg_format: str) -> None:
        self.arg_format = arg_format

    def set_attribute(self, attribute: Any, value: Any) -> None:
        pass

    def prepared_call(self, grid: tuple, block: tuple, *args: Any, shared_size: int = 0) -> None:
        struct.pack("@" + self.arg_format, *args)   # what PyCUDA does with them
        assert all(type(a) is int for a in args)
        self.driver.calls.append((self.name, self.arg_format, args))
        self.driver.clock += 5.0


def _bench(driver: BenchDriver) -> Any:
    from aicf_run.device import Device
    from aicf_run.timing import KernelBench
    context = types.SimpleNamespace(synchronize=lambda: None)
    device = Device(driver=driver, context=context, ordinal=0, name="Fake GPU", arch="sm_90")
    arrays = [np.zeros(8192, np.float16), np.zeros(4096, np.float16), np.zeros(64, np.float32)]
    return KernelBench(device, b"\x7fELF", arrays)


def test_kernel_bench_encodes_maps_over_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = FakeEncodeLib()
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: encoder)
    driver = BenchDriver()
    maps = [record(buffer=1, dims=[64, 32]), record(buffer=0, offset=64)]
    with _bench(driver) as bench:
        arguments = list(driver.bases)   # the bench's three argument buffers
        assert bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0, maps) == pytest.approx(5.0)
        (table,) = driver.bases[len(arguments):]   # the maps' temporary allocation
        assert driver.freed == [table], "freed after the timing, the bench's buffers kept"
    assert [c["address"] for c in encoder.calls] == [arguments[1], arguments[0] + 128]
    assert driver.sizes[table] == 2 * tensormap.MAP_BYTES
    assert [data for address, data in driver.copies if address == table] == [known(0) + known(1)]
    assert {(fmt, args) for _, fmt, args in driver.calls} == {("PPPP", (table, *arguments))}
    assert sorted(driver.freed) == sorted(driver.bases)


def test_kernel_bench_uploads_the_maps_for_each_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: FakeEncodeLib())
    driver = BenchDriver()
    with _bench(driver) as bench:
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0, [record()])
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0)
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0, [record(buffer=2, dtype="f32",
                                                                  dims=[64], strides=[],
                                                                  box=[32])])
        arguments, tables = driver.bases[:3], driver.bases[3:]
        assert len(tables) == 2 and driver.freed == tables
    assert {(fmt, args) for _, fmt, args in driver.calls} == {
        ("PPPP", (tables[0], *arguments)), ("PPP", tuple(arguments)),
        ("PPPP", (tables[1], *arguments))}


def test_kernel_bench_without_maps_is_unchanged() -> None:
    driver = BenchDriver()
    with _bench(driver) as bench:
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0)
        assert len(driver.bases) == 3 and driver.freed == [], "no allocation for maps"
    assert {(fmt, args) for _, fmt, args in driver.calls} == {("PPP", tuple(driver.bases))}


@pytest.mark.parametrize("bad,fragment", [
    (record(buffer=3), "names argument 3 of 3"),
    (record(strides=[120]), "multiples of 16"),
])
def test_kernel_bench_refuses_a_bad_map_as_a_candidate_failure(
        monkeypatch: pytest.MonkeyPatch, bad: dict, fragment: str) -> None:
    from aicf_run.timing import LaunchRefused
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: FakeEncodeLib())
    driver = BenchDriver()
    with _bench(driver) as bench, pytest.raises(LaunchRefused, match=fragment):
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0, [bad])
    assert driver.calls == []
    assert len(driver.bases) == 3, "refused before anything is uploaded"


def test_kernel_bench_refused_by_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    from aicf_run.timing import LaunchRefused
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: FakeEncodeLib(result=INVALID_VALUE))
    driver = BenchDriver()
    with _bench(driver) as bench, pytest.raises(LaunchRefused, match="CUDA_ERROR_INVALID_VALUE"):
        bench.time_us("k_c0", (1, 1, 1), (128, 1, 1), 0, [record()])
    assert driver.calls == [] and len(driver.bases) == 3


# --- the compiler side: payload records and tune's argument positions ---


@pytest.fixture(scope="module")
def matmul_plan() -> Any:
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile
    from tests.test_tune import matmul_softmax
    hw = load_profile("sm_90")
    return run_pipeline(import_model(matmul_softmax(), None, name="mm"),
                        Options("sm_90", hw, "fp32")).plan


def test_payload_kernels_without_maps_get_an_empty_list(matmul_plan: Any) -> None:
    from aicfc.artifact.payload import _kernel
    index = {b.name: i for i, b in enumerate(matmul_plan.buffers)}
    types_ = matmul_plan.types()
    kernels = [_kernel(k, index, 0, types_, matmul_plan.launch) for k in matmul_plan.kernels]
    assert [k["family"] for k in kernels] == ["gemm", "row_reduce"]
    assert all(k["tensor_maps"] == [] for k in kernels)


def _operand_map(k: Any) -> Any:
    """A TensorMap over the first buffer the kernel loads (not one it stores)."""
    from aicfc.codegen.common import kernel_args
    from aicfc.codegen.tma import TensorMap
    loaded = [b for b in kernel_args(k) if b not in k.stores][0]
    return TensorMap(loaded, "f32", 0, (64, 64), (256,), (32, 64), 128)


def test_payload_records_maps_with_buffer_ids(matmul_plan: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import aicfc.artifact.payload as payload_module
    import aicfc.codegen.tma as tma
    k = matmul_plan.kernels[0]
    tm = _operand_map(k)
    monkeypatch.setattr(tma, "tensor_maps", lambda kernel, params, types_: [tm] if kernel is k else [])
    index = {b.name: i for i, b in enumerate(matmul_plan.buffers)}
    record_ = payload_module._kernel(k, index, 0, matmul_plan.types(), matmul_plan.launch)["tensor_maps"]
    assert record_ == [{"buffer": index[tm.buffer], "dtype": "f32", "offset": 0,
                        "dims": [64, 64], "strides": [256], "box": [32, 64], "swizzle": 128}]
    with pytest.raises(AssertionError, match="not bundle buffers"):
        tma.records(k, None, matmul_plan.types(), {n: i for n, i in index.items() if n != tm.buffer})


def test_tune_hands_the_bench_maps_by_argument_position(matmul_plan: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import aicf_run.timing
    import aicfc.tune as tune
    from aicfc.codegen.common import kernel_args
    from aicfc.planner.hardware import load_profile
    kt = tune.candidates(matmul_plan, load_profile("sm_90"), top=2, spread=0)[0]
    tm = _operand_map(kt.kernel)
    import aicfc.codegen.tma as tma
    monkeypatch.setattr(tma, "tensor_maps", lambda kernel, params, types_: [tm])
    types_ = matmul_plan.types()
    timed: list[tuple[str, list, str | None]] = []

    class Bench:
        def __init__(self, device: Any, cubin: bytes, arrays: list) -> None:
            pass

        def __enter__(self) -> Bench:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def time_us(self, name: str, grid: Any, block: Any, smem: int, maps: list,
                    maps_symbol: str | None = None) -> float:
            timed.append((name, maps, maps_symbol))
            return 1.0

        def registers(self, name: str) -> int:
            return 40

    monkeypatch.setattr(aicf_run.timing, "KernelBench", Bench)
    built = types.SimpleNamespace(cubin=b"\x7fELF", registers={})
    tune._measure(None, kt, built, lambda c: tune._argument_types(kt.kernel, c.params, types_),
                  np.random.default_rng(0), lambda label: None,
                  lambda c: tune._tensor_map_records(kt.kernel, c.params, types_))
    assert [name for name, _, _ in timed] == [f"{kt.name}_c{c.rank}" for c in kt.candidates]
    for c, (name, maps, symbol) in zip(kt.candidates, timed):
        position = list(kernel_args(kt.kernel, c.params)).index(tm.buffer)
        assert maps == [tm.record({tm.buffer: position})]
        assert symbol == tma.maps_symbol(name)   # the candidates read their maps from constant memory, as plans do
    assert all(c.measured_us == 1.0 for c in kt.candidates)


# --- on a GPU: the real driver, and one real TMA copy ---


@pytest.mark.gpu
def test_gpu_encodes_a_2d_fp16_map(gpu_device: Any) -> None:
    cuda = gpu_device.driver
    allocation = cuda.mem_alloc(64 * 64 * 2)
    try:
        blob = tensormap.encode(record(), int(allocation), name="2-D fp16 map")
        assert len(blob) == 128 and blob != bytes(128)
        # Same record, same address: the driver's encoding is deterministic.
        assert tensormap.encode(record(), int(allocation)) == blob
    finally:
        allocation.free()


@pytest.mark.gpu
def test_gpu_misaligned_stride_is_a_run_error(gpu_device: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = gpu_device.driver
    allocation = cuda.mem_alloc(64 * 64 * 2)
    try:
        with pytest.raises(RunError, match="multiples of 16"):
            tensormap.encode(record(strides=[120]), int(allocation))
        # Past our own checks, the driver refuses it too, and that is a RunError as well.
        monkeypatch.setattr(tensormap, "problem", lambda r: None)
        with pytest.raises(RunError, match=r"cuTensorMapEncodeTiled refused .*strides \[120\]"):
            tensormap.encode(record(strides=[120]), int(allocation), name="misaligned")
        gpu_device.context.synchronize()   # the context is still usable
    finally:
        allocation.free()


TMA_COPY = r"""
// aicf: needs sm_90a
// One 16x16 f32 box at (x0, y0) of the map into shared memory with cp.async.bulk.tensor,
// then out[i] = tile[i]: checks that a map placed in global memory by tensormap.upload, its
// address the first argument (as aicf_run passes a kernel's maps), arrives intact.
struct __align__(64) AicfTmap { unsigned long long words[16]; };
extern "C" __global__ void tma_copy(const AicfTmap* t, float* out, int x0, int y0) {
  __shared__ alignas(128) float tile[16 * 16];
  __shared__ alignas(8) unsigned long long bar;
  unsigned bar_at = (unsigned)__cvta_generic_to_shared(&bar);
  unsigned tile_at = (unsigned)__cvta_generic_to_shared(tile);
  unsigned long long map_at = reinterpret_cast<unsigned long long>(t);
  if (threadIdx.x == 0) {
    // The map was written by a copy (the generic proxy); the TMA reads it through the
    // tensormap proxy.
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;"
                 :: "l"(map_at) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_at));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar_at), "r"(16 * 16 * 4) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(tile_at), "l"(map_at), "r"(x0), "r"(y0), "r"(bar_at) : "memory");
  }
  __syncthreads();
  asm volatile("{\n .reg .pred done;\n WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               " @!done bra WAIT;\n}" :: "r"(bar_at) : "memory");
  for (int i = threadIdx.x; i < 16 * 16; i += blockDim.x) out[i] = tile[i];
}
"""


def build_tma_copy() -> bytes:
    """The cubin of TMA_COPY (sm_90a); nvcc must be on the path."""
    from aicfc.codegen.nvcc import build
    return build(TMA_COPY, "sm_90").cubin


@pytest.mark.gpu
def test_gpu_tma_copy_reads_its_map_from_the_uploaded_table(gpu_device: Any) -> None:
    if gpu_device.arch != "sm_90":
        pytest.skip(f"TMA needs Hopper (sm_90); this GPU is {gpu_device.arch}")
    cuda = gpu_device.driver
    a = np.arange(18 * 20, dtype=np.float32).reshape(18, 20)   # rows of 80 bytes
    function = cuda.module_from_buffer(build_tma_copy()).get_function("tma_copy")
    source, out = cuda.mem_alloc(a.nbytes), cuda.mem_alloc(16 * 16 * 4)
    maps = None
    try:
        cuda.memcpy_htod(source, a)
        blob = tensormap.encode({"buffer": 0, "dtype": "f32", "offset": 0, "dims": [20, 18],
                                 "strides": [80], "box": [16, 16], "swizzle": 0}, int(source))
        maps, (table,) = tensormap.upload(cuda, [[blob]], "tma_copy")
        assert table == int(maps) and table % tensormap.MAP_ALIGN == 0
        function.prepare(tensormap.arg_format(1, 1) + "ii")
        for x0, y0 in ((0, 0), (8, 4)):   # (8, 4): columns 20..23 and rows 18, 19 read as zeros
            function.prepared_call((1, 1, 1), (128, 1, 1), table, int(out), x0, y0)
            got = np.empty((16, 16), np.float32)
            cuda.memcpy_dtoh(got, out)
            expected = np.zeros((16, 16), np.float32)
            part = a[y0:y0 + 16, x0:x0 + 16]
            expected[:part.shape[0], :part.shape[1]] = part
            np.testing.assert_array_equal(got, expected)
    finally:
        source.free()
        out.free()
        if maps is not None:
            maps.free()
