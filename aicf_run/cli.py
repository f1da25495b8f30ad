"""`aicf-run BUNDLE`: run a compiled bundle on the GPU and save its outputs; or time it.

Everything that can be checked on the host (the flags, the bundle, the inputs, the --check
model) is checked before the GPU is touched, so those mistakes are reported the same way, and
can be tested, on a machine without one. Every user error prints one line,
`aicf-run: error: <message>`, to stderr and exits 2; a failed --check exits 1.

`--bench N`, `--profile` and `--timeline` run the model once (on the --input files, or on fresh
random inputs when none are given), then time it: aicf_run.bench, aicf_run.profile and
aicf_run.timeline say exactly what is timed. With them, outputs are saved only when
--output-dir is given.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from aicf_run import __version__
from aicf_run.bench import BenchReport, format_bench
from aicf_run.bundle import Bundle, read_bundle
from aicf_run.check import CheckRow, check_against_onnx, require_onnxruntime
from aicf_run.device import check_arch, open_device
from aicf_run.errors import RunError
from aicf_run.executor import Executor
from aicf_run.inputs import load_inputs, plan_for, random_inputs, save_outputs
from aicf_run.plans import plan_index, plan_name
from aicf_run.profile import ProfileReport, format_profile, roofline_points
from aicf_run.timeline import TimelineReport, format_timeline, save_svg, timeline_svg


class _RunByDefault(click.Group):
    """`aicf-run BUNDLE ...` runs a bundle (the `run` command); `aicf-run generate BUNDLE ...`
    generates tokens (aicf_run/generate_cli.py)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] != "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_RunByDefault, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aicf-run")
def main() -> None:
    """Run a compiled .aicf bundle (`aicf-run BUNDLE`), or generate tokens with a decoder bundle
    (`aicf-run generate BUNDLE`)."""


@main.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bundle_path", metavar="BUNDLE")
@click.option("--input", "input_specs", multiple=True, metavar="SPEC",
              help="An input: FILE.npy (single-input bundles), NAME=FILE.npy, or FILE.npz "
                   "whose members are input names. Repeat for several. With --bench, "
                   "--profile or --timeline and no --input, random normal inputs are used.")
@click.option("--output-dir", default=None, metavar="DIR",
              help="Folder for the outputs, saved as <output-name>.npy [default: the current "
                   "folder; with --bench, --profile or --timeline, outputs are saved only when given].")
@click.option("--check", "check_model", default=None, metavar="MODEL.onnx",
              help="Also run MODEL.onnx on onnxruntime (CPU) and compare; exit 1 on a FAIL.")
@click.option("--rtol", default=None, type=click.FloatRange(min=0),
              help="--check tolerance on max|y - ref| / max|ref| [default: by the bundle's "
                   "precision: fp32 1e-4, tf32 1e-3, fp16/bf16 1e-2].")
@click.option("--plan", "plan", default=None, metavar="N|SHAPES",
              help="For a bundle of several plans (one per set of input shapes): the plan to run on "
                   "random --bench/--profile inputs, by index or name (`aicfc explain` lists them) "
                   "[default: 0]. With --input the plan is the one whose shapes equal the inputs'; "
                   "--plan must then name that one.")
@click.option("--device", "device_ordinal", default=0, show_default=True,
              type=click.IntRange(min=0), help="The GPU to run on.")
@click.option("--no-graph", is_flag=True,
              help="Launch the kernels one by one instead of replaying the plan as a CUDA graph.")
@click.option("--bench", "bench_replays", type=int, default=None, metavar="N",
              help="Time N whole-plan replays with CUDA events, with and without a CUDA graph; "
                   "print the median and p90.")
@click.option("--profile", "profile_kernels", is_flag=True,
              help="Time every kernel alone; print it beside its predicted time, its share, "
                   "GB/s, TFLOP/s, % of the roofline and its ONNX nodes.")
@click.option("--timeline", "timeline", is_flag=True,
              help="For a bundle compiled with `aicfc compile --timeline`: replay the plan and print when "
                   "each kernel's blocks reached the SMs, when it could start, and its time in the chain.")
@click.option("--timeline-svg", "timeline_svg", default=None, metavar="FILE.svg",
              help="With --timeline: also draw it into FILE.svg, a row a kernel on one time axis.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the --bench/--profile/--timeline report as JSON instead of tables.")
@click.option("--roofline", default=None, metavar="FILE",
              help="With --profile: plot measured beside predicted kernels on the target's "
                   "roofline into FILE (.png, .svg or .pdf; needs matplotlib).")
