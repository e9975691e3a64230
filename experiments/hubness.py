"""The hubness measurement (issue 61): every test-time correction against hubness (``isf``, ``csls``,
``qbnorm``, ``nnn``, and ``dsl``, transductive) on trained networks, over their seeds.

    PYTHONPATH=. python experiments/hubness.py [--runs-dir runs/f8k] [--judgments FILE] [--device auto]
    PYTHONPATH=. python experiments/hubness.py --dry-run      # each step and its state, nothing run

Runs (``SOURCES``): the fast loop's mh and infonce (experiments/f8k_fast.yaml, its 5 seeds) and the
noisy table's mh at caption 50% (experiments/f8k_noisy.yaml, its 3 seeds), where hubs should be
worst; each source is a sweep file and the KEY=VALUE its runs' names hold (the seeds are the file's),
or ``--sweep FILE:KEY=VALUE,...`` / ``--runs GLOB`` instead. A run not finished yet (no
sweep-done.json, last.pt short of its epochs) is left for a later call.

Steps, each skipped when its file exists and is newer than what it is made from:

1. ``OUT/runs/RUN.csv``, one per run: `vse evaluate --runs RUN --split test --rescore isf --rescore
   csls --rescore qbnorm --rescore dsl --rescore nnn --transductive --judgments J` (the library
   call of that command): the plain row and one row per method, named ``RUN + METHOD``, each with
   the human-judged metrics of its own scores (``--judgments``, default the Flickr8k CrowdFlower
   file; a re-scored row's from its corrected matrices); each method with its authors' defaults and
   the protocol's bank (the whole training split; docs/PROTOCOL.md, "Re-scoring at test time").
   ``--transductive`` only lets dsl run: the other methods' bank is the training split, so their rows
   stay inductive; dsl's says ``(transductive)``. A run's file written before re-scored rows were
   judged (its re-scored rows without mAP@R) is evaluated again when judgments are given.
2. ``OUT/results.csv``: the runs' rows together.
3. ``OUT/claims.json``: experiments/claims/hubness.yaml's claims ("METHOD helps NETWORK": the
   re-scored group against the plain group, Welch one-sided over seeds) on ``OUT/results.csv``.
4. ``OUT/table.md``: per configuration, mean ± std (n) over seeds of R@1/5/10 both ways, rsum,
   mAP@R (human-judged, both ways; a re-scored row's of its corrected scores), the hubness (the
   skewness of N_10, both ways), the verdict of its rsum claim, and the cost of its correction
   (``COST``: a re-scored row's whole time, its bank's k-NN included, over one evaluation, measured
   by bench/rescore.py on a synthetic 5K × 25K split).

The bank's size (``BANK_SIZES``): ``--rescore-bank-size N --out OUT_bankN`` runs the same steps with a
bank of the training split's first N images, and ``--bank-table`` writes ``OUT/bank_sizes.md`` (each
configuration's rsum and verdict at each size) and ``OUT/bank_costs.md`` (each method's cost at the
sizes the cost bench measured, ``BANK_COSTS``). `make f8k-hubness` runs every size, then the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.core.errors import VseError  # noqa: E402

SOURCES = (("experiments/f8k_fast.yaml", ("method=mh",)),
           ("experiments/f8k_fast.yaml", ("method=infonce",)),
           ("experiments/f8k_noisy.yaml", ("noise=caption50", "method=mh")))
OUT = ROOT / "bench" / "results" / "f8k_hubness"
CLAIMS = ROOT / "experiments" / "claims" / "hubness.yaml"
JUDGMENTS = ROOT.parent / "shared" / "data" / "flickr8k" / "CrowdFlowerAnnotations.txt"
COST, COST_KEY = ROOT / "bench" / "results" / "rescore_cost.json", "row_over_evaluation"
SPLIT = "test"
# the bank's size: the training split whole (the protocol's bank), then its first N images and their
# captions (--rescore-bank-size N), each arm in its own folder (bank_folder); and the cost bench at two
# bank sizes, the split's own and a fifth of it (bench/rescore.py --bank-images 5000|1000 --threads 1
# --indexes, run back to back: their ratios over the evaluation compare)
BANK_SIZES = (None, 1000, 500)  # 500: still above nnn's k (256)
BANK_TABLES = ("bank_sizes.md", "bank_costs.md")  # --bank-table's files in OUT: gains, then costs
BANK_COSTS = {"5,000 (the split's size)": ROOT / "bench" / "results" / "rescore_cost_bank5000.json",
              "1,000 (a fifth)": ROOT / "bench" / "results" / "rescore_cost_bank1000.json"}


def bank_folder(bank_size: int | None, out: Path = OUT) -> Path:
    """The results folder of one bank size: OUT for the whole training split, else OUT_bankN."""
    return out if bank_size is None else out.with_name(f"{out.name}_bank{bank_size}")


# ---------------------------------------------------------------------------- inputs

def source_runs(sweeps=(), patterns=(), runs_dir=None) -> list[Path]:
    """The run folders of ``sweeps`` ("FILE:KEY=VALUE,...", FILE relative to the repository; their
    runs under ``runs_dir`` when given, as `vse sweep --runs-dir`, else the file's) and ``patterns``
    (globs); ``SOURCES`` when neither is given. VseError when two share a folder name (the table
    names a run by its folder)."""
    from pipeline.training.run_folder import find_runs
    from pipeline.training.sweep import load_sweep

    given = [(file, tuple(filter(None, only.split(",")))) for file, _, only in
             (s.partition(":") for s in sweeps)] if sweeps or patterns else list(SOURCES)
    runs = [run.run_dir for file, only in given
            for run in load_sweep(ROOT / file, runs_dir=runs_dir, only=only).runs]
    runs += find_runs(patterns) if patterns else []
    runs = list(dict.fromkeys(as_given(Path(r)) for r in runs))
    names = {}
    for run in runs:
        if run.name in names:
            raise VseError(f"two runs are named {run.name} ({names[run.name]} and {run}): the table names a "
                           "run by its folder; evaluate them in two --out folders")
        names[run.name] = run
    return runs


def as_given(run: Path) -> Path:
    """A run folder from the current folder when it lies below it (the rows' checkpoint column then
    names it from the repository, not from this machine's root), else absolute."""
    absolute = run.resolve()
    try:
        return absolute.relative_to(Path.cwd().resolve())
    except ValueError:
        return absolute


def finished(run_dir: Path) -> bool:
    """Whether a run has finished training: its sweep marked it done, or last.pt holds its last epoch."""
    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.core.config import TrainConfig
    from pipeline.training.run_folder import RunFolder, read_config

    if not (run_dir / "best.pt").is_file():
        return False
    if RunFolder(run_dir).done() is not None:
        return True
    last = run_dir / "last.pt"
    epochs = int(read_config(run_dir).get("epochs") or TrainConfig.default("epochs"))
    return last.is_file() and int(load_checkpoint(last).get("epoch", -1)) >= epochs


def rescore_plan(options=None, bank_size: int | None = None):
    """Every registered method with its defaults (``options``: NAME.KEY=VALUE overrides, as
    --rescore-option), the protocol's bank (the training split; ``bank_size``: its first N images, as
    --rescore-bank-size, e.g. for a pairwise network, which scores every bank pair), dsl allowed by
    name; what differs from the defaults is recorded in each row's rescore column."""
    from pipeline.evaluation.rescore import RESCORE_NAMES, plan_rescore

    return plan_rescore(RESCORE_NAMES, options, split=SPLIT, bank_size=bank_size, transductive=True)


def all_judged(target: Path) -> bool:
    """Whether every row of a run's file has the human-judged mAP@R (a file written before re-scored
    rows were judged has it on its plain row alone)."""
    from pipeline.reports.report import read_results

    return all(row.get(key) is not None for row in read_results(target) for key in MAP_KEYS)


def stale(target: Path, sources) -> bool:
    """Whether ``target`` is missing or older than one of ``sources`` (those that exist)."""
    if not target.is_file():
        return True
    return any(s.is_file() and s.stat().st_mtime > target.stat().st_mtime for s in sources)


# ---------------------------------------------------------------------------- the steps

def evaluate(run_dir: Path, target: Path, device, judgments, plan, echo) -> None:
    """Step 1 for one run: `vse evaluate --runs RUN --rescore ... --judgments J --out TARGET`."""
    from pipeline.reports.runs_command import evaluate_run_folders

    names = " ".join(f"--rescore {m.name}" for m in plan.methods)
    echo(f"$ vse evaluate --runs {run_dir} --split {SPLIT} {names} --transductive"
         + (f" --rescore-bank-size {plan.bank_size}" if plan.bank_size else "")
         + (f" --judgments {judgments.path}" if judgments else "") + f" --out {target}"
         + " (each method's options: its rows' rescore column)")
    evaluate_run_folders([str(run_dir)], device, split=SPLIT, out=target, judgments=judgments, rescore=plan,
                         echo=echo)


def merge(files: list[Path], target: Path) -> list[dict]:
    """Step 2: the runs' rows, one table."""
    from pipeline.reports.report import read_results, write_results

    rows = [row for f in files for row in read_results(f)]
    write_results(rows, target)
    return rows


def claims(results: Path, target: Path, claims_file: Path = CLAIMS) -> dict:
    """Step 3: the claims of ``claims_file`` on ``results`` (its own results: key replaced), written
    to ``target``."""
    from pipeline.core.fsutil import guard_output, write_atomic
    from pipeline.reports.claims import CLAIMS_FORMAT, claims_json, load_claims, run_claims

    spec = dataclasses.replace(load_claims(claims_file), results=[results], out=target)
    guard_output(target, CLAIMS_FORMAT, "a vse claims file", False)
    result = run_claims(spec, target)
    write_atomic(target, claims_json(result).encode("utf-8"))
    return result


MAP_KEYS = ("human_i2t_map@r", "human_t2i_map@r")
TABLE_KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", *MAP_KEYS,
              "i2t_hubness", "t2i_hubness")


def table(rows: list[dict], verdicts: dict, plan, claims_file: Path = CLAIMS,
          cost_file: Path | None = COST) -> str:
    """Step 4: the markdown table, one line per configuration (plain, then its corrections); the cost
    column from ``cost_file`` (the cost bench of the protocol's bank; None for a smaller bank, whose
    cost BANK_TABLES' costs file gives)."""
    from pipeline.evaluation.metrics import metric_of
    from pipeline.reports.claims import load_claims
    from pipeline.reports.report import format_cell, seed_groups

    cost = json.loads(cost_file.read_text())["methods"] if cost_file and cost_file.is_file() else {}
    by_claim = {(c.better, c.metric): v for c, v in zip(load_claims(claims_file).claims, verdicts["claims"])}
    direction = {"i2t": "image→text", "t2i": "text→image", "both": ""}
    heads = [f"{metric_of(k).label} {direction[metric_of(k).direction]}".strip() for k in TABLE_KEYS]
    lines = ["| configuration | " + " | ".join(heads) + " | rsum claim | cost |",
             "|---|" + "---:|" * len(heads) + "---|---:|"]
    for group in seed_groups(rows):
        method = next((m for m in plan.methods if group.label.endswith(" " + plan.row_name(m))), None)
        verdict = by_claim.get((group.label, "rsum"), {}).get("verdict", "") if method else ""
        spent = cost.get(method.name, {}).get(COST_KEY) if method else None
        cells = [format_cell(k, group, "md") for k in TABLE_KEYS]
        lines.append(f"| {group.label} | " + " | ".join(cells) + f" | {verdict} | "
                     + ("" if spent is None else f"{spent:.2f}×") + " |")
    lines += ["", "Each cell: mean ± std (n seeds). mAP@R: human judgments, of each row's own scores (a "
              "re-scored row's of its corrected matrices). Hubness: the skewness of N_10 (lower: fewer "
              "hubs). rsum claim: the re-scored group against the plain one, Welch one-sided over seeds "
              f"({claims_file.name}). "
              + (f"Cost: {cost_file.name}'s {COST_KEY} (bench/rescore.py: a re-scored row's whole time, its "
                 "bank's k-NN, correction and ranks, over one evaluation, on a synthetic 5K × 25K split "
                 "with a bank of its size)." if cost_file else
                 f"Cost: a bank of {plan.bank_size} images; the cost of each bank size is in "
                 f"{OUT.name}/{BANK_TABLES[1]}.")]
    return "\n".join(lines) + "\n"


def bank_table(out: Path = OUT, sizes=BANK_SIZES, claims_file: Path = CLAIMS) -> str:
    """The bank's size against the gains (OUT/bank_sizes.md): per configuration, the test rsum over
    seeds at each bank size (each arm's results.csv and its claims' verdict). VseError when an arm has
    no results yet."""
    from pipeline.reports.claims import load_claims
    from pipeline.reports.report import format_cell, read_results, seed_groups

    arms, banks = [], []
    for size in sizes:
        folder = bank_folder(size, out)
        results, verdicts = folder / "results.csv", folder / "claims.json"
        if not (results.is_file() and verdicts.is_file()):
            raise VseError(f"{folder}: no results.csv and claims.json yet (experiments/hubness.py"
                           + (f" --rescore-bank-size {size} --out {folder}" if size else "") + ")")
        verdict = {c.better: v.get("verdict", "") for c, v in
                   zip(load_claims(claims_file).claims, json.loads(verdicts.read_text())["claims"])
                   if c.metric == "rsum"}
        rows = read_results(results)
        arms.append(({g.label: g for g in seed_groups(rows)}, verdict))
        # the bank each arm's rows record (their rescore column: "..., bank SPLIT:IMAGES")
        found = {m.groups() for row in rows
                 for m in [re.search(r"bank (\w+):(\d+)", str(row.get("rescore")))] if m}
        banks.append(", ".join(f"{split} {int(n):,}" for split, n in sorted(found)) or "?")
    heads = [f"bank {b}" for b in banks]
    lines = ["| configuration | " + " | ".join(f"rsum, {h}" for h in heads) + " |",
             "|---|" + "---:|" * len(sizes)]
    for label in arms[0][0]:
        cells = []
        for groups, verdict in arms:
            group = groups.get(label)
            cell = format_cell("rsum", group, "md") if group else ""
            cells.append(cell + (f", {verdict[label]}" if verdict.get(label) else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "rsum: mean ± std (n seeds) on test, each correction with its authors' defaults and a bank "
              "of the training split's first N images and their captions (`--rescore-bank-size N`; all: "
              f"the protocol's bank); the verdict: {claims_file.name}'s rsum claim (the re-scored group "
              "against the plain one, Welch one-sided over seeds) on that arm's rows."]
    return "\n".join(lines) + "\n"


def bank_cost_table(costs=BANK_COSTS) -> str:
    """Each method's cost over one evaluation at each bank size the cost bench measured
    (OUT/bank_costs.md): its correction, and its whole row. VseError when a bench file is missing."""
    missing = [str(path) for path in costs.values() if not path.is_file()]
    if missing:
        raise VseError(f"{', '.join(missing)}: not measured yet (bench/rescore.py --bank-images N "
                       "--threads 1 --indexes --out FILE)")
    measured = {name: json.loads(path.read_text()) for name, path in costs.items()}
    keys = (("correction", "correction_over_evaluation"), ("row", COST_KEY))
    lines = ["| over one evaluation | " + " | ".join(f"{what}, bank {n}" for n in measured
                                                   for what, _ in keys) + " |",
             "|---|" + "---:|" * (len(measured) * len(keys))]
    for method in next(iter(measured.values()))["methods"]:
        lines.append(f"| {method} | " + " | ".join(
            f"{data['methods'][method][key]:.2f}×" if method in data["methods"] else ""
            for data in measured.values() for _, key in keys) + " |")
    lines += ["", "bench/rescore.py on a synthetic 5K × 25K split (correction: the bank's k-NN or "
              "log-sum-exp and the corrected matrices; row: a re-scored row's whole time, the ranks too; "
              "each over one evaluation), its bank of each size, one thread, the runs back to back."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the driver

def run(out: Path = OUT, *, sweeps=(), patterns=(), judgments=JUDGMENTS, device: str = "auto",
        claims_file: Path = CLAIMS, options=None, bank_size: int | None = None, runs_dir=None,
        dry_run: bool = False, echo=print) -> dict:
    """Every step whose file is missing or stale; returns what it did: ``evaluated`` and ``waiting``
    (run names), ``written`` (files). ``options``: the methods' options other than their defaults."""
    plan = rescore_plan(options, bank_size)
    runs = source_runs(sweeps, patterns, runs_dir)
    done = {"evaluated": [], "waiting": [], "written": []}
    todo = [r for r in runs if not (out / "runs" / f"{r.name}.csv").is_file()
            or (judgments and not all_judged(out / "runs" / f"{r.name}.csv"))]
    ready = [r for r in todo if finished(r)]
    done["waiting"] = [r.name for r in todo if r not in ready]
    if dry_run:
        for r in runs:
            state = "evaluated" if r not in todo else "to evaluate" if r in ready else "not finished training"
            echo(f"{r.name}: {state}")
        return done
    for name in done["waiting"]:
        echo(f"{name}: not finished training: left for a later call")
    if ready:
        from pipeline.core.runtime import resolve_device
        from pipeline.evaluation.judgments import JudgmentOptions

        judged = JudgmentOptions(str(judgments)) if judgments else None  # the format's defaults
        for run_dir in ready:
            target = out / "runs" / f"{run_dir.name}.csv"
            evaluate(run_dir, target, resolve_device(device), judged, plan, echo)
            done["evaluated"].append(run_dir.name)
    files = [out / "runs" / f"{r.name}.csv" for r in runs if (out / "runs" / f"{r.name}.csv").is_file()]
    if not files:
        echo("no run evaluated yet: nothing to tabulate")
        return done
    results, verdicts, table_md = out / "results.csv", out / "claims.json", out / "table.md"
    from pipeline.reports.report import read_results

    if stale(results, files) or len(read_results(results)) != sum(len(read_results(f)) for f in files):
        merge(files, results)
        done["written"].append(results)
    if stale(verdicts, [results, claims_file]):
        claims(results, verdicts, claims_file)
        done["written"].append(verdicts)
    if stale(table_md, [results, verdicts, COST]):
        cost = COST if plan.bank_size is None else None  # the cost bench's bank is the split's size
        table_md.write_text(table(read_results(results), json.loads(verdicts.read_text()), plan, claims_file,
                                  cost))
        done["written"].append(table_md)
    for path in done["written"]:
        echo(f"wrote {path}")
    if not done["evaluated"] and not done["written"]:
        echo("nothing to do: every file is up to date")
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--sweep", action="append", default=[], metavar="FILE:KEY=VALUE,...",
                        help="a sweep file's runs having every KEY=VALUE (repeatable; replaces the defaults)")
    parser.add_argument("--runs-dir", default=None, help="the sweeps' runs folder (default: each file's)")
    parser.add_argument("--runs", action="append", default=[], metavar="GLOB",
                        help="run folders (repeatable; replaces the defaults)")
    parser.add_argument("--judgments", default=str(JUDGMENTS),
                        help="Flickr8k CrowdFlower judgments ('' for none)")
    parser.add_argument("--claims", type=Path, default=CLAIMS)
    parser.add_argument("--rescore-option", action="append", default=[], metavar="NAME.KEY=VALUE",
                        help="a method's option other than its default (repeatable; JSON value)")
    parser.add_argument("--rescore-bank-size", type=int, default=None, metavar="N",
                        help="the bank: the training split's first N images (default: all)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--bank-table", action="store_true",
                        help="only write OUT/bank_sizes.md and bank_costs.md: the bank-size arms (OUT, "
                        "OUT_bankN) side by side, and the cost bench's banks")
    args = parser.parse_args(argv)
    import click

    from cli.train_options import parse_key_values  # --rescore-option's parsing, as vse's

    try:
        options = parse_key_values(None, None, args.rescore_option)
        if args.bank_table:
            for name, text in zip(BANK_TABLES, (bank_table(args.out, claims_file=args.claims),
                                                bank_cost_table())):
                (args.out / name).write_text(text, encoding="utf-8")
                print(f"wrote {args.out / name}")
            return 0
        run(args.out, sweeps=args.sweep, patterns=args.runs, judgments=args.judgments or None,
            device=args.device, claims_file=args.claims, options=options,
            bank_size=args.rescore_bank_size, runs_dir=args.runs_dir,
            dry_run=args.dry_run)
    except (VseError, click.ClickException) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
