"""Hardware profiles: data files in `aicfc/profiles/`, one per target, never code branches."""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aicfc.errors import AicfError

REQUIRED = ("arch", "sm_count", "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm",
            "registers_per_sm", "max_registers_per_thread", "smem_per_sm", "smem_per_block_static",
            "smem_per_block_optin", "l2_bytes", "dram_bandwidth_gbs", "l2_bandwidth_gbs",
            "smem_bandwidth_gbs_per_sm", "peak_tflops", "launch_overhead_us", "efficiency")
MAX_PROFILE_BYTES = 1 << 20   # a profile is a few kB; a larger file is not one


@dataclass(frozen=True)
class Profile:
    data: dict[str, Any]

    def __post_init__(self) -> None:
        # Each entry also as an attribute of the instance: the planner reads a few of them millions of times a
        # compile, and a plain attribute skips __getattr__. A profile's data is never changed after it is made.
        for key, value in self.data.items():
            if key.isidentifier() and not hasattr(type(self), key):
                object.__setattr__(self, key, value)

    def __getattr__(self, key: str) -> Any:
        if key == "data":   # not set yet (copy and pickle make the instance before its fields)
            raise AttributeError(key)
        try:
            return self.data[key]
        except KeyError:
            raise AttributeError(key) from None

    @property
    def arch(self) -> str:
        return self.data["arch"]


def targets() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("aicfc").joinpath("profiles").iterdir()
                  if p.name.endswith(".json"))


def gpus() -> list[str]:
    """The bundled GPU profiles (`aicfc/profiles/gpus/<name>.json`): a target's profile with the
    figures where that GPU differs from the part the target's profile describes."""
    return sorted(p.name[:-5] for p in resources.files("aicfc").joinpath("profiles", "gpus").iterdir()
                  if p.name.endswith(".json"))


def load_profile(target: str, path: str | Path | None = None) -> Profile:
    """The profile for `target`, or the file at `path` (from `aicfc tune`) if given, or the bundled
    GPU profile `path` names (`--profile h200`) when no such file exists."""
    if path is not None and not Path(path).exists() and str(path) in gpus():
        data = json.loads(resources.files("aicfc").joinpath("profiles", "gpus", f"{path}.json").read_text())
    elif path is not None:
        try:
            size = Path(path).stat().st_size
            if size > MAX_PROFILE_BYTES:
                raise ValueError(f"{size} bytes, over {MAX_PROFILE_BYTES}")
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise AicfError(f"--profile {path}: cannot read a JSON hardware profile ({e}); give a file from "
                            f"`aicfc tune` or a bundled GPU ({', '.join(gpus())})") from None
    else:
        if target not in targets():
            raise AicfError(f"--target {target}: unknown target; choose one of {', '.join(targets())}")
        data = json.loads(resources.files("aicfc").joinpath("profiles", f"{target}.json").read_text())
    if not isinstance(data, dict):
        raise AicfError(f"--profile {path}: not a hardware profile (a JSON object of its figures); give a file "
                        f"from `aicfc tune`")
    if "base" in data:   # a GPU's figures over its architecture's (profiles/gpus/*.json, or a copy of one)
        data = dict(data)
        base = data.pop("base")
        if base not in targets():
            raise AicfError(f"--profile {path}: base {base!r} is not a target; use one of {', '.join(targets())}")
        if base != target:
            raise AicfError(f"--profile {path} is an {base} GPU, but --target is {target}; use --target {base}")
        data.pop("comment", None)
        data = {**load_profile(base).data, **data}
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise AicfError(f"hardware profile for {target} lacks {', '.join(missing)}")
    bad = _bad_figure(data)
    if bad:
        raise AicfError(f"hardware profile for {target}: {bad}; fix the file or rerun `aicfc tune`")
    if data["arch"] != target:
        raise AicfError(f"--profile is for {data['arch']}, but --target is {target}; make them agree")
    return Profile(data)


OPTIONAL_RATES = ("sm_l2_port_gbs", "sm_ingress_gbs", "tma_l2_gbs", "tma_port_gbs", "dsmem_gbs")   # rates a profile may add (GB/s), checked where present


