"""The reality check of the field's losses (issue 60): every loss tuned alike with a budget that
searches, its tuned and its default options trained with the same seeds, the papers' claims tested.
`make f8k-reality` runs

    python experiments/reality_check.py experiments/f8k_reality.yaml --jobs 2

The spec file (experiments/f8k_reality.yaml) states the base, the budget, the pruner, the seeds and
each loss's search once. A study is one loss tuned (``LOSS``) with the spec's pruner, and with a pruner
(median, hyperband) the losses under ``unpruned:`` are tuned again without one (``LOSS-unpruned``):
the pruner's check. With ``pruner: none`` every trial trains the whole schedule and there is nothing
to check (``unpruned:`` is refused). Under RUNS_DIR/NAME/ and OUT
(the spec's out:), the steps, each skipped when its files exist and are complete (a killed command goes
on where it stopped when run again); ``--dry-run`` lists each one's state and the cost still ahead:

1. files     tune_files/STUDY.yaml (one `vse tune` file per study) and defaults/LOSS.yaml (a sweep
             file of the loss's default options on the same base and schedule)
2. defaults  `vse sweep defaults/LOSS.yaml --seeds S --resume`: LOSS-default/seed=N
3. tune      `vse tune FILE --budget B --pruner P --sampler-seed K`: STUDY/ until it holds B's
             trials (COMPLETE + PRUNED); the unpruned studies with --pruner none
4. export    `vse tune FILE --export best/STUDY.yaml`: the best trial's options
5. seeds     `vse sweep best/STUDY.yaml --seeds S --resume`: STUDY-best/seed=N, on the budget's
             schedule (a trial trains the seeds' whole schedule). An unpruned study whose best
             options are the pruned study's trains nothing: the check is then "the same options".
6. evaluate  `vse evaluate --runs ... --split test --member M [--judgments J] [--relevance R]
             --out OUT/results.csv --keep-evaluated`; a co-trained run (ncr, bicro) also gets the
             row of its network M alone, the row the tables read
7. summary   OUT/studies.json (each study's best options, its trial counts: complete, pruned,
             failed, drawn at random in TPE's start-up or by TPE, its minutes; the seed runs'
             minutes; the pruner's check), OUT/default_vs_tuned.md, OUT/pruner_check.md,
             OUT/table_recall.md (and table_human.md with judgments), OUT/claims_compare.json (the
             claims on the default rows against the tuned rows), written by experiments/reality_tables.py
8. claims    `vse claims CLAIMS --out OUT/claims.json`: the claims file (experiments/claims/
             reality.yaml) on tuned rows; read against OUT/results.csv (a copy of the file pointing
             there, OUT/claims.yaml, when its results: are elsewhere)

``--second-regime`` runs the same steps for the spec's ``second_regime:`` (another base, budget, name
and out) with its losses and the ``best_of_fast`` best losses of the first regime's tuned rows.
Minutes are wall time read from the run folders (experiments/tune_table.py: a trial from its
config.json to its tune.json, a seed run to its sweep-done.json); with --jobs 2 two processes share
the cores, so a sum of minutes is process time, about twice the elapsed time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tune_table as tt  # noqa: E402
from reality_tables import (  # noqa: E402
    SUMMARY_FILES,
    TUNED,
    rsums,
    study_minutes,
    tables,
    trial_counts,
    write_summary,
)

from pipeline.core.errors import VseError  # noqa: E402
from pipeline.evaluation.stats import mean_std  # noqa: E402
from pipeline.reports.batch_eval import MEMBER  # noqa: E402
from pipeline.reports.claims import claim_set_path, load_claims  # noqa: E402
from pipeline.training.sweep import (  # noqa: E402
    check_folder_name,
    paths_for_file,
    read_yaml_mapping,
    resolve_paths,
    resolved_path,
)
from pipeline.training.tune import (  # noqa: E402
    PRUNERS,
    check_schedules,
    load_tune,
    parse_budget,
)
from pipeline.training.tune_spec import NO_PRUNER  # noqa: E402

SPEC_KEYS = ("name", "runs_dir", "budget", "pruner", "sampler_seed", "seeds", "member", "unpruned", "out",
             "judgments", "cs_relevance", "claims", "base", "search", "losses", "second_regime")
REQUIRED = ("base", "search", "losses", "out", "budget")
SECOND_KEYS = ("name", "out", "budget", "base", "losses", "best_of_fast", "unpruned")
UNPRUNED = "-unpruned"          # an unpruned study's name: LOSS-unpruned
DEFAULT = "-default"            # the default options' sweep: LOSS-default
STEPS = ("files", "defaults", "tune", "export", "seeds", "evaluate", "summary", "claims")


# ---------------------------------------------------------------------------- the spec
@dataclass
class LossStudy(tt.Study):
    """One loss tuned: with the spec's pruner (named LOSS), or without one as the pruner's check
    (``check``, named LOSS-unpruned)."""

    pruner: str = "median"
    check: bool = False

    @property
    def name(self) -> str:
        return self.method + (UNPRUNED if self.check else "")


@dataclass
class Defaults:
    """One loss's default options: a sweep file and its seed runs (what tune_table's seed checks read)."""

    method: str
    root: Path
    config: dict                    # the sweep file's content

    @property
    def name(self) -> str:
        return self.method + DEFAULT

    @property
    def export(self) -> Path:       # the sweep file (the name tune_table's seed checks read)
        return self.root / "defaults" / f"{self.method}.yaml"

    @property
    def sweep_folder(self) -> Path:
        return self.root / self.name

    def seed_run(self, seed: int) -> Path:
        return self.sweep_folder / f"seed={seed}"


@dataclass
class Spec:
    path: Path
    name: str
    root: Path
    budget: object                  # tune.Budget
    pruner: str
    sampler_seed: int
    seeds: list
    member: int
    out: Path
    judgments: str | None
    cs_relevance: str | None
    claims: Path
    losses: list[str]
    studies: list[LossStudy] = field(default_factory=list)
    defaults: list[Defaults] = field(default_factory=list)
    table: dict = field(default_factory=dict)      # the spec file's content, base: paths resolved
    entries: dict = field(default_factory=dict)    # each loss's entry of losses:, paths resolved
    second: dict | None = None      # the second_regime: section, as the file gives it

    @property
    def epochs(self) -> int:
        """The seeds' epochs: the budget's (a trial trains the seeds' whole schedule)."""
        return self.budget.epochs

    def study(self, loss: str, check: bool = False) -> LossStudy | None:
        """The loss's study, or (``check``) its unpruned study of the pruner's check."""
        return next((s for s in self.studies if s.method == loss and s.check == check), None)


def load_spec(path, runs_dir=None, judgments=None, second_regime: bool = False) -> Spec:
    """Read and check the spec file (with ``second_regime``: its second_regime: section over it, the
    losses chosen from the first regime's results); every problem is one VseError naming the file."""
    path = Path(path)
    raw = read_yaml_mapping(path, "reality check spec", "base:, search:, losses: and budget:")
    unknown = sorted(set(raw) - set(SPEC_KEYS))
    if unknown:
        raise VseError(f"unknown key(s) {', '.join(unknown)} (expected {', '.join(SPEC_KEYS)})", path)
    missing = [key for key in REQUIRED if not raw.get(key)]
    if missing:
        raise VseError(f"missing {', '.join(missing)}", path)
    if not isinstance(raw["base"], dict) or not isinstance(raw["search"], dict):
        raise VseError("base: and search: must be mappings", path)
    if "epochs" in raw["base"]:
        raise VseError("base: epochs: the budget's epochs are the schedule (budget: TRIALSxEPOCHS)", path)
    folder = path.parent
    losses = [resolve_paths(entry, folder) for entry in tt._entries(raw["losses"], "losses", path)]
    names = [loss["name"] for loss in losses]
    second = _second(raw.get("second_regime"), names, path)
    first = _spec(raw, path, losses, runs_dir, judgments)
    first.second = second
    if not second_regime:
        return first
    if second is None:
        raise VseError("--second-regime: the file has no second_regime: section", path)
    chosen = second["losses"] + best_of(first, second["best_of_fast"], exclude=second["losses"])
    raw = {**raw, "name": second["name"], "out": second["out"], "budget": second["budget"],
           "base": second["base"], "unpruned": second.get("unpruned", [])}
    return _spec(raw, path, [loss for loss in losses if loss["name"] in chosen], runs_dir, judgments)


def _second(section, names: list[str], path: Path) -> dict | None:
    """The second_regime: section checked (its paths as the file names them)."""
    if section is None:
        return None
    where = "second_regime"
    if not isinstance(section, dict):
        raise VseError(f"{where}: a mapping of {', '.join(SECOND_KEYS)}", path)
    unknown = sorted(set(section) - set(SECOND_KEYS))
    missing = [key for key in ("name", "out", "budget", "base") if not section.get(key)]
    if unknown or missing:
        what = f"unknown key(s) {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise VseError(f"{where}: {what} (expected {', '.join(SECOND_KEYS)})", path)
    listed = section.get("losses") or []
    strange = [name for name in listed if name not in names]
    if not isinstance(listed, list) or strange:
        raise VseError(f"{where}: losses: names of losses: ({', '.join(map(str, strange))} is none)", path)
    best = section.get("best_of_fast", 0)
    if not isinstance(best, int) or isinstance(best, bool) or best < 0:
        raise VseError(f"{where}: best_of_fast: a whole number of at least 0, got {best!r}", path)
    parse_budget(str(section["budget"]))
    return {**section, "losses": [str(n) for n in listed], "best_of_fast": best}


def _spec(raw: dict, path: Path, losses: list[dict], runs_dir, judgments) -> Spec:
    folder = path.parent
    name = check_folder_name(str(raw.get("name") or path.stem), "name", path)
    pruner = str(raw.get("pruner", "median"))
    if pruner not in PRUNERS:
        raise VseError(f"pruner: one of {', '.join(PRUNERS)}, got {pruner!r}", path)
    seeds = raw.get("seeds", [0, 1, 2, 3, 4])
    if not isinstance(seeds, list) or len(seeds) < 2 or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) < len(seeds):
        raise VseError(f"seeds: a list of at least two distinct integers, got {seeds!r}", path)
    ints = {key: raw.get(key, 0) for key in ("sampler_seed", "member")}
    for key, value in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise VseError(f"{key}: a whole number of at least 0, got {value!r}", path)
    names = [loss["name"] for loss in losses]
    unpruned = raw.get("unpruned") or []
    strange = [str(n) for n in unpruned if n not in names] if isinstance(unpruned, list) else [str(unpruned)]
    if strange:
        raise VseError(f"unpruned: names of losses: ({', '.join(strange)} is none)", path)
    if unpruned and pruner == NO_PRUNER:
        raise VseError("unpruned: the pruner's check; with pruner: none every study is unpruned", path)
    try:  # a claim set by name, or a claims file (relative to this file's folder)
        claims = claim_set_path(str(raw.get("claims", "reality")), folder)
        load_claims(claims)
    except VseError as exc:
        raise VseError(f"claims: {exc}", path) from None
    file_runs_dir = resolved_path(raw["runs_dir"], folder) if raw.get("runs_dir") else "runs"
    root = Path(runs_dir or file_runs_dir) / name
    file_judgments = resolved_path(raw["judgments"], folder) if raw.get("judgments") else None
    relevance = resolved_path(raw["cs_relevance"], folder) if raw.get("cs_relevance") else None
    spec = Spec(path, name, root, parse_budget(str(raw["budget"])), pruner, ints["sampler_seed"], seeds,
                ints["member"], Path(resolved_path(raw["out"], folder)), judgments or file_judgments,
                relevance, claims, names)
    table = {**raw, "base": resolve_paths(raw["base"], folder)}
    spec.table, spec.entries = table, {loss["name"]: loss for loss in losses}
    for loss in losses:
        if not isinstance(loss.get("search", {}), dict):
            raise VseError(f"losses: {loss['name']}: search: must be a mapping", path)
        check_folder_name(loss["name"] + UNPRUNED + TUNED, "losses: name", path)
        for check in (False, True) if loss["name"] in unpruned else (False,):
            study = LossStudy("clean", loss["name"], root, {}, NO_PRUNER if check else pruner, check)
            study.config = tt._tune_config(table, {}, loss, root, study.name)
            spec.studies.append(study)
        base = tt.merged_base(table["base"], loss, {"epochs": spec.epochs})
        defaults = Defaults(loss["name"], root, {})
        where = defaults.export.parent  # the sweep file's paths as from its folder
        defaults.config = {"name": defaults.name, **paths_for_file({"runs_dir": str(root)}, where),
                           "base": paths_for_file(base, where)}
        spec.defaults.append(defaults)
    taken = [s.name for s in spec.studies] + [d.name for d in spec.defaults]
    if len(set(taken)) < len(taken):
        raise VseError("losses: two studies or sweeps share a folder name", path)
    return spec