def run_command(bundle_path: str, input_specs: tuple[str, ...], output_dir: str | None,
         check_model: str | None, rtol: float | None, device_ordinal: int, no_graph: bool,
         bench_replays: int | None, profile_kernels: bool, timeline: bool, timeline_svg: str | None,
         as_json: bool, roofline: str | None, plan: str | None) -> None:
    """Run a compiled .aicf BUNDLE on an NVIDIA GPU and save its outputs as .npy files.
    (`aicf-run generate BUNDLE --help`: token generation with a decoder bundle.)"""
    options = _Options(input_specs=list(input_specs), output_dir=output_dir,
                       check_model=check_model, rtol=rtol, device_ordinal=device_ordinal,
                       graph=not no_graph, bench=bench_replays, profile=profile_kernels,
                       as_json=as_json, roofline=roofline, plan=plan, timeline=timeline,
                       timeline_svg=timeline_svg)
    try:
        failed = _run(bundle_path, options)
    except RunError as err:
        _fail(str(err))
    except OSError as err:
        # Backstop for an environment problem no module anticipated (a full disk, say).
        _fail(f"{err.filename or 'I/O'}: {err.strerror or err}; check the path and free space")
    if failed:
        raise SystemExit(1)


# The --check tolerance each precision policy justifies (max|y - ref| / max|ref|).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}


@dataclass(frozen=True)
class _Options:
    """The command line, as plain values."""

    input_specs: list[str]
    output_dir: str | None
    check_model: str | None
    rtol: float | None
    device_ordinal: int
    graph: bool
    bench: int | None
    profile: bool
    as_json: bool
    roofline: str | None
    plan: str | None = None
    timeline: bool = False
    timeline_svg: str | None = None

    @property
    def timing(self) -> bool:
        return self.bench is not None or self.profile or self.timeline


def check_flags(options: _Options) -> None:
    """Refuse a bad combination of flags, before the bundle is read or the GPU touched."""
    if options.bench is not None and options.bench < 1:
        raise RunError(f"--bench N needs N >= 1 timed replays, got {options.bench}")
    if options.as_json and not options.timing:
        raise RunError("--json prints the --bench/--profile/--timeline report; add --bench N, --profile or --timeline")
    if options.as_json and options.check_model is not None:
        raise RunError("--json prints only the timing report; run --check in a separate call "
                       "without --json")
    if options.timeline_svg is not None:
        if not options.timeline:
            raise RunError("--timeline-svg draws what --timeline measures; add --timeline")
        folder = os.path.dirname(os.path.abspath(options.timeline_svg))
        if not os.path.isdir(folder):
            raise RunError(f"cannot write {options.timeline_svg}: folder {folder} does not exist; create it or "
                           f"pick another path")
    if options.roofline is not None:
        if not options.profile:
            raise RunError("--roofline plots the kernels that --profile measures; add --profile")
        from aicf_run.roofline import check_path, require_matplotlib
        path = check_path(options.roofline)
        if not path.parent.is_dir():
            raise RunError(f"cannot write roofline plot {path}: folder {path.parent} does not "
                           f"exist; create it or pick another path")
        require_matplotlib()