def _bad_figure(data: dict) -> str | None:
    """What is wrong with a profile's required figures (None when nothing): every one a positive
    number (`arch` a string; `peak_tflops` and `efficiency` objects of numbers)."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    for key in REQUIRED:
        v = data[key]
        if key == "arch":
            if not isinstance(v, str):
                return f"arch is {type(v).__name__}, not a string such as sm_90"
        elif key in ("peak_tflops", "efficiency"):
            if not isinstance(v, dict) or not all(isinstance(x, str) and number(y) for x, y in v.items()):
                return f"{key} must map names to positive numbers"
        elif not number(v):
            return f"{key} is {json.dumps(v)[:40]}, not a positive number"
    for key in OPTIONAL_RATES:
        if key in data and not number(data[key]):
            return f"{key} is {json.dumps(data[key])[:40]}, not a positive number"
    return None


def plan_launch_us(hw: Profile) -> float:
    """What one more kernel costs a plan: its own launch overhead and the plan's gap.

    [Note: launch overhead and the plan gap]
    `launch_overhead_us` is what a kernel adds to its own work when it runs back to back with
    itself in a graph, which is how `aicf-run --profile` times it (and what the per-kernel
    predictions are held to; `aicfc tune` launches on a stream, which costs more: its fit on an
    H200 in session 10 gave 1.89 us). In a plan a kernel costs more: the kernels before it differ and
    their tails do not overlap its start as well, `plan_gap_us` a kernel more. On an H200 the
    B1 S128 plans of BERT-base and GPT-2 small (85 kernels each) ran 494 and 428 us where their
    kernels alone summed 385 and 346 (1.0-1.3 us a kernel more), and their GEMMs alone measured
    about 1 us under a prediction with a 2.0 us launch term
    (benchmarks/results/gemm_predictions_session10_h200.txt); the sm_90 profile now splits the
    2.0 us into 1.5 + 0.5. A decision that adds or removes a kernel (a separate rotary map, a
    channels-last copy) charges this sum; one that picks among a kernel's schedules is not
    moved by either."""
    return hw.launch_overhead_us + plan_gap_us(hw)


def plan_gap_us(hw: Profile) -> float:
    """What a plan adds to a kernel beyond its launch ([Note: launch overhead and the plan gap]);
    0 for a profile without the entry."""
    return hw.data.get("plan_gap_us", 0.0)


def l2_share_gbs(hw: Profile, active: int) -> float:
    """An active SM's share of the L2's bandwidth (GB/s) while `active` SMs stream from it.

    [Note: L2 share of a small grid]
    The L2 serves `l2_bandwidth_gbs` to the SMs that ask; a grid of fewer blocks than SMs leaves
    the rest idle, and each busy SM can then get l2_bandwidth / active, up to what its own port
    takes (`sm_l2_port_gbs`, GB/s). Charging every SM 1/SMs of the L2 whatever the grid's size
    over-predicts small GEMMs: on an H100 the B1 S128 QKV GEMMs of BERT and GPT-2 (72 CTAs of
    64x64 wgmma tiles) measured 4.30-4.51 us against 5.84 predicted
    (benchmarks/results/gemm_predictions_session8_h100.txt). How much one SM can take: ResNet-50's
    stage-4 batched 1x1 GEMMs, full grids, streamed about 130 GB/s an SM where the model allowed
    76 (profile_resnet50_b32_session7_h100.txt), so a port of 130 GB/s or more.
    With a port of 130 GB/s the QKV kernels' clustered 7-stage schedule is predicted 5.65 us
    rather than 5.84: its k-blocks are then bound by the TMA round trip the ring covers
    (tma_latency_us + cluster_release_us over 6 stages), not by the L2; and the picks move (the QKV
    GEMMs leave clusters for 8 stages, predicted 4.88; GPT-2's B1 FFN1 goes from a wgmma tile
    measured at 5.09 us to an mma tile not yet measured). Timed on an H200 with the port at 130
    (benchmarks/results/gemm_predictions_port_session10_h200.txt against the default's run): the
    QKV GEMMs without clusters ran 3.89 us against 4.40, but GPT-2's FFN1 on the mma tile 6.45 us
    against 5.22 on wgmma (the wgmma tile's prediction, 7.3 us, is the one that is off). So the
    term stays off (the old share, whatever the grid) until the wgmma model ranks those two
    right; `benchmarks/gemm_predictions.py --profile F` plans with such a profile. Tried again on an
    H200 in session 22 (benchmarks/results/images_as_rows_session22_h200.txt), for ResNet-50 B32's 1x1
    GEMMs taken as one GEMM of all the images' pixels ([Note: images as rows] in codegen/gemm_wgmma.py):
    stage 3's 1024 -> 256 ones run one 128x128 tile on each of 98 SMs where the batched ones filled 128, and
    measured 7.7-7.9 us against 8.7 for the same prediction, 10.5 us; a port of 130 predicts 9.2. But the
    h200 profile with that port moved 32 of the Llama B1 S512 prefill's GEMMs to 64-CTA grids of 128
    columns, whose plan ran 890.3 us against 831.3, and 13 of ResNet-50 B1's kernels (301.8 against 300.6
    us). So it stays off there too. The GEMM engine's TMA loads take their own share since session 26
    ([Note: the TMA's share of L2] in planner/cost_wgmma.py: `tma_l2_gbs` and `tma_port_gbs`), fitted
    on 238 measured wgmma kernels together with the cheaper k-splits that keep the larger grids competitive."""
    port = hw.data.get("sm_l2_port_gbs")
    full = hw.l2_bandwidth_gbs / hw.sm_count
    if port is None:
        return full
    active = max(1, min(active, hw.sm_count))
    return min(hw.l2_bandwidth_gbs / active, max(port, full))


def blocks_per_sm(threads: int, smem: int, regs: int, hw: Profile) -> tuple[int, str]:
    """Resident blocks per SM and the resource that limits it."""
    return _blocks_per_sm(threads, smem, regs, hw.max_threads_per_sm, hw.max_blocks_per_sm, hw.registers_per_sm,
                          hw.smem_per_sm)


@functools.lru_cache(maxsize=1 << 14)   # asked for every candidate the planner ranks, twice
def _blocks_per_sm(threads: int, smem: int, regs: int, max_threads_per_sm: int, max_blocks_per_sm: int,
                   registers_per_sm: int, smem_per_sm: int) -> tuple[int, str]:
    warps = math.ceil(threads / 32)
    regs_per_block = math.ceil(warps * 32 * max(regs, 1) / 256) * 256   # allocation granularity
    limits = {
        "threads": max_threads_per_sm // (warps * 32),
        "blocks": max_blocks_per_sm,
        "registers": registers_per_sm // regs_per_block,
        "shared memory": smem_per_sm // smem if smem else max_blocks_per_sm,
    }
    which = min(limits, key=lambda k: limits[k])
    return limits[which], which