def check_searches(spec: Spec) -> None:
    """Each study's tune file read and checked by `vse tune`'s own rules (its ranges tried at their
    ends; every trial of the budget's epochs reaches its method) before anything is written or
    trained: written to a temporary folder, paths as from there."""
    import yaml

    with tempfile.TemporaryDirectory() as folder:
        for study in spec.studies:
            config = tt._tune_config(spec.table, {}, spec.entries[study.method], spec.root, study.name,
                                     Path(folder))
            path = Path(folder) / f"{study.name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            try:
                tune = load_tune(path)
                tune.base["epochs"] = spec.budget.epochs  # as `vse tune --budget` sets it
                check_schedules(tune)  # no trial trains another method under its loss's name
            except VseError as exc:
                raise VseError(f"losses: {study.method}: {str(exc).replace(str(path) + ': ', '')}",
                               spec.path) from None


# ---------------------------------------------------------------------------- what is done
def same_options(spec: Spec, loss: str) -> bool:
    """The unpruned study's export holds the pruned study's options (then its seeds are not trained)."""
    import yaml

    pruned, unpruned = spec.study(loss), spec.study(loss, check=True)
    if unpruned is None or not (tt.exported(pruned) and tt.exported(unpruned)):
        return False
    read = [yaml.safe_load(s.export.read_text(encoding="utf-8"))["base"] for s in (pruned, unpruned)]
    return read[0] == read[1]