def _run(bundle_path: str, options: _Options) -> bool:
    """Do the work; returns True when --check found a failing output."""
    check_flags(options)
    bundle = whole = read_bundle(bundle_path)
    if options.roofline is not None:
        _check_roofline_profile(bundle)
    if options.timeline and not all("timeline" in k for p in bundle.plans for k in p.kernels):
        raise RunError(f"--timeline reads the stamps of a bundle compiled with them, and {bundle_path} has none; "
                       f"recompile it with aicfc compile --timeline")
    rtol = options.rtol
    if rtol is None:
        rtol = TOLERANCE.get(bundle.payload.get("precision"), 1e-4)
    generated = options.timing and not options.input_specs
    # Several plans: the one whose shapes equal the inputs' (a lookup; NoPlanError names the
    # shapes there are), chosen here on the host, before the GPU is touched.
    named = None if options.plan is None else bundle.plans[plan_index([p.inputs for p in bundle.plans], options.plan)]
    if generated:
        bundle = named or whole.plans[0]
        inputs = random_inputs(bundle)
    else:
        inputs = load_inputs(options.input_specs, bundle)
        chosen = plan_for(inputs, bundle)
        if named is not None and named is not chosen:
            raise RunError(f"--plan {options.plan!r} is the plan for {plan_name(named.inputs)}, but the inputs' "
                           f"shapes are {plan_name(chosen.inputs)}'s; drop --plan or pass inputs of its shapes")
        bundle = chosen
    plans = whole.plans
    ran = None if len(plans) == 1 else \
        f"plan {next(i for i, p in enumerate(plans) if p is bundle)} of {len(plans)}: {plan_name(bundle.inputs)}"
    check_model = options.check_model
    if check_model is not None:
        if not os.path.isfile(check_model):
            raise RunError(f"--check model {check_model} does not exist; pass the ONNX model "
                           f"the bundle was compiled from")
        require_onnxruntime()

    bench: BenchReport | None = None
    profile: ProfileReport | None = None
    stamps: TimelineReport | None = None
    device = open_device(options.device_ordinal)
    try:
        check_arch(bundle.arch, device.arch)
        executor = Executor(bundle, device, graph=options.graph)
        # [Note: state] --check gives onnxruntime the state as it was (zeros at load) and
        # compares the updated state with the model's corresponding outputs
        before = executor.state if check_model is not None else {}
        outputs = executor.run(inputs)
        after = executor.state if check_model is not None else {}
        if options.bench is not None:
            bench = executor.bench(options.bench, graph=None if options.graph else False)
        if options.profile:
            profile = executor.profile()
        if options.timeline:
            stamps = executor.timeline()
        gpu = device.name
    finally:
        device.close()

    # With --json, stdout holds the report alone; everything else goes to stderr.
    say = (lambda line: click.echo(line, err=True)) if options.as_json else click.echo
    if ran is not None:
        say(ran)
    if not options.timing or options.output_dir is not None:
        paths = save_outputs(outputs, options.output_dir or ".")
        for name, array in outputs.items():
            say(f"{name}: {array.dtype} {list(array.shape)} -> {paths[name]}")
    if options.timing:
        _report(bundle, gpu, generated, bench, profile, options, stamps)
    if check_model is None:
        return False
    pairs = {item["name"]: item["output"] for item in bundle.payload.get("state", [])}
    rows = check_against_onnx(check_model, {**{n: v.astype("float32") for n, v in before.items()}, **inputs},
                              {**outputs, **{pairs[n]: v for n, v in after.items()}}, rtol)
    click.echo(f"check against {check_model} (onnxruntime CPU, rtol {rtol:g}):")
    click.echo(_table(rows))
    return not all(row.passed for row in rows)


def _report(bundle: Bundle, gpu: str, generated: bool, bench: BenchReport | None,
            profile: ProfileReport | None, options: _Options, stamps: TimelineReport | None = None) -> None:
    inputs = "random standard normal" if generated else "given with --input"
    if options.as_json:
        report: dict[str, Any] = {
            "bundle": str(bundle.path), "model": bundle.payload["model"]["name"],
            "gpu": gpu, "arch": bundle.arch, "precision": bundle.payload["precision"],
            "graph": options.graph, "inputs": inputs}
        if bench is not None:
            report["bench"] = bench.as_dict()
        if profile is not None:
            report["profile"] = profile.as_dict()
        if stamps is not None:
            report["timeline"] = stamps.as_dict()
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"{bundle.payload['model']['name']} on {gpu}; inputs: {inputs}")
        if bench is not None:
            click.echo(format_bench(bench))
        if profile is not None:
            click.echo(format_profile(profile))
        if stamps is not None:
            click.echo(format_timeline(stamps))
    if options.timeline_svg is not None and stamps is not None:
        title = f"{bundle.payload['model']['name']} on {gpu}: the plan's timeline"
        save_svg(options.timeline_svg, timeline_svg(stamps, title))
        click.echo(f"wrote {options.timeline_svg}: {len(stamps.kernels)} kernel(s)", err=True)
    if options.roofline is not None and profile is not None:
        from aicf_run.roofline import plot_roofline
        title = f"{bundle.payload['model']['name']} on {gpu}: measured vs predicted"
        plotted = plot_roofline(bundle.target["profile"], roofline_points(profile),
                                options.roofline, title)
        kernels = len({point.label for point in plotted})
        click.echo(f"wrote {options.roofline}: {kernels} kernel(s), measured beside predicted, "
                   f"on the {bundle.arch} roofline", err=True)


def _check_roofline_profile(bundle: Bundle) -> None:
    profile = bundle.target["profile"]
    peaks = profile.get("peak_tflops")
    if not isinstance(profile.get("dram_bandwidth_gbs"), (int, float)) or not (
            isinstance(peaks, dict) and peaks):
        raise RunError(f"{bundle.path}: the target profile has no dram_bandwidth_gbs and "
                       f"peak_tflops to draw a roofline with; recompile the model with "
                       f"`aicfc compile`, or drop --roofline")


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


def _add_generate() -> None:
    from aicf_run.generate_cli import generate_command
    main.add_command(generate_command, "generate")


_add_generate()
