"""`aicfc`: compile, check, explain and tune. User errors print one line and exit with code 2."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import click

from aicfc import __version__
from aicfc.errors import AicfError

MAX_SHAPE_SETS_BYTES = 1 << 20   # one line a plan: a larger --shape-sets file is not one

EXIT_USAGE = 2


def _fail(message: str) -> NoReturn:
    click.echo(f"aicfc: error: {message}", err=True)
    sys.exit(EXIT_USAGE)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every user-caused failure into one line on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from aicf_run.errors import RunError
        try:
            return fn(*args, **kwargs)
        except (AicfError, RunError) as e:
            _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        except OSError as e:
            _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
        except KeyboardInterrupt:
            _fail("interrupted; nothing was written")
    return wrapper


class OneLineGroup(click.Group):
    """click's usage errors (a folder where a file is expected, an unknown option) as one line
    and exit code 2, like every other user error, instead of click's usage block."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            first = e.format_message().splitlines()[0] if e.format_message() else ""
            if first.startswith("Usage:"):   # no command at all: click's message is the help text
                first = f"no command given; choose one of {', '.join(sorted(self.commands))}"
            _fail(first + hint)
        except click.ClickException as e:
            _fail(e.format_message().splitlines()[0])
        except click.Abort:
            _fail("interrupted; nothing was written")
        sys.exit(rv if type(rv) is int else 0)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aicfc")
def main() -> None:
    """AICF: an ahead-of-time compiler from ONNX to CUDA that explains every decision."""


shape_option = click.option("--shape", "shapes", multiple=True, metavar="NAME=DxD",
                            help="Static shape for an input with symbolic dimensions, e.g. x=2x64.")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.aicf).")
@click.option("--target", default="sm_90", show_default=True, help="GPU architecture (sm_80, sm_86, sm_89, sm_90).")
@click.option("--precision", default="fp32", show_default=True,
              help="Precision policy: fp32 (exact), tf32, fp16 or bf16 (see `aicfc explain`).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DxD",
              help="Static shape for an input with symbolic dimensions, e.g. x=2x64. Naming an input "
                   "again starts a new shape set: each set is one plan of the bundle, all over one copy "
                   "of the weights (e.g. --shape ids=1x512 --shape ids=1x1: two plans); aicf-run picks "
                   "the plan whose shapes equal the inputs'.")
@click.option("--shape-sets", "shape_sets_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Shape sets from FILE instead of --shape: one set per line, e.g. `ids=1x512 mask=1x512` "
                   "(# starts a comment); one plan per line. A word pin:[NODE:]KEY=VALUE on a line "
                   "pins that plan alone, as --pin does every plan.")
@click.option("--pin", "pins", multiple=True, metavar="[NODE:]KEY=VALUE",
              help="Restrict every schedule space that has KEY to VALUE (e.g. unit=simt, BM=64), or with "
                   "NODE: only the kernel covering that ONNX node (e.g. node_matmul_115:unit=gemv; "
                   "`aicfc explain` lists each kernel's nodes); for experiments: the cost model still "
                   "ranks what is left.")
@click.option("--no-inplace", is_flag=True,
              help="Give every stored tensor bytes of its own (no in-place reuse); for debugging.")
@click.option("--no-register-check", is_flag=True,
              help="Rank schedules on estimated registers alone: no ptxas runs while planning (faster, "
                   "blind to the occupancy ptxas's real counts give).")
@click.option("--no-pdl", is_flag=True,
              help="Launch the kernels plainly, one after the other finishes, instead of as dependent launches "
                   "(sm_90: each kernel launched while the previous one runs, waiting for it on the device).")
@click.option("--timeline", is_flag=True,
              help="Make every kernel record when its blocks reach the SMs and when it may start, for "
                   "`aicf-run --timeline` (how the plan's kernels overlap as they run); the kernels are "
                   "otherwise unchanged.")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="Write the IR after every pass into this folder.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Calibrated hardware profile (JSON, from `aicfc tune`), or a bundled GPU's: h200.")
@click.option("-j", "--jobs", type=int, metavar="N",
              help="Parallel nvcc runs, and at most N CUDA modules [default: $AICF_JOBS or the CPU count].")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
