"""aicfc's command line: the happy path, and every bad input giving one line and exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import onnx_builders as B


def aicfc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aicfc", *args], capture_output=True, text=True, cwd=cwd)


def assert_user_error(out: subprocess.CompletedProcess, *needles: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aicfc: error:"), out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    import examples.build_examples as ex
    folder = tmp_path_factory.mktemp("examples")
    ex.main(["--out-dir", str(folder)])
    return folder


@pytest.fixture(scope="module")
def block_bundle(examples: Path) -> Path:
    out = examples / "block.aicf"
    res = aicfc("compile", str(examples / "block.onnx"), "-o", str(out), "-q")
    assert res.returncode == 0, res.stderr
    return out


def test_compile_and_explain(block_bundle: Path):
    text = aicfc("explain", str(block_bundle))
    assert text.returncode == 0
    assert "attention" in text.stdout and "attn_softmax" in text.stdout and "it beat" in text.stdout
    data = json.loads(aicfc("explain", "--json", str(block_bundle)).stdout)
    for key in ("format_version", "target", "precision", "inputs", "outputs", "kernels", "memory"):
        assert key in data
    for k in data["kernels"]:
        for key in ("name", "onnx_nodes", "family", "params", "grid", "block", "smem_bytes", "registers",
                    "properties", "rewrites", "predicted", "candidates"):
            assert key in k
        assert {"time_us", "flops", "bytes"} <= set(k["predicted"])
        assert k["registers"] is not None, "ptxas reports registers for every kernel"
        assert k["candidates"], "every decision records what it beat"
    covered = {n for k in data["kernels"] for n in k["onnx_nodes"]}
    assert "attn_k_transpose" in covered and "gelu_erf" in covered
    mem = data["memory"]
    assert mem["arena_bytes"] > 0 and mem["weights_bytes"] > 0
    # the toolkit whose ptxas counted the registers the leaders were re-ranked with (plans differ across toolkits)
    from aicfc.codegen.nvcc import nvcc_version
    assert data["compiler"]["nvcc"] == nvcc_version() and f"nvcc {nvcc_version()!r}" in text.stdout.splitlines()[0]
    assert aicfc("explain", "--ir", "decision", str(block_bundle)).stdout.startswith("decision ")
    assert "__global__" in aicfc("explain", "--source", str(block_bundle)).stdout


def test_compile_for_sm80_and_sm90(examples: Path, tmp_path: Path):
    for target in ("sm_80", "sm_90"):
        res = aicfc("compile", str(examples / "mlp.onnx"), "-o", str(tmp_path / f"{target}.aicf"), "--target", target, "-q")
        assert res.returncode == 0, res.stderr
        data = json.loads(aicfc("explain", "--json", str(tmp_path / f"{target}.aicf")).stdout)
        assert data["target"] == target


def test_recompile_uses_cache(examples: Path, monkeypatch):
    from aicfc.codegen import nvcc
    from aicfc.driver import compile_model
    compile_model(examples / "mlp.onnx")

    def no_nvcc(*args, **kwargs):
        raise AssertionError(f"an unchanged module must not run nvcc again: {args[0] if args else kwargs}")
    monkeypatch.setattr(nvcc.subprocess, "run", no_nvcc)
    compile_model(examples / "mlp.onnx")


def test_dump_ir(examples: Path, tmp_path: Path):
    res = aicfc("compile", str(examples / "mlp.onnx"), "-o", str(tmp_path / "m.aicf"), "--dump-ir", str(tmp_path / "ir"), "-q")
    assert res.returncode == 0
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    from aicfc.passes.pipeline import PIPELINE
    last = f"{len(PIPELINE):02d}_{PIPELINE[-1].name}.txt"
    assert "00_import.txt" in names and last in names and "module_0.cu" in names


def test_check_lists_all_unsupported(tmp_path: Path):
    path = B.save(B.unsupported_op_model(), tmp_path / "bad.onnx")
    res = aicfc("check", str(path))
    assert res.returncode == 1
    assert "EyeLike" in res.stdout and "NonMaxSuppression" in res.stdout and "eyelike_0" in res.stdout


def test_check_ok(examples: Path):
    res = aicfc("check", str(examples / "block.onnx"))
    assert res.returncode == 0 and "supported" in res.stdout


# ------------------------------------------------------------------------ bad inputs

@pytest.mark.parametrize("kind", B.GARBAGE_KINDS)
def test_garbage_model(tmp_path: Path, kind: str):
    path = B.write_garbage(tmp_path / "m.onnx", kind)
    out = tmp_path / "m.aicf"
    assert_user_error(aicfc("compile", str(path), "-o", str(out)), "m.onnx")
    assert not out.exists()


def test_missing_model(tmp_path: Path):
    assert_user_error(aicfc("compile", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.aicf")), "no such model")


def test_unsupported_op_compile(tmp_path: Path):
    path = B.save(B.unsupported_op_model(), tmp_path / "bad.onnx")
    assert_user_error(aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf")), "EyeLike", "NonMaxSuppression")


def test_symbolic_dim_needs_shape(tmp_path: Path):
    path = B.save(B.symbolic_dim_model(), tmp_path / "sym.onnx")
    assert_user_error(aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf")), "'batch'", "--shape x=")
    ok = aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf"), "--shape", "x=2x64", "-q")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("spec,needle", [("x=2y64", "expected NAME="), ("y=2x64", "not inputs"), ("x=2x3x4", "rank")])
def test_bad_shape_flag(tmp_path: Path, spec: str, needle: str):
    path = B.save(B.symbolic_dim_model(), tmp_path / "sym.onnx")
    assert_user_error(aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf"), "--shape", spec), needle)


@pytest.mark.parametrize("pin,needle", [("nowhere:unit=simt", "covers ONNX node 'nowhere'"), ("unit", "expected KEY=VALUE"),
                                       ("bn=64", "no kernel's schedule has the key 'bn'")])
def test_bad_pin_flag(examples: Path, tmp_path: Path, pin: str, needle: str):
    out = tmp_path / "x.aicf"
    assert_user_error(aicfc("compile", str(examples / "mlp.onnx"), "-o", str(out), "--pin", pin), needle)
    assert not out.exists()


def test_external_data_outside_folder(tmp_path: Path):
    path = B.external_data_outside_model(tmp_path)
    assert_user_error(aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf")), "outside the model's folder")


def test_unknown_target(examples: Path, tmp_path: Path):
    assert_user_error(aicfc("compile", str(examples / "mlp.onnx"), "-o", str(tmp_path / "x.aicf"), "--target", "sm_99"),
                      "sm_99")


def test_unsupported_precision(examples: Path, tmp_path: Path):
    assert_user_error(aicfc("compile", str(examples / "mlp.onnx"), "-o", str(tmp_path / "x.aicf"), "--precision", "fp8"),
                      "fp8")


def test_float64_model_refused(tmp_path: Path):
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])])
    path = B.save(B.make_model(g), tmp_path / "f64.onnx")
    assert_user_error(aicfc("compile", str(path), "-o", str(tmp_path / "x.aicf")), "f64", "f32")


@pytest.mark.parametrize("content", [b"", b"hello world, not a bundle at all......................................",
                                     b"\x89PNG\r\n\x1a\n" + bytes(100)])
def test_explain_rejects_bad_bundle(tmp_path: Path, content: bytes):
    path = tmp_path / "b.aicf"
    path.write_bytes(content)
    assert_user_error(aicfc("explain", str(path)))


def test_explain_rejects_truncated_and_corrupt(block_bundle: Path, tmp_path: Path):
    data = block_bundle.read_bytes()
    (tmp_path / "t.aicf").write_bytes(data[: len(data) // 2])
    assert_user_error(aicfc("explain", str(tmp_path / "t.aicf")), "truncated")
    for at, needle in [(100, "checksum"),   # the payload, under the header's checksum
                       (len(data) - 2, "does not match its sha256")]:   # the weights section
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        (tmp_path / "c.aicf").write_bytes(bytes(flipped))
        assert_user_error(aicfc("explain", str(tmp_path / "c.aicf")), needle)


def test_output_not_half_written_on_error(tmp_path: Path):
    path = B.save(B.unsupported_op_model(), tmp_path / "bad.onnx")
    out = tmp_path / "x.aicf"
    aicfc("compile", str(path), "-o", str(out))
    assert list(tmp_path.iterdir()) == [path]


def test_opset_newer_than_known_is_refused(tmp_path: Path):
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "op99.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 99)]), path)
    newest = str(onnx.defs.onnx_opset_version())
    for cmd in (("compile", str(path), "-o", str(tmp_path / "x.aicf")), ("check", str(path))):
        assert_user_error(aicfc(*cmd), "opset 99", newest)
    assert not (tmp_path / "x.aicf").exists()


@pytest.mark.parametrize("args,needle", [
    (("compile", "{dir}", "-o", "{dir}/x.aicf"), "is a directory"),
    (("compile", "{model}", "-o", "{dir}"), "is a directory"),
    (("explain", "{dir}"), "is a directory"),
    (("compile", "--no-such-flag"), "No such option"),
    ((), "no command given"),
])
def test_click_usage_errors_are_one_line(examples: Path, tmp_path: Path, args, needle):
    folder = tmp_path / "folder"
    folder.mkdir()
    filled = [a.format(dir=folder, model=examples / "mlp.onnx") for a in args]
    assert_user_error(aicfc(*filled), needle)


def test_help_and_version_still_exit_zero():
    assert aicfc("--help").returncode == 0 and aicfc("compile", "--help").returncode == 0
    assert aicfc("--version").returncode == 0


def test_huge_symbolic_extent_compiles_or_is_refused_in_one_line(tmp_path: Path):
    """A valid model with a huge extent: the planner keeps only grids within CUDA's launch limits,
    and refuses in one line when no schedule has one."""
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    path = tmp_path / "sym.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "big.aicf"
    res = aicfc("compile", str(path), "--shape", "x=99999999999x3", "-o", str(out), "-q")
    assert res.returncode == 0, res.stderr
    grid = json.loads(aicfc("explain", str(out), "--json").stdout)["kernels"][0]["grid"]
    assert grid[0] <= 2**31 - 1 and grid[1] <= 65535 and grid[2] <= 65535
    too_big = tmp_path / "too_big.aicf"
    assert_user_error(aicfc("compile", str(path), "--shape", "x=999999999999999x3", "-o", str(too_big)),
                      "launch limits", "too large")
    assert not too_big.exists()