def seed_arms(spec: Spec) -> list:
    """Every sweep of seeds: the defaults, each study's export (an unpruned one with options of its
    own), in the spec's loss order."""
    arms = []
    for loss in spec.losses:
        arms.append(next(d for d in spec.defaults if d.method == loss))
        arms.append(spec.study(loss))
        unpruned = spec.study(loss, check=True)
        if unpruned is not None and not same_options(spec, loss):
            arms.append(unpruned)
    return arms


def arm_kind(arm) -> str:
    return "default" if isinstance(arm, Defaults) else "unpruned" if arm.check else "tuned"


def seed_runs_of(spec: Spec, arms) -> list[Path]:
    return [arm.seed_run(seed) for arm in arms for seed in spec.seeds]


def done_seed_runs(spec: Spec, arm) -> int:
    from pipeline.training.run_folder import DONE_MARKER

    return sum((arm.seed_run(seed) / DONE_MARKER).is_file() for seed in spec.seeds)


# ---------------------------------------------------------------------------- the protocol
def write_files(spec: Spec) -> list[str]:
    """Each study's tune file and each loss's defaults sweep file, rewritten only when it changes."""
    import yaml

    changed = []
    for path, config, name in [(s.tune_file, s.config, s.name) for s in spec.studies] + \
                              [(d.export, d.config, d.name) for d in spec.defaults]:
        text = yaml.safe_dump(config, sort_keys=False)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


