"""`aicf-run BUNDLE`: run a compiled bundle on the GPU and save its outputs.

Everything that can be checked on the host (the bundle, the inputs, the --check model) is
checked before the GPU is touched, so those mistakes are reported the same way, and can be
tested, on a machine without one. Every user error prints one line,
`aicf-run: error: <message>`, to stderr and exits 2; a failed --check exits 1.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import click

from aicf_run import __version__
from aicf_run.bundle import read_bundle
from aicf_run.check import CheckRow, check_against_onnx, require_onnxruntime
from aicf_run.device import check_arch, open_device
from aicf_run.errors import RunError
from aicf_run.executor import Executor
from aicf_run.inputs import load_inputs, save_outputs


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bundle_path", metavar="BUNDLE")
@click.option("--input", "input_specs", multiple=True, metavar="SPEC",
              help="An input: FILE.npy (single-input bundles), NAME=FILE.npy, or FILE.npz "
                   "whose members are input names. Repeat for several.")
@click.option("--output-dir", default=".", show_default=True, metavar="DIR",
              help="Folder for the outputs, saved as <output-name>.npy.")
@click.option("--check", "check_model", default=None, metavar="MODEL.onnx",
              help="Also run MODEL.onnx on onnxruntime (CPU) and compare; exit 1 on a FAIL.")
@click.option("--rtol", default=None, type=click.FloatRange(min=0),
              help="--check tolerance on max|y - ref| / max|ref| [default: by the bundle's "
                   "precision: fp32 1e-4, tf32 1e-3, fp16/bf16 1e-2].")
@click.option("--device", "device_ordinal", default=0, show_default=True,
              type=click.IntRange(min=0), help="The GPU to run on.")
@click.version_option(__version__, prog_name="aicf-run")
def main(bundle_path: str, input_specs: tuple[str, ...], output_dir: str,
         check_model: str | None, rtol: float | None, device_ordinal: int) -> None:
    """Run a compiled .aicf BUNDLE on an NVIDIA GPU and save its outputs as .npy files."""
    try:
        failed = _run(bundle_path, list(input_specs), output_dir, check_model, rtol,
                      device_ordinal)
    except RunError as err:
        _fail(str(err))
    except OSError as err:
        # Backstop for an environment problem no module anticipated (a full disk, say).
        _fail(f"{err.filename or 'I/O'}: {err.strerror or err}; check the path and free space")
    if failed:
        raise SystemExit(1)


# The --check tolerance each precision policy justifies (max|y - ref| / max|ref|).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}


def _run(bundle_path: str, input_specs: list[str], output_dir: str, check_model: str | None,
         rtol: float | None, device_ordinal: int) -> bool:
    """Do the work; returns True when --check found a failing output."""
    bundle = read_bundle(bundle_path)
    if rtol is None:
        rtol = TOLERANCE.get(bundle.payload.get("precision"), 1e-4)
    inputs = load_inputs(input_specs, bundle)
    if check_model is not None:
        if not os.path.isfile(check_model):
            raise RunError(f"--check model {check_model} does not exist; pass the ONNX model "
                           f"the bundle was compiled from")
        require_onnxruntime()

    device = open_device(device_ordinal)
    try:
        check_arch(bundle.arch, device.arch)
        outputs = Executor(bundle, device).run(inputs)
    finally:
        device.close()

    paths = save_outputs(outputs, output_dir)
    for name, array in outputs.items():
        click.echo(f"{name}: {array.dtype} {list(array.shape)} -> {paths[name]}")
    if check_model is None:
        return False
    rows = check_against_onnx(check_model, inputs, outputs, rtol)
    click.echo(f"check against {check_model} (onnxruntime CPU, rtol {rtol:g}):")
    click.echo(_table(rows))
    return not all(row.passed for row in rows)


def _table(rows: list[CheckRow]) -> str:
    lines = [("output", "max abs err", "max rel err", "result")]
    for row in rows:
        result = "PASS" if row.passed else "FAIL"
        if row.note:
            result += f" ({row.note})"
        lines.append((row.name, f"{row.max_abs_err:.3e}", f"{row.max_rel_err:.3e}", result))
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    return "\n".join(
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[3]
        for line in lines)


def _fail(message: str) -> NoReturn:
    # One line, always: a message that somehow spans lines is folded rather than split.
    click.echo(f"aicf-run: error: {' '.join(message.split())}", err=True)
    sys.exit(2)
