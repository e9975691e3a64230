"""Issue 50's goals, read from the JSON files bench/gpu_benches.sh wrote into one folder: each goal
with its measured value and whether it is met, written as OUT/gpu_goals.json and printed.

    python bench/gpu_goals.py OUT_FOLDER [SUFFIX]    # SUFFIX of the files' names: _cuda (default)

Goals: SGR and SAF steps ≤ 20 ms and VSRN's ≤ 30 ms in the precision the protocol chooses
(``precision.mixed_precision_measured``: fp32 for the pairwise networks, bf16 autocast for VSRN;
both are listed); host time ≤ 15% of a step (``host_fraction``) for SGR, SAF, VSRN and the cached
dual trainer; the dual trainer ≥ 0.9 of the bare loop's steps/s; peak GPU memory below the
authors'. A file that is missing leaves its goals ``null`` (not measured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEP_GOAL_S = {"sgr": 0.020, "saf": 0.020, "vsrn": 0.030}
PROTOCOL_KIND = {"sgr": "ours", "saf": "ours", "vsrn": "ours_bf16"}  # fp32 pairwise, bf16 dual


def _read(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else None


def goals(folder: Path, suffix: str = "_cuda") -> dict:
    out, device = {}, None
    for network, name in (("sgr", f"train_pairwise{suffix}.json"), ("saf", f"train_pairwise{suffix}.json"),
                          ("vsrn", f"train_pairwise_vsrn{suffix}.json")):
        entry = ((_read(folder, name) or {}).get("networks") or {}).get(network)
        if entry is None:
            out[f"{network}_step"] = None
            continue
        device = device or _read(folder, name).get("device")
        median = entry["median_step_s"]
        kind = PROTOCOL_KIND[network] if PROTOCOL_KIND[network] in median else "ours"
        out[f"{network}_step"] = {"s": median[kind], "kind": kind, "goal_s": STEP_GOAL_S[network],
                                  "met": median[kind] <= STEP_GOAL_S[network],
                                  "all_kinds_s": median,
                                  "over_authors": entry.get("speedup_ours_over_authors")}
        memory = entry.get("peak_cuda_mb") or {}
        if memory.get("authors") and memory.get(kind):
            out[f"{network}_peak_memory"] = {"ours_mb": memory[kind], "authors_mb": memory["authors"],
                                             "met": memory[kind] < memory["authors"]}
    for network, name in (("sgr", f"train_pairwise_profile{suffix}.json"),
                          ("saf", f"train_pairwise_profile{suffix}.json"),
                          ("vsrn", f"vsrn_step_profile{suffix}.json")):
        profiled = ((_read(folder, name) or {}).get("networks") or {})
        fractions = {k: v.get("host_fraction") for k, v in profiled.items() if k.split("_")[0] == network}
        share = fractions.get(network if PROTOCOL_KIND[network] == "ours" else f"{network}_ours_bf16")
        out[f"{network}_host_fraction"] = (None if not isinstance(share, (int, float)) else
                                           {"value": share, "goal_max": 0.15, "met": share <= 0.15,
                                            "all_kinds": fractions})
    dual = _read(folder, f"dual_step{suffix}.json")
    if dual is None:
        out["dual_ours_over_bare"] = out["dual_host_fraction"] = None
    else:
        out["dual_ours_over_bare"] = {"value": dual["ours_over_bare"], "goal_min": 0.9,
                                      "met": dual["ours_over_bare"] >= 0.9}
        host = dual["host_fraction"]["ours"] if isinstance(dual["host_fraction"], dict) else None
        out["dual_host_fraction"] = (None if host is None else
                                     {"value": host, "goal_max": 0.15, "met": host <= 0.15,
                                      "bare_loop": dual["host_fraction"]["bare"]})
    measured = [g for g in out.values() if g is not None and "met" in g]
    one_chunk = (_read(folder, f"train_pairwise_one_chunk{suffix}.json") or {}).get("networks") or {}
    alternative = {}
    for network, entry in one_chunk.items():  # gpu_benches.sh's pairwise_one_chunk: a choice, not a goal
        step = entry["median_step_s"].get("ours", 1.0)
        alternative[network] = {"s": step, "met": step <= STEP_GOAL_S[network],
                                "peak_cuda_mb": entry.get("peak_cuda_mb")}
    return {"device": device, "goals": out, "met": sum(g["met"] for g in measured),
            "measured": len(measured), "not_measured": sorted(k for k, g in out.items() if g is None),
            "one_chunk_alternative": alternative or None}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0] if argv else "bench/results")
    report = goals(folder, argv[1] if len(argv) > 1 else "_cuda")
    text = json.dumps(report, indent=2)
    (folder / "gpu_goals.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