def protocol(spec: Spec, jobs: int = 1, plots: bool = True, echo=print) -> dict:
    """Run every step that is not done; returns {step: "ran" | "skipped"}."""
    done = {}
    results = spec.out / "results.csv"
    seeds = ",".join(map(str, spec.seeds))

    def step(name: str, ran: bool, detail: str = "") -> None:
        done[name] = "ran" if ran else "skipped"
        echo(f"[{name}] {'ran' if ran else 'skipped (done)'}" + (f": {detail}" if detail else ""))

    check_searches(spec)  # every study's search checked before any file or trial
    changed = write_files(spec)
    for study in spec.studies:
        load_tune(study.tune_file)
    step("files", bool(changed), f"wrote {', '.join(changed)}" if changed else "")

    todo = [d for d in spec.defaults if not tt.seeded(d, spec)]
    tasks = [(d.name, tt.vse_args("sweep", d.export, "--seeds", seeds, "--resume")) for d in todo]
    tt._check(tt.run_all(tasks, jobs), "defaults", spec)
    step("defaults", bool(todo), f"{len(todo)} losses × seeds {seeds}")

    extra = [] if plots else ["--no-plots"]
    budget = f"{spec.budget.trials}x{spec.budget.epochs}"
    todo = [s for s in spec.studies if not tt.tuned(s, spec.budget)]
    tasks = [(s.name, tt.vse_args("tune", s.tune_file, "--budget", budget, "--pruner", s.pruner,
                                  "--sampler-seed", spec.sampler_seed, *extra)) for s in todo]
    tt._check(tt.run_all(tasks, jobs), "tune", spec)
    step("tune", bool(todo), f"{len(todo)} of {len(spec.studies)} studies, budget {spec.budget}")

    todo = [s for s in spec.studies if not tt.exported(s)]
    tasks = [(s.name, tt.vse_args("tune", s.tune_file, "--export", s.export, "--no-plots")) for s in todo]
    tt._check(tt.run_all(tasks, jobs), "export", spec)
    step("export", bool(todo), f"{len(todo)} studies")

    studies = [arm for arm in seed_arms(spec) if isinstance(arm, LossStudy)]
    todo = [s for s in studies if not tt.seeded(s, spec)]
    stale = [str(s.sweep_folder) for s in todo if tt.earlier_best(s, spec)]
    if stale:
        raise VseError(f"{', '.join(stale)}: seed runs of an earlier best trial (the study's best changed): "
                       "move the folder away to train the new best", spec.path)
    tasks = [(s.name, tt.vse_args("sweep", s.export, "--seeds", seeds, "--epochs", spec.epochs, "--resume"))
             for s in todo]
    tt._check(tt.run_all(tasks, jobs), "seeds", spec)
    same = [loss for loss in spec.losses if same_options(spec, loss)]
    step("seeds", bool(todo), f"{len(todo)} studies × seeds {seeds}"
         + (f"; unpruned = pruned options, not trained again: {', '.join(same)}" if same else ""))

    runs = seed_runs_of(spec, seed_arms(spec))
    ran = not tt.holds_runs(results, runs)
    if ran:
        tt._check(tt.run_all([("evaluate", evaluate_args(spec, runs, results))], 1), "evaluate", spec)
    step("evaluate", ran, str(results))

    outputs = [spec.out / name for name in SUMMARY_FILES] + tables(spec)
    inputs = [results, spec.claims,
              *(r for s in spec.studies for r in s.folder.glob(f"trial_*/{tt.TRIAL_FILE}"))]
    ran = not tt.fresh(outputs, inputs)
    if ran:
        write_summary(spec, arm_rows(spec, results), same)
    step("summary", ran, ", ".join(p.name for p in outputs))

    claims_file = claims_for(spec, results)
    ran = not tt.fresh([spec.out / "claims.json"], [results, claims_file])
    if ran:
        args = tt.vse_args("claims", claims_file, "--out", spec.out / "claims.json")
        tt._check(tt.run_all([("claims", args)], 1), "claims", spec)
    step("claims", ran, str(spec.out / "claims.json"))
    return done