@user_errors
def compile(model: str, output: str, target: str, precision: str, shapes: tuple[str, ...],
            shape_sets_path: str | None, pins: tuple[str, ...],
            no_inplace: bool, no_register_check: bool, no_pdl: bool, timeline: bool, dump_ir: str | None,
            profile_path: str | None,
            jobs: int | None, quiet: bool) -> None:
    """Compile MODEL (ONNX) into a bundle for aicf-run: one plan, or one per shape set."""
    from aicfc.artifact import write_bundle
    from aicfc.artifact.plans import merge_plans
    from aicf_run.schema import kernel_records
    from aicfc.codegen.module import ModuleBuild, resolve_jobs
    from aicfc.driver import compile_model, parse_pins, shape_sets
    from aicfc.passes.pipeline import PIPELINE

    jobs = resolve_jobs(jobs)  # a bad --jobs fails before anything runs
    try:
        if shape_sets_path and Path(shape_sets_path).stat().st_size > MAX_SHAPE_SETS_BYTES:
            raise AicfError(f"--shape-sets {shape_sets_path}: over {MAX_SHAPE_SETS_BYTES} bytes; a shape-set file "
                            f"holds one short line per plan")
        lines = Path(shape_sets_path).read_text().splitlines() if shape_sets_path else None
    except UnicodeDecodeError:
        raise AicfError(f"--shape-sets {shape_sets_path}: not a text file; write one shape set per line") from None
    sets = shape_sets(shapes, lines) or [[]]
    stages = {s.name for s in PIPELINE}
    modules = cached = 0

    def count(done: int, total: int, module: ModuleBuild | None) -> None:
        nonlocal modules, cached
        if module is not None:
            modules += 1
            cached += module.built.cached

    options: dict[str, Any] = dict(target=target, precision=precision, profile_path=profile_path, jobs=jobs,
                                   pin=parse_pins(pins), inplace=not no_inplace, check_registers=not no_register_check,
                                   dependent_launch=not no_pdl, timeline=timeline)

    def one_plan(index: int, shapes: list[str]) -> dict[str, Any]:
        folder = dump_ir if dump_ir is None or len(sets) == 1 else str(Path(dump_ir) / f"plan_{index}")
        if folder is not None and len(sets) > 1:
            Path(folder).mkdir(parents=True, exist_ok=True)
        if quiet or not sys.stderr.isatty():
            # No terminal to redraw a bar on: print nothing until there is a result or an error.
            return compile_model(model, shapes=shapes, dump_ir=folder, **options, on_kernel=count)
        # One step per pipeline stage and one per kernel; the kernel count is known only when
        # nvcc starts, so the bar holds one placeholder step for it until then.
        label = f"compiling {Path(model).name}" + (f" plan {index + 1}/{len(sets)}" if len(sets) > 1 else "")
        with click.progressbar(length=len(stages) + 1, label=label, file=sys.stderr,
                               show_pos=True, item_show_func=lambda s: s or "") as bar:
            shown = 0

            def stage(name: str) -> None:
                bar.update(1 if name in stages else 0, name)

            def kernel(done: int, total: int, module: ModuleBuild | None) -> None:
                nonlocal shown
                count(done, total, module)
                if module is None:
                    bar.length = len(stages) + total
                bar.update(done - shown, f"nvcc {done}/{total} kernels")
                shown = done
            return compile_model(model, shapes=shapes, dump_ir=folder, **options, on_stage=stage, on_kernel=kernel)

    plans = [one_plan(i, shapes) for i, shapes in enumerate(sets)]
    payload = plans[0] if len(plans) == 1 else merge_plans(plans)
    write_bundle(payload, output)
    if not quiet:
        size = Path(output).stat().st_size
        kernels = sum(len(p["kernels"]) for p in plans)
        total = sum(r["predicted"]["time_us"] for r in kernel_records(plans[0]["kernels"]))
        several = "" if len(plans) == 1 else f" ({len(plans)} plans, one per shape set, weights stored once)"
        click.echo(f"wrote {output}: {kernels} kernel(s) in {modules} module(s) ({cached} cached) "
                   f"for {target}{several}, {size} bytes, predicted {total:.1f} us"
                   f"{' for the first plan' if len(plans) > 1 else ''}; "
                   f"run `aicfc explain {output}` for the decisions")


