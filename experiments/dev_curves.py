"""The validation rsum of each epoch, over seeds: did a method recover later, or collapse later?

    python experiments/dev_curves.py 'runs/precision/saf_fp32/*' 'runs/precision/sgr_fp32/*' > dev_rsum.md

Reads each run's metrics.jsonl (the records `vse train` writes at each validation) and groups the
runs by folder and run name without its seed (``saf_fp32/method=mh``); a row per group, a column per
epoch: mean ± standard deviation (ddof 1) over the seeds, and the seeds' own values. A run still
training counts for the epochs it has validated; a column says how many seeds it holds.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import sys
from pathlib import Path

SEED = re.compile(r",?seed=\d+")


def epoch_rsums(run: Path) -> dict[int, float]:
    """{epoch: rsum} of a run's epoch-end validations (the last record of each epoch)."""
    records = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "rsum" in record and "epoch" in record:
            records[int(record["epoch"])] = float(record["rsum"])
    return records


def groups(patterns: list[str]) -> dict[str, dict[str, dict[int, float]]]:
    """{group: {run name: {epoch: rsum}}} of the runs the globs match that have validated."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for pattern in patterns:
        for path in sorted(map(Path, glob.glob(pattern))):
            if not (path / "metrics.jsonl").is_file():
                continue
            group = f"{path.parent.name}/{SEED.sub('', path.name)}"
            out.setdefault(group, {})[path.name] = epoch_rsums(path)
    return out


def table(found: dict[str, dict[str, dict[int, float]]]) -> str:
    epochs = sorted({e for runs in found.values() for rsums in runs.values() for e in rsums})
    lines = ["| runs | " + " | ".join(f"epoch {e}" for e in epochs) + " |",
             "|:---|" + "---:|" * len(epochs)]
    for group, runs in found.items():
        cells = []
        for epoch in epochs:
            values = [rsums[epoch] for rsums in runs.values() if epoch in rsums]
            if not values:
                cells.append("")
                continue
            spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
            seeds = " ".join(f"{v:.0f}" for v in values)
            cells.append(f"{statistics.mean(values):.1f}{spread} (n {len(values)}: {seeds})")
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (globs, quoted)")
    args = parser.parse_args(argv)
    found = groups(args.runs)
    if not found:
        print(f"error: no run with a metrics.jsonl matches {' '.join(args.runs)}", file=sys.stderr)
        return 1
    print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