def evaluate_args(spec: Spec, runs: list[Path], results: Path) -> list[str]:
    judged = ["--judgments", spec.judgments] if spec.judgments else []
    relevance = ["--relevance", spec.cs_relevance] if spec.cs_relevance else []
    return tt.vse_args("evaluate", *(a for run in runs for a in ("--runs", run)), "--split", "test",
                       "--member", spec.member, *judged, *relevance, "--out", results, "--keep-evaluated")


def claims_for(spec: Spec, results: Path) -> Path:
    """The claims file that reads ``results``: the spec's own when its results: are these, else a copy
    pointing here (OUT/claims.yaml), rewritten when the spec's file changes."""
    import yaml

    claims = load_claims(spec.claims)
    if [p.resolve() for p in claims.results] == [results.resolve()]:
        return spec.claims
    copy = spec.out / "claims.yaml"
    content = read_yaml_mapping(spec.claims, "claims file", "")
    content = {**content, "results": str(results.resolve()), "out": str((spec.out / "claims.json").resolve())}
    text = (f"# {spec.claims} read against {results} (written by {Path(__file__).name})\n"
            + yaml.safe_dump(content, sort_keys=False))
    if not copy.is_file() or copy.read_text(encoding="utf-8") != text:
        tt._write(copy, text)
    return copy