@main.command()
@click.option("--markdown", is_flag=True, help="Print the README's support table.")
def ops(markdown: bool) -> None:
    """List the supported ONNX ops and which variants of each work."""
    from aicfc.ir import support
    if markdown:
        click.echo(support.markdown())
        return
    for op in support.claimed():
        click.echo(f"{op:<20} {support.NOTES[op]}".rstrip())


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@shape_option
@user_errors
def check(model: str, shapes: tuple[str, ...]) -> None:
    """List every op in MODEL the compiler does not support (all at once), then check shapes."""
    from aicfc.frontend.onnx_import import find_unsupported, import_model, load_model, parse_shape_overrides
    from aicfc.ir.support import claimed

    proto = load_model(model)
    bad = find_unsupported(proto)
    if bad:
        click.echo(f"{model}: {len(bad)} unsupported node(s):")
        for node, op in bad:
            click.echo(f"  {op:<24} node {node!r}")
        click.echo(f"supported ops (`aicfc ops` says which variants): {', '.join(claimed())}")
        sys.exit(1)
    graph = import_model(proto, parse_shape_overrides(shapes))
    click.echo(f"{model}: all {len(proto.graph.node)} node(s) supported; "
               f"inputs {', '.join(f'{v.name}: {v.type}' for v in graph.inputs)}")


