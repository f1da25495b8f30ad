"""Hardware profiles: data files in `aicfc/profiles/`, one per target, never code branches."""
from __future__ import annotations

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


@dataclass(frozen=True)
class Profile:
    data: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
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


def load_profile(target: str, path: str | Path | None = None) -> Profile:
    """The profile for `target`, or the file at `path` (from `aicfc tune`) if given."""
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise AicfError(f"--profile {path}: cannot read a JSON hardware profile ({e})") from None
    else:
        if target not in targets():
            raise AicfError(f"--target {target}: unknown target; choose one of {', '.join(targets())}")
        data = json.loads(resources.files("aicfc").joinpath("profiles", f"{target}.json").read_text())
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise AicfError(f"hardware profile for {target} lacks {', '.join(missing)}")
    if data["arch"] != target:
        raise AicfError(f"--profile is for {data['arch']}, but --target is {target}; make them agree")
    return Profile(data)


def blocks_per_sm(threads: int, smem: int, regs: int, hw: Profile) -> tuple[int, str]:
    """Resident blocks per SM and the resource that limits it."""
    warps = math.ceil(threads / 32)
    regs_per_block = math.ceil(warps * 32 * max(regs, 1) / 256) * 256   # allocation granularity
    limits = {
        "threads": hw.max_threads_per_sm // (warps * 32),
        "blocks": hw.max_blocks_per_sm,
        "registers": hw.registers_per_sm // regs_per_block,
        "shared memory": hw.smem_per_sm // smem if smem else hw.max_blocks_per_sm,
    }
    which = min(limits, key=lambda k: limits[k])
    return limits[which], which
