"""Equal tuning of the noisy-pairs methods, and what it changes in the default-options table
(issue 42): one command, resumable. `make f8k-tuned` runs

    python experiments/tune_table.py experiments/f8k_tune.yaml --budget 6x2 --jobs 2

The spec file (experiments/f8k_tune.yaml) states the base, the noise levels, the methods and each
one's search once; a study is one method at one noise level (``NOISE-METHOD``). Under
RUNS_DIR/NAME/ (the spec's runs_dir: and name:) and OUT (its out:), the steps, each skipped when
its output exists and is complete (a killed command goes on where it stopped when run again):

1. files     tune_files/STUDY.yaml: one `vse tune` file per study (rewritten only when it changes)
2. tune      `vse tune FILE --budget B`: STUDY/ until it holds B's trials (COMPLETE + PRUNED, read
             from its trial folders' tune.json); --jobs N runs N studies at once, as processes
3. export    `vse tune FILE --export best/STUDY.yaml`: the best trial's options (done when the file
             names the best trial of the trial folders)
4. seeds     `vse sweep best/STUDY.yaml --seeds S --epochs E --resume`: STUDY-best/seed=N, the
             chosen options on the default schedule (E epochs, the seeds' schedule: the budget's
             trials are shorter); done when every seed run holds sweep-done.json of its config
5. evaluate  `vse evaluate --runs ... --split test [--judgments J] --out OUT/results.csv`
6. tables    OUT/table_noisy.md (and table_human.md with judgments): `vse report`'s tables
             (pipeline.reports.report.format_results), each row named as in the default table
             (noise=NOISE,method=METHOD) with `vse report`'s "(tuned B)" after it
7. compare   OUT/side_by_side.md (default rsum against tuned rsum per method × noise, the tuned
             options, each study's minutes), OUT/claims.json (the claims on the tuned table) and
             OUT/claims_compare.json (which claims of the default table hold, flip or disappear)

A run folder's name in the tuned sweeps is seed=N under STUDY-best/, so results.csv names rows
STUDY-best/seed=N; the tables and claims rename them to the default table's labels by the
folder (``tuned_rows``). Minutes are wall time read from the run folders' file times: a trial
from its config.json's write to its tune.json's last write, a seed run to its sweep-done.json;
with --jobs 2 two processes share the cores, so the sum is process time, not the elapsed time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.errors import VseError  # noqa: E402
from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater  # noqa: E402
from pipeline.reports.claims import Claim, claim_groups, claim_set_path, load_claims, verdicts  # noqa: E402
from pipeline.training.sweep import (  # noqa: E402
    check_folder_name,
    paths_for_file,
    read_yaml_mapping,
    resolve_paths,
    resolved_path,
)
from pipeline.training.tune import EXPORT_TAG, TRIAL_FILE, load_tune, parse_budget  # noqa: E402

SPEC_KEYS = ("name", "runs_dir", "budget", "seeds", "epochs", "out", "default_results", "judgments",
             "claims", "base", "search", "noise", "methods")
REQUIRED = ("base", "search", "noise", "methods", "default_results", "out")
# The default table's labels: experiments/f8k_noisy.yaml's grid axes, which the claims name.
LABEL = "noise={noise},method={method}"
COUNTED = ("COMPLETE", "PRUNED")
# How a claim's verdict moved from the default table to the tuned one.
CHANGES = {("holds", "holds"): "holds", ("reversed", "reversed"): "stays reversed",
           ("holds", "reversed"): "flips", ("reversed", "holds"): "flips",
           ("holds", "inside the seed noise"): "disappears",
           ("reversed", "inside the seed noise"): "disappears",
           ("inside the seed noise", "holds"): "appears", ("inside the seed noise", "reversed"): "appears",
           ("inside the seed noise", "inside the seed noise"): "inside the seed noise in both"}


# ---------------------------------------------------------------------------- the spec
@dataclass
class Study:
    """One method at one noise level: its tune file, study folder, export and seed runs."""

    noise: str
    method: str
    root: Path                      # RUNS_DIR/NAME
    config: dict                    # the tune file's content

    @property
    def name(self) -> str:
        return f"{self.noise}-{self.method}"

    @property
    def label(self) -> str:
        return LABEL.format(noise=self.noise, method=self.method)

    @property
    def tune_file(self) -> Path:
        return self.root / "tune_files" / f"{self.name}.yaml"

    @property
    def folder(self) -> Path:
        return self.root / self.name

    @property
    def export(self) -> Path:
        return self.root / "best" / f"{self.name}.yaml"

    @property
    def sweep_folder(self) -> Path:
        return self.root / f"{self.name}-best"  # `vse tune --export`'s sweep name, under the tune's runs_dir

    def seed_run(self, seed: int) -> Path:
        return self.sweep_folder / f"seed={seed}"


@dataclass
class Spec:
    path: Path
    name: str
    root: Path
    budget: object                  # tune.Budget
    seeds: list
    epochs: int
    out: Path
    default_results: Path
    judgments: str | None
    claims: str                     # the claim set's name (experiments/claims/NAME.yaml) or its file
    studies: list[Study] = field(default_factory=list)


def load_spec(path, budget: str | None = None, runs_dir=None, judgments=None) -> Spec:
    """Read and check the spec file; every problem is one VseError naming the file and the key.
    ``budget``, ``runs_dir`` and ``judgments`` replace the file's."""
    path = Path(path)
    spec = read_yaml_mapping(path, "tune table spec", "base:, search:, noise: and methods:")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise VseError(f"unknown key(s) {', '.join(unknown)} (expected {', '.join(SPEC_KEYS)})", path)
    missing = [key for key in REQUIRED if not spec.get(key)]
    if missing:
        raise VseError(f"missing {', '.join(missing)}", path)
    if not isinstance(spec["base"], dict) or not isinstance(spec["search"], dict):
        raise VseError("base: and search: must be mappings", path)
    seeds = spec.get("seeds", [0, 1, 2])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds) or len(set(seeds)) < len(seeds):
        raise VseError(f"seeds: a non-empty list of distinct integers, got {seeds!r}", path)
    epochs = spec.get("epochs", 6)
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise VseError(f"epochs: a whole number of at least 1, got {epochs!r}", path)
    claims = str(spec.get("claims", "noisy"))
    try:  # a claim set by name, or a claims file (relative to this file's folder)
        claims = str(claim_set_path(claims, path.parent))
        load_claims(claims)
    except VseError as exc:
        raise VseError(f"claims: {exc}", path) from None
    name = check_folder_name(str(spec.get("name") or path.stem), "name", path)
    given = budget or spec.get("budget")
    if not given:
        raise VseError("no budget: give --budget TRIALSxEPOCHS or budget: in the file", path)
    # the file's paths are its folder's, as a sweep or tune file's (sweep.resolve_paths); the command
    # line's (--runs-dir, --judgments) are the working folder's
    folder = path.parent
    file_runs_dir = resolved_path(spec["runs_dir"], folder) if spec.get("runs_dir") else "runs"
    root = Path(runs_dir or file_runs_dir) / name
    file_judgments = resolved_path(spec["judgments"], folder) if spec.get("judgments") else None
    out = Spec(path, name, root, parse_budget(str(given)), seeds, epochs,
               Path(resolved_path(spec["out"], folder)), Path(resolved_path(spec["default_results"], folder)),
               judgments or file_judgments, claims)
    spec = {**spec, "base": resolve_paths(spec["base"], folder)}
    noises = [resolve_paths(entry, folder) for entry in _entries(spec["noise"], "noise", path)]
    methods = [resolve_paths(entry, folder) for entry in _entries(spec["methods"], "methods", path)]
    for method in methods:
        if not isinstance(method.get("search", {}), dict):
            raise VseError(f"methods: {method['name']}: search: must be a mapping", path)
    for method in methods:
        for noise in noises:
            study = Study(noise["name"], method["name"], out.root, {})
            check_folder_name(study.name, "study name (NOISE-METHOD)", path)
            study.config = _tune_config(spec, noise, method, out.root, study.name)
            out.studies.append(study)
    return out