@main.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a stable interface).")
@click.option("--ir", type=click.Choice(["high", "lowered", "decision"]), help="Print one IR level's text instead.")
@click.option("--source", is_flag=True, help="Print the generated CUDA source instead.")
@click.option("--roofline", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also plot every kernel on the target's roofline into FILE (.png, .svg or .pdf).")
@user_errors
def explain(bundle: str, as_json: bool, ir: str | None, source: bool, roofline: str | None) -> None:
    """Every decision in BUNDLE: what was chosen, why, predicted cost, what it beat; for a bundle
    of several plans, a summary line per plan, then every plan (its shapes and its decisions)."""
    from aicf_run.bundle import read_bundle
    from aicf_run.plans import plan_name
    from aicfc.explain import explain_json, explain_plans_json, explain_plans_text, explain_text

    if roofline:
        from aicfc.roofline import check_path
        check_path(roofline)  # a bad name fails before the bundle is read
    read = read_bundle(bundle)
    payload = read.payload
    views = [plan.payload for plan in read.plans]   # several: one per set of input shapes
    if roofline:
        from aicfc.roofline import plot_roofline, points_from_payload
        target = payload["target"]
        profile = target["profile"]
        title = f"{payload['model']['name']}, predicted, on {target['arch']}: {profile.get('name') or 'custom profile'}"
        plotted = plot_roofline(profile, [pt for v in views for pt in points_from_payload(v)], roofline, title)
        left_out = sum(len(v["kernels"]) for v in views) - len(plotted)
        note = f" ({left_out} without FLOPs, bytes or time left out)" if left_out else ""
        # On stderr, so that --json, --ir and --source keep stdout for what they print.
        click.echo(f"wrote {roofline}: {len(plotted)} kernel(s) on the {target['arch']} roofline{note}", err=True)
    several = len(views) > 1

    def heading(i: int, view: dict[str, Any], comment: str) -> None:
        if several:
            click.echo(f"{comment} plan {i} of {len(views)}: {plan_name(view['inputs'])}")
    if ir:
        for i, view in enumerate(views):
            heading(i, view, "#")
            click.echo(view["ir"][ir], nl=False)
    elif source:
        for i, view in enumerate(views):
            heading(i, view, "//")
            for m in view["modules"]:
                click.echo(m["source"])
    elif as_json:
        click.echo(json.dumps(explain_plans_json(views) if several else explain_json(payload), indent=1))
    elif several:
        click.echo(explain_plans_text(views, read.section_bytes), nl=False)
    else:
        click.echo(explain_text(payload), nl=False)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", help="GPU architecture to plan and build for [default: the GPU's own].")
@click.option("--precision", default="fp32", show_default=True, help="Numeric precision policy.")
@shape_option
@click.option("--top", default=8, show_default=True, type=int, help="Measure the model's N cheapest candidates per kernel.")
@click.option("--spread", default=8, show_default=True, type=int,
              help="And N more spaced evenly through the rest of the ranking.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), help="Hardware profile to start from (JSON).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the fitted profile (JSON) here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the whole report (JSON) here.")
@click.option("--kernel", "kernels", multiple=True, metavar="NAME",
              help="Tune only this kernel (k13) or the kernel covering this ONNX node; repeat for more "
                   "[default: every kernel].")
@user_errors
def tune(model: str, target: str | None, precision: str, shapes: tuple[str, ...], top: int, spread: int,
         profile_path: str | None, output: str | None, json_path: str | None, kernels: tuple[str, ...]) -> None:
    """Measure MODEL's candidate schedules on this GPU; report predicted vs measured and fit the profile."""
    from aicfc.tune import fit_profile, tune_model

    for path in (output, json_path):   # fail before measuring, not after
        if path and not Path(path).resolve().parent.is_dir():
            raise AicfError(f"{path}: its folder does not exist")
    options: dict[str, Any] = dict(target=target, precision=precision, shapes=list(shapes), top=top,
                                   spread=spread, profile_path=profile_path, kernels=list(kernels))
    if not sys.stderr.isatty():
        report = tune_model(model, **options)
    else:
        with click.progressbar(length=1, label=f"tuning {Path(model).name}", file=sys.stderr, show_pos=True,
                               item_show_func=lambda s: s or "") as bar:
            shown = 0

            def progress(done: int, total: int, label: str) -> None:
                nonlocal shown
                bar.length = total
                bar.update(done - shown, label)
                shown = done
            report = tune_model(model, **options, on_progress=progress)
    fitted, stats = fit_profile(report, report.profile)
    click.echo(_tune_text(report, stats), nl=False)
    if output:
        _write_atomic(output, json.dumps(fitted, indent=2) + "\n")
        click.echo(f"wrote {output}: fitted {report.target} profile; use it with "
                   f"`aicfc compile --target {report.target} --profile {output}`")
    if json_path:
        _write_atomic(json_path, json.dumps({**report.to_json(), "fit": stats}, indent=1) + "\n")
        click.echo(f"wrote {json_path}: the report")


def _tune_text(report: Any, stats: dict[str, Any]) -> str:
    """Per kernel: every measured candidate (* the model's pick, + the fastest); then a summary."""
    def num(x: float | None, fmt: str = ".2f") -> str:
        return "n/a" if x is None or x != x else format(x, fmt)

    lines = [f"{report.model} on {report.gpu} ({report.target}, {report.precision}): "
             f"* the model's pick, + the fastest measured"]
    for kt in report.kernels:
        pick, fastest = kt.pick, kt.fastest
        ratio = kt.pick_ratio
        lines.append("")
        lines.append(f"{kt.name} ({kt.family}): {len(kt.measured)} of {kt.feasible} feasible candidates measured; "
                     f"pick {num(ratio)}x the fastest; Spearman {num(kt.spearman)}")
        lines.append(f"  {'':2} {'rank':>5}  {'params':<48} {'predicted us':>12} {'measured us':>12}")
        for c in kt.candidates:
            mark = ("*" if c is pick else " ") + ("+" if c is fastest else " ")
            params = " ".join(f"{k}={v}" for k, v in c.params.items())
            measured = num(c.measured_us) if c.measured_us is not None else f"failed: {c.failed}"
            lines.append(f"  {mark} {c.rank:>5}  {params:<48} {c.predicted_us:>12.2f} {measured:>12}")
    good, total = report.picks_within()
    count = sum(len(kt.measured) for kt in report.kernels)
    lines += ["",
              f"Spearman rank correlation over all {count} measured candidates: {num(report.spearman, '.3f')} "
              f"(goal >= 0.8); per-kernel mean {num(report.mean_spearman, '.3f')}",
              f"model's pick within 10% of the fastest measured: {good} of {total} kernels",
              f"fit: mean squared log error {num(stats['msle_before'], '.4f')} -> {num(stats['msle_after'], '.4f')}; "
              f"Spearman {num(stats['spearman_before'], '.3f')} -> {num(stats['spearman_after'], '.3f')}; "
              f"picks within 10% {num(stats['picks_within_10pct_before'], '.0%')} -> "
              f"{num(stats['picks_within_10pct_after'], '.0%')}"]
    changed = [f"{f} {old:g} -> {new:g}" for f, (old, new) in stats["fields"].items() if old != new]
    lines.append(f"fitted: {', '.join(changed) if changed else 'no coefficient changed'}")
    return "\n".join(lines) + "\n"


def _write_atomic(path: str, text: str) -> None:
    """Write `path` through a temporary file in its folder, so a reader never sees half of it."""
    import os
    import tempfile
    folder = Path(path).resolve().parent
    fd, tmp = tempfile.mkstemp(prefix=f".{Path(path).name}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
