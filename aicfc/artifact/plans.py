"""Single-plan payloads → one version-3 payload over one copy of the weights ([Note: plans]
in aicf_run/plans.py).

Each shape set was compiled on its own; here the weights become blobs shared by content
(sha256 and length: a folded constant that depends on the shape differs, so it is never
shared by name alone), and every plan's weights buffers are laid out again in one weights
region where a shared blob has one offset. Within a plan each buffer keeps a blob of its own,
even where two buffers hold equal bytes (split-k tickets are written by their kernels).
"""
from __future__ import annotations

from typing import Any

from aicf_run.plans import PLANS_VERSION, SHARED_KEYS, plan_name
from aicf_run.weights import data_len

# Offsets in the weights region are multiples of this (TMA needs 16 bytes; 256 as the arena).
ALIGN = 256


def merge_plans(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One version-3 payload (weights inline, as `aicfc.compile` returns) of `payloads`, each a
    single-plan payload of the same model, target and precision, in that order."""
    first = payloads[0]
    for p in payloads[1:]:
        for key in ("compiler", "target", "precision", "model"):
            if p[key] != first[key]:
                raise ValueError(f"plans to merge differ in {key}; they must come from one compile")
    blobs: list[dict[str, Any]] = []
    slots: list[tuple[str, int, int]] = []   # (sha256, nbytes, region offset) per blob
    end = 0
    plans = []
    for payload in payloads:
        buffers = [dict(b) for b in payload["buffers"]]
        entries, used = [], set()
        for weight in payload["weights"]:
            nbytes = data_len(weight["data"])
            blob = next((i for i, (digest, size, _) in enumerate(slots)
                         if i not in used and digest == weight["sha256"] and size == nbytes), None)
            if blob is None:
                blob = len(slots)
                slots.append((weight["sha256"], nbytes, end))
                blobs.append({"data": weight["data"], "sha256": weight["sha256"]})
                end += -(-nbytes // ALIGN) * ALIGN
            used.add(blob)
            buffers[weight["buffer"]]["offset"] = slots[blob][2]
            entries.append({"buffer": weight["buffer"], "blob": blob})
        plans.append({**{k: v for k, v in payload.items() if k not in SHARED_KEYS},
                      "buffers": buffers, "weights": entries})
    for plan in plans:
        plan["memory"] = {**plan["memory"], "weights_bytes": end}
    names = [plan_name(p["inputs"]) for p in plans]
    if len(set(names)) != len(names):
        raise ValueError(f"two plans have the same input shapes: {names}")
    return {**{k: first[k] for k in SHARED_KEYS if k != "weights"}, "format_version": PLANS_VERSION,
            "weights": blobs, "plans": plans}