def _entries(entries, key: str, path) -> list[dict]:
    """The list of mappings under ``key``, each with a distinct ``name``."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("name") for e in entries):
        raise VseError(f"{key}: a list of mappings, each with a name:", path)
    names = [str(e["name"]) for e in entries]
    if len(set(names)) < len(names):
        raise VseError(f"{key}: a name is listed twice", path)
    return [{**e, "name": str(e["name"])} for e in entries]


def merged_base(base: dict, *entries: dict) -> dict:
    """``base`` with each entry's options over it (a noise level's, a method's: their loss_options
    merged; their name: and search: left out)."""
    base = dict(base)
    for entry in entries:
        for key, value in entry.items():
            if key in ("name", "search"):
                continue
            if key == "loss_options":
                base["loss_options"] = {**(base.get("loss_options") or {}), **(value or {})}
            else:
                base[key] = value
    return base


def _tune_config(spec: dict, noise: dict, method: dict, root: Path, name: str,
                 folder: Path | None = None) -> dict:
    """A study's tune file: the spec's base with the noise level's and the method's options (their
    loss_options merged), searching the spec's search: and the method's. Its paths are written as
    from ``folder``, where the file lies (default ROOT/tune_files)."""
    base = merged_base(spec["base"], noise, method)
    folder = folder or root / "tune_files"
    return {"name": name, "runs_dir": paths_for_file({"runs_dir": str(root)}, folder)["runs_dir"],
            "base": paths_for_file(base, folder),
            "search": {**spec["search"], **(method.get("search") or {})}}


# ---------------------------------------------------------------------------- running vse
def vse_args(*args) -> list[str]:
    return [str(a) for a in args]


def run_vse(args: list[str], tag: str = "", threads: int | None = None) -> int:
    """`vse ARGS`: in this process (``threads`` None), else as a process whose torch uses ``threads``
    threads, its output prefixed by ``[tag]``. Returns the exit status."""
    print(f"$ vse {' '.join(args)}", flush=True)
    if threads is None:
        import click

        from cli.main import cli

        try:
            cli.main(args=args, prog_name="vse", standalone_mode=False)
        except click.ClickException as exc:
            exc.show()
            return exc.exit_code
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    process = subprocess.Popen([sys.executable, "-m", "cli.main", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        print(f"[{tag}] {line}", end="", flush=True)
    return process.wait()


def run_all(tasks: list[tuple[str, list[str]]], jobs: int) -> list[str]:
    """Run the (tag, args) tasks, ``jobs`` at a time (processes when more than one task and job);
    returns the tags of those that failed."""
    if jobs <= 1 or len(tasks) <= 1:
        return [tag for tag, args in tasks if run_vse(args) != 0]
    threads = max(1, (os.cpu_count() or 1) // jobs)
    lock, failed = threading.Lock(), []

    def one(task):
        tag, args = task
        if run_vse(args, tag, threads) != 0:
            with lock:
                failed.append(tag)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, tasks))
    return sorted(failed, key=[t for t, _ in tasks].index)


def _check(failed: list[str], step: str, spec: Spec) -> None:
    if failed:
        raise VseError(f"step {step} failed for {', '.join(failed)} (its error is above); run the same "
                       "command again to go on", spec.path)


# ---------------------------------------------------------------------------- what a folder holds
def trial_records(study: Study) -> list[dict]:
    """The tune.json of each trial folder of the study, in trial order, with ``minutes``: the
    trial's wall time from its config.json's write to its tune.json's last write (None when the
    trial never reached its config)."""
    records = []
    for folder in sorted(study.folder.glob("trial_*")):
        record_path, config = folder / TRIAL_FILE, folder / "config.json"
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        seconds = (record_path.stat().st_mtime - config.stat().st_mtime) if config.is_file() else None
        records.append({**record, "minutes": None if seconds is None else max(seconds, 0.0) / 60})
    return records


def counted_trials(study: Study, budget) -> list[dict]:
    """The study's COMPLETE and PRUNED trials of the budget's epochs."""
    return [r for r in trial_records(study) if r.get("state") in COUNTED
            and parse_budget(str(r.get("budget"))).epochs == budget.epochs]


def best_record(study: Study) -> dict | None:
    """The best COMPLETE trial (Optuna's rule: the highest value, the first of equals)."""
    complete = [r for r in trial_records(study)
                if r.get("state") == "COMPLETE" and r.get("value") is not None]
    return max(complete, key=lambda r: r["value"], default=None)


def tuned(study: Study, budget) -> bool:
    return (study.folder / "study.db").is_file() and len(counted_trials(study, budget)) >= budget.trials


def exported(study: Study) -> bool:
    """The export exists and names the best trial of the trial folders."""
    best = best_record(study)
    if best is None or not study.export.is_file():
        return False
    head = study.export.read_text(encoding="utf-8").split("\n", 1)[0]
    match = re.search(r"trial (\d+) \(dev", head)
    return head.startswith(EXPORT_TAG) and match is not None and int(match[1]) == best["trial"]


def seed_runs(study: Study, spec: Spec) -> list[tuple[Path, str]]:
    """(run folder, config_id of the export's run) of each seed of the study's export."""
    from pipeline.training.run_folder import config_id
    from pipeline.training.sweep import load_sweep

    sweep = load_sweep(study.export, seeds=spec.seeds, overrides={"epochs": spec.epochs})
    return [(run.run_dir, config_id(run.config)) for run in sweep.runs]


def seeded(study: Study, spec: Spec) -> bool:
    """Every seed run of the export finished (sweep-done.json) with the export's configuration."""
    from pipeline.training.run_folder import DONE_MARKER, config_id, read_config

    if not study.export.is_file():
        return False
    return all((run / DONE_MARKER).is_file() and config_id(read_config(run)) == wanted
               for run, wanted in seed_runs(study, spec))


def earlier_best(study: Study, spec: Spec) -> bool:
    """Some seed run of the study was trained with other options than its export's (an earlier best)."""
    from pipeline.training.run_folder import config_id, read_config

    return any((run / "config.json").is_file() and config_id(read_config(run)) != wanted
               for run, wanted in seed_runs(study, spec))


def seed_minutes(study: Study, spec: Spec) -> float | None:
    """The seed runs' wall minutes, summed: config.json's write to sweep-done.json's ``finished``."""
    total = 0.0
    for seed in spec.seeds:
        run = study.seed_run(seed)
        try:
            finished = json.loads((run / "sweep-done.json").read_text(encoding="utf-8"))["finished"]
            total += max(float(finished) - (run / "config.json").stat().st_mtime, 0.0) / 60
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return total


def fresh(outputs: list[Path], inputs: list[Path]) -> bool:
    """Every output exists and is newer than every input (make's rule)."""
    if not all(p.is_file() for p in outputs):
        return False
    newest = max((p.stat().st_mtime for p in inputs if p.is_file()), default=0.0)
    return min(p.stat().st_mtime for p in outputs) >= newest


def evaluated(spec: Spec, results: Path) -> bool:
    """results.csv holds one row per seed run, each written after the run's best.pt."""
    return holds_runs(results, [s.seed_run(seed) for s in spec.studies for seed in spec.seeds])


def holds_runs(results: Path, runs: list[Path]) -> bool:
    """results.csv holds rows of exactly ``runs``, written after each run's best.pt."""
    from pipeline.reports.report import read_results

    if not results.is_file():
        return False
    try:
        rows = read_results(results)
    except VseError:
        return False
    runs = {Path(run).resolve() for run in runs}
    have = {Path(str(r.get("checkpoint"))).parent.resolve() for r in rows}
    return have == runs and fresh([results], [run / "best.pt" for run in runs])


# ---------------------------------------------------------------------------- the protocol
def protocol(spec: Spec, jobs: int = 1, plots: bool = True, echo=print) -> dict:
    """Run every step that is not done; returns {step: "ran" | "skipped"}."""
    done = {}
    results = spec.out / "results.csv"

    def step(name: str, ran: bool, detail: str = "") -> None:
        done[name] = "ran" if ran else "skipped"
        echo(f"[{name}] {'ran' if ran else 'skipped (done)'}" + (f": {detail}" if detail else ""))

    import yaml

    changed = []
    for study in spec.studies:
        text = yaml.safe_dump(study.config, sort_keys=False)
        if not study.tune_file.is_file() or study.tune_file.read_text(encoding="utf-8") != text:
            study.tune_file.parent.mkdir(parents=True, exist_ok=True)
            study.tune_file.write_text(text, encoding="utf-8")
            changed.append(study.name)
    for study in spec.studies:  # every study's file checked before the first trial of any
        load_tune(study.tune_file)
    step("files", bool(changed), f"wrote {', '.join(changed)}" if changed else "")

    extra = [] if plots else ["--no-plots"]
    budget = f"{spec.budget.trials}x{spec.budget.epochs}"
    todo = [s for s in spec.studies if not tuned(s, spec.budget)]
    _check(run_all([(s.name, vse_args("tune", s.tune_file, "--budget", budget, *extra)) for s in todo],
                   jobs), "tune", spec)
    step("tune", bool(todo), f"{len(todo)} of {len(spec.studies)} studies, budget {spec.budget}")

    todo = [s for s in spec.studies if not exported(s)]
    tasks = [(s.name, vse_args("tune", s.tune_file, "--export", s.export, "--no-plots")) for s in todo]
    _check(run_all(tasks, jobs), "export", spec)
    step("export", bool(todo), f"{len(todo)} studies")

    todo = [s for s in spec.studies if not seeded(s, spec)]
    stale = [str(s.sweep_folder) for s in todo if earlier_best(s, spec)]
    if stale:
        raise VseError(f"{', '.join(stale)}: seed runs of an earlier best trial (the study's best changed, "
                       "e.g. with a larger budget): move the folder away to train the new best", spec.path)
    seeds = ",".join(map(str, spec.seeds))
    tasks = [(s.name, vse_args("sweep", s.export, "--seeds", seeds, "--epochs", spec.epochs, "--resume"))
             for s in todo]
    _check(run_all(tasks, jobs), "seeds", spec)
    step("seeds", bool(todo), f"{len(todo)} studies × seeds {seeds}, {spec.epochs} epochs")

    ran = not evaluated(spec, results)
    if ran:
        runs = [a for s in spec.studies for seed in spec.seeds for a in ("--runs", s.seed_run(seed))]
        judged = ["--judgments", spec.judgments] if spec.judgments else []
        _check(run_all([("evaluate", vse_args("evaluate", *runs, "--split", "test", *judged, "--out", results,
                                              "--keep-evaluated"))], 1), "evaluate", spec)
    step("evaluate", ran, str(results))

    tables = [spec.out / "table_noisy.md", *([spec.out / "table_human.md"] if spec.judgments else [])]
    ran = not fresh(tables, [results])
    if ran:
        write_tables(spec, results)
    step("tables", ran, ", ".join(p.name for p in tables))

    outputs = [spec.out / name for name in ("side_by_side.md", "claims.json", "claims_compare.json")]
    inputs = [results, spec.default_results,
              *(r for s in spec.studies for r in s.folder.glob(f"trial_*/{TRIAL_FILE}"))]
    ran = not fresh(outputs, inputs)
    if ran:
        write_comparison(spec, results)
    step("compare", ran, ", ".join(p.name for p in outputs))
    return done


# ---------------------------------------------------------------------------- tables and claims
def tuned_rows(spec: Spec, results: Path) -> list[dict]:
    """The rows of the tuned results.csv named as the default table's (noise=N,method=M,seed=S),
    by the sweep folder each run is in; rows of other runs are left out."""
    from pipeline.reports.report import read_results

    by_folder = {s.sweep_folder.resolve(): s for s in spec.studies}
    rows = []
    for row in read_results(results):
        run = Path(str(row.get("checkpoint"))).parent.resolve()
        study = by_folder.get(run.parent)
        if study is not None:
            rows.append({**row, "run": f"{study.label},{run.name}"})
    return rows


def write_tables(spec: Spec, results: Path) -> None:
    from pipeline.reports.report import format_results

    rows = tuned_rows(spec, results)
    layouts = [("table_noisy.md", "noisy"), *([("table_human.md", "human")] if spec.judgments else [])]
    for name, layout in layouts:
        _write(spec.out / name, format_results(rows, fmt="md", layout=layout) + "\n")


def claim_change(default: str, tuned: str) -> str:
    """How a claim's verdict moved: holds, flips, disappears, appears, stays reversed, inside the
    seed noise in both; "not compared" when either table could not test it."""
    return CHANGES.get((default, tuned), "not compared")


def two_sided_p(a: list, b: list) -> float | None:
    """Welch's two-sided t-test over seeds (None with fewer than 2 seeds on a side)."""
    if min(len(a), len(b)) < 2:
        return None
    return min(1.0, 2 * min(welch_greater(a, b), welch_greater(b, a)))


def pair_claims(spec: Spec, default: dict) -> list[tuple]:
    """Every ordering of two methods at one noise level as a claim (``reports.claims.Claim``), the
    better one first by the default table's mean rsum: the rankings the default table shows."""
    claims = []
    for noise in dict.fromkeys(s.noise for s in spec.studies):
        studies = [s for s in spec.studies if s.noise == noise]
        for i, a in enumerate(studies):
            for b in studies[i + 1:]:
                means = [mean_std(default[s.label].samples.get("rsum", []))[0]
                         if not isinstance(default.get(s.label, []), list) else 0.0 for s in (a, b)]
                better, worse = (a, b) if means[0] >= means[1] else (b, a)
                claims.append(Claim(f"{better.method} beats {worse.method} at {noise}", "ranking",
                                    better.label, worse.label, "rsum"))
    return claims


def compare_claims(claims, default: dict, tuned_groups: dict) -> tuple[list[dict], list[dict], dict]:
    """(verdicts on the tuned table, each claim's two verdicts and change, the claims by change)."""
    before, after = verdicts(default, claims), verdicts(tuned_groups, claims)
    compared = [{"claim": b["claim"], "default": b["verdict"], "tuned": a["verdict"],
                 "change": claim_change(b["verdict"], a["verdict"]),
                 **{f"{side}_{key}": entry[key] for side, entry in (("default", b), ("tuned", a))
                    for key in ("p_claimed", "p_reverse") if key in entry}}
                for b, a in zip(before, after)]
    summary = {}
    for entry in compared:
        summary.setdefault(entry["change"], []).append(entry["claim"])
    return after, compared, summary


def write_comparison(spec: Spec, results: Path) -> None:
    from pipeline.reports.report import read_results

    default = claim_groups(read_results(spec.default_results))
    tuned_groups = claim_groups(tuned_rows(spec, results))
    after, compared, summary = compare_claims(load_claims(spec.claims).claims, default, tuned_groups)
    _, pairs, pair_summary = compare_claims(pair_claims(spec, default), default, tuned_groups)
    test = f"Welch one-sided over seeds, alpha {ALPHA}"
    _write(spec.out / "claims.json", json.dumps({"results": str(results), "test": test, "claims": after},
                                                indent=1) + "\n")
    _write(spec.out / "claims_compare.json", json.dumps({
        "default_results": str(spec.default_results), "tuned_results": str(results),
        "budget": str(spec.budget), "seeds": spec.seeds, "test": test,
        "rule": "holds: holds in both; flips: holds in one, reversed in the other; disappears: holds or "
                "reversed with the defaults, inside the seed noise tuned; appears: the other way; not "
                "compared: not measured or not testable on a side",
        "summary": summary, "claims": compared,
        "pairs_rule": "every two methods at one noise level, the better by the default table's mean first",
        "pairs_summary": pair_summary, "pairs": pairs}, indent=1) + "\n")
    _write(spec.out / "side_by_side.md", side_by_side(spec, default, tuned_groups)
           + claims_section(spec, summary, pair_summary))


def _shown(claims: str) -> str:
    """A claims file as the side-by-side table names it: from the repository root when inside it."""
    root = Path(__file__).resolve().parents[1]
    path = Path(claims).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(claims)


def claims_section(spec: Spec, summary: dict, pair_summary: dict) -> str:
    """The claims of the default table (the spec's claim set) by how equal tuning changed them,
    and the count of each change over the orderings of two methods."""
    lines = ["", f"Claims of the default table ({_shown(spec.claims)}; Welch one-sided, "
             f"p < {ALPHA}) after equal tuning (claims_compare.json):"]
    shown = ("holds", "flips", "disappears", "appears", "stays reversed", "inside the seed noise in both")
    for change in shown:
        if summary.get(change):
            lines.append(f"- {change}: " + "; ".join(summary[change]))
    skipped = len(summary.get("not compared", []))
    if skipped:
        lines.append(f"- not compared (a setting or method this experiment does not run): {skipped}")
    counts = ", ".join(f"{change} {len(claims)}" for change, claims in pair_summary.items())
    lines += ["", f"Orderings of two methods at one noise level (the default's better first): {counts}."]
    return "\n".join(lines) + "\n"


def _cell(samples: list) -> str:
    mean, std, n = mean_std(samples)
    return "" if n == 0 else f"{mean:.1f} ± {std:.1f} ({n})" if n > 1 else f"{mean:.1f} (1)"


def _option(key: str, value) -> str:
    short = key.split(".", 1)[1] if key.startswith("loss_options.") else key
    return f"{short} {value:.3g}" if isinstance(value, float) else f"{short} {value}"


def side_by_side(spec: Spec, default: dict, tuned_groups: dict) -> str:
    """The markdown table: per method × noise, the default and tuned test rsum, their difference and
    Welch's two-sided p, the chosen options and their dev rsum, the trials and the minutes."""
    lines = ["| method | noise | default rsum | tuned rsum | Δ | p | tuned options | dev rsum (best trial) "
             "| trials (complete + pruned) | tune min | seeds min |",
             "|:---|:---|---:|---:|---:|---:|:---|---:|---:|---:|---:|"]
    tune_total, seed_total = 0.0, 0.0
    for study in spec.studies:
        before = default[study.label].samples.get("rsum", []) if study.label in default else []
        after = tuned_groups[study.label].samples.get("rsum", []) if study.label in tuned_groups else []
        delta = f"{mean_std(after)[0] - mean_std(before)[0]:+.1f}" if before and after else ""
        p = two_sided_p(after, before)
        records, best = trial_records(study), best_record(study)
        states = [r.get("state") for r in records]
        minutes = sum(r["minutes"] for r in records if r.get("minutes") is not None)
        seeds = seed_minutes(study, spec)
        tune_total += minutes
        seed_total += seeds or 0.0
        options = ", ".join(_option(k, v) for k, v in best["params"].items()) if best else ""
        lines.append(" | ".join([
            f"| {study.method}", study.noise, _cell(before), _cell(after), delta,
            "" if p is None else f"{p:.2g}", options, f"{best['value']:.1f}" if best else "",
            f"{states.count('COMPLETE')} + {states.count('PRUNED')}", f"{minutes:.1f}",
            "" if seeds is None else f"{seeds:.1f}"]) + " |")
    budget = spec.budget
    epochs = f"{budget.epochs} epoch{'s' * (budget.epochs > 1)}"
    lines += ["", f"Test rsum, mean ± std (n seeds {', '.join(map(str, spec.seeds))}); default: "
              f"{spec.default_results}; tuned: each study's best trial on dev (budget {budget}: "
              f"{budget.trials} trials of {epochs}, TPE, median pruner), trained with the "
              f"seeds for {spec.epochs} epochs. Δ = tuned − default; p: Welch's two-sided t-test over the "
              "seeds. Minutes: wall time summed over a study's trials (config.json written → tune.json's "
              "last write) and its seed runs (→ sweep-done.json); processes run side by side count each.",
              "", f"Cost of the budget: {tune_total:.1f} min of tuning for {len(spec.studies)} studies "
              f"({tune_total / max(len(spec.studies), 1):.1f} per study), then {seed_total:.1f} min for the "
              f"{len(spec.studies) * len(spec.seeds)} seed runs of the chosen options."]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    from pipeline.core.fsutil import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="experiments/f8k_tune.yaml")
    parser.add_argument("--budget", help="TRIALSxEPOCHS for every study (default: the spec's budget:)")
    parser.add_argument("--jobs", type=int, default=1, help="studies (tunes, seed sweeps) run at once, as "
                        "processes sharing the cores")
    parser.add_argument("--no-plots", action="store_true", help="vse tune draws no plots")
    parser.add_argument("--runs-dir", help="parent of the experiment's runs folder (default: the spec's "
                        "runs_dir:)")
    parser.add_argument("--judgments", help="human judgments for `vse evaluate` (default: the spec's "
                        "judgments:)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec, args.budget, args.runs_dir, args.judgments)
        protocol(spec, jobs=max(1, args.jobs), plots=not args.no_plots)
    except VseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