# ---------------------------------------------------------------------------- the rows
def arm_rows(spec: Spec, results: Path) -> dict:
    """{(loss, kind): rows} of results.csv, one row per seed run: its network ``member`` alone when
    the run is co-trained (the row ``vse evaluate --member`` adds), else its own; each row's run named
    method=LOSS,options=KIND[,member=M],seed=N."""
    from pipeline.reports.report import read_results

    by_folder = {arm.sweep_folder.resolve(): (arm.method, arm_kind(arm)) for arm in seed_arms(spec)}
    runs = {}
    for row in read_results(results):
        run = Path(str(row.get("checkpoint"))).parent.resolve()
        if run.parent in by_folder:
            runs.setdefault(run, []).append(row)
    out = {}
    for run, rows in runs.items():
        loss, kind = by_folder[run.parent]
        members = [r for r in rows if r.get(MEMBER) not in (None, "")]
        row = members[0] if members else rows[0]
        name = f"method={loss},options={kind}" + (f",member={spec.member}" if members else "")
        out.setdefault((loss, kind), []).append({**row, "run": f"{name},{run.name}"})
    return out


def best_of(spec: Spec, n: int, exclude=()) -> list[str]:
    """The ``n`` losses of the spec's best mean tuned test rsum (one network each), besides ``exclude``:
    the second regime's choice. VseError when the results are not there yet."""
    results = spec.out / "results.csv"
    if n == 0:
        return []
    if not results.is_file():
        raise VseError(f"second_regime: best_of_fast: {n}: the fast loop has no results yet ({results}): "
                       "run it first", spec.path)
    rows = arm_rows(spec, results)
    means = {loss: mean_std(rsums(rows[(loss, "tuned")]))[0] for loss in spec.losses
             if (loss, "tuned") in rows and loss not in exclude}
    return sorted(means, key=lambda loss: -means[loss])[:n]


# ---------------------------------------------------------------------------- --dry-run
def dry_run(spec: Spec, jobs: int = 1, echo=print) -> dict:
    """Each step's state, and the cost still ahead estimated from the minutes measured so far (this
    experiment's own trials and seed runs; nothing is trained or written)."""
    import yaml

    check_searches(spec)
    states = {}
    results = spec.out / "results.csv"
    stale = [s.name for s in spec.studies if not s.tune_file.is_file()
             or s.tune_file.read_text(encoding="utf-8") != yaml.safe_dump(s.config, sort_keys=False)]
    stale += [d.name for d in spec.defaults if not d.export.is_file()
              or d.export.read_text(encoding="utf-8") != yaml.safe_dump(d.config, sort_keys=False)]
    states["files"] = f"{len(stale)} to write" if stale else "done"
    echo(f"[files] {states['files']}: {len(spec.studies)} tune files, {len(spec.defaults)} sweep files")
    for d in spec.defaults:
        echo(f"[defaults] {d.name}: {done_seed_runs(spec, d)}/{len(spec.seeds)} seed runs done")
    states["defaults"] = "done" if all(tt.seeded(d, spec) for d in spec.defaults) else "to do"
    for s in spec.studies:
        counts = trial_counts(s)
        echo(f"[tune] {s.name}: {counts['complete'] + counts['pruned']}/{spec.budget.trials} trials "
             f"({counts['complete']} complete, {counts['pruned']} pruned; drawn {counts['random']} random, "
             f"{counts['tpe']} TPE), "
             f"{s.pruner} pruner, {study_minutes(s):.1f} min")
    states["tune"] = "done" if all(tt.tuned(s, spec.budget) for s in spec.studies) else "to do"
    for s in spec.studies:
        best = tt.best_record(s)
        echo(f"[export] {s.name}: " + ("done" if tt.exported(s) else "to do")
             + (f" (best so far: trial {best['trial']}, dev {best['value']:.1f})" if best else ""))
    states["export"] = "done" if all(tt.exported(s) for s in spec.studies) else "to do"
    for s in spec.studies:
        same = s.check and same_options(spec, s.method)
        done = f"{done_seed_runs(spec, s)}/{len(spec.seeds)} seed runs done"
        echo(f"[seeds] {s.name}{TUNED}: " + ("the pruned study's options: not trained" if same else done))
    states["seeds"] = "done" if all(tt.seeded(s, spec) for s in seed_arms(spec) if isinstance(s, LossStudy)) \
        else "to do"
    runs = seed_runs_of(spec, seed_arms(spec))
    states["evaluate"] = "done" if tt.holds_runs(results, runs) else "to do"
    echo(f"[evaluate] {results}: {states['evaluate']} ({len(runs)} seed runs)")
    for name, outputs in (("summary", [spec.out / n for n in SUMMARY_FILES] + tables(spec)),
                          ("claims", [spec.out / "claims.json"])):
        ready = states["evaluate"] == "done" and all(p.is_file() for p in outputs)
        states[name] = "done" if ready else "to do"
        echo(f"[{name}] {states[name]}: {', '.join(p.name for p in outputs)}")
    if spec.second:
        echo(f"[second regime] declared: {spec.second['name']}, budget {spec.second['budget']}, losses "
             f"{', '.join(spec.second['losses'])} and the {spec.second['best_of_fast']} best of this one "
             "(run with --second-regime when this one is done)")
    for line in estimate(spec, jobs):
        echo(line)
    return states


