"""Write one benchmarks/models.py case as the files a user starts from: its ONNX export and
its random inputs, so the CLIs (`aicfc compile`, `aicf-run --profile`, `--check`) and
compute-sanitizer can be run on it as on any model.

    python3 benchmarks/export_case.py resnet50:32 --out-dir /tmp/rn50
        # -> /tmp/rn50/resnet50_b32.onnx and /tmp/rn50/resnet50_b32_inputs.npz

Needs torch (and transformers / torchvision for the case's model); random weights as in
models.py (`build`, `make_inputs`, `export`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import models  # noqa: E402
from benchmarks.models import build, export, make_inputs, parse_cases  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="one MODEL:BATCHxSEQ or CNN:BATCH case, e.g. llama:8x512, resnet50:32")
    ap.add_argument("--out-dir", type=Path, default=Path("."))
    ap.add_argument("--tiny", action="store_true", help="the small configs of models.py --tiny")
    ap.add_argument("--layers", type=int, help="llama only: this many decoder layers instead of models.LLAMA's")
    args = ap.parse_args(argv)
    try:
        (name, batch, seq), = parse_cases(args.case)
    except ValueError as e:
        ap.error(str(e))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_b{batch}" + (f"_s{seq}" if seq else "")
    inputs = make_inputs(name, batch, seq, np.random.default_rng(batch * 1000 + seq), args.tiny)
    if args.layers:
        if name != "llama":
            ap.error("--layers is for the llama case")
        models.LLAMA["num_hidden_layers"] = models.LLAMA_TINY["num_hidden_layers"] = args.layers
        stem += f"_l{args.layers}"
    seconds = export(build(name, args.tiny), inputs, args.out_dir / f"{stem}.onnx")
    np.savez(args.out_dir / f"{stem}_inputs.npz", **inputs)
    print(f"{args.out_dir / stem}.onnx and {stem}_inputs.npz written (export {seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