def estimate(spec: Spec, jobs: int) -> list[str]:
    """The cost ahead from the minutes per epoch measured here: each study's own trials when it has
    some (its pruning included), else every study's per epoch times the budget's epochs (no pruning:
    an upper bound); seed runs from the seed runs measured, else the trials' per-epoch minutes."""
    trial_minutes, trial_epochs, run_minutes, run_count = 0.0, 0, 0.0, 0
    for s in spec.studies:
        for r in tt.trial_records(s):
            if r.get("state") in tt.COUNTED and r.get("minutes") is not None and r.get("intermediate"):
                trial_minutes += r["minutes"]
                trial_epochs += len(r["intermediate"])
    for arm in [*spec.defaults, *spec.studies]:
        minutes = tt.seed_minutes(arm, spec)
        if minutes is not None:
            run_minutes, run_count = run_minutes + minutes, run_count + len(spec.seeds)
    per_epoch = trial_minutes / trial_epochs if trial_epochs else run_minutes / (run_count * spec.epochs) \
        if run_count else None
    per_run = run_minutes / run_count if run_count else per_epoch and per_epoch * spec.epochs
    if per_epoch is None:
        return ["[cost] nothing measured yet: no finished trial or seed sweep (run the first step, then "
                "--dry-run again)"]
    ahead = 0.0
    for s in spec.studies:
        counts = trial_counts(s)
        left = max(spec.budget.trials - counts["complete"] - counts["pruned"], 0)
        own = [r["minutes"] for r in tt.trial_records(s) if r.get("state") in tt.COUNTED
               and r.get("minutes") is not None]
        ahead += left * (sum(own) / len(own) if own else per_epoch * spec.epochs)
    runs_left = sum(len(spec.seeds) - done_seed_runs(spec, arm) for arm in seed_arms(spec))
    ahead += runs_left * per_run
    return [f"[cost] measured: {trial_minutes:.1f} min over {trial_epochs} trial epochs, {run_minutes:.1f} "
            f"min over {run_count} seed runs (process time); ahead: about {ahead:.0f} min of process time, "
            f"{ahead / max(jobs, 1) / 60:.1f} h of wall time at --jobs {jobs} (studies without trials of "
            "their own counted unpruned at the measured minutes per epoch; a co-trained loss costs more)"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="experiments/f8k_reality.yaml")
    parser.add_argument("--jobs", type=int, default=1, help="studies (tunes, seed sweeps) run at once, as "
                        "processes sharing the cores")
    parser.add_argument("--no-plots", action="store_true", help="vse tune draws no plots")
    parser.add_argument("--runs-dir", help="parent of the experiment's runs folder (default: the spec's "
                        "runs_dir:)")
    parser.add_argument("--judgments", help="human judgments for `vse evaluate` (default: the spec's "
                        "judgments:)")
    parser.add_argument("--second-regime", action="store_true", help="run the spec's second_regime: (after "
                        "the first regime's results)")
    parser.add_argument("--dry-run", action="store_true", help="list every step's state and the cost ahead; "
                        "train and write nothing")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec, args.runs_dir, args.judgments, args.second_regime)
        if args.dry_run:
            dry_run(spec, jobs=max(1, args.jobs))
        else:
            protocol(spec, jobs=max(1, args.jobs), plots=not args.no_plots)
    except VseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
