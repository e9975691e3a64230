"""The reality check's summary and tables (experiments/reality_check.py, step 7 "summary"): studies.json,
default_vs_tuned.md, pruner_check.md, table_recall.md (table_human.md with judgments) and
claims_compare.json, written from the seed runs' rows of results.csv and the studies' trial records.

Kept apart from the spec and the steps so neither module grows past what one reads at once; the
imports run one way: reality_check.py imports this module (the writers, the trial counts its --dry-run
prints, the names shared by both), and this module imports nothing from it at run time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tune_table as tt  # noqa: E402

from pipeline.evaluation.stats import ALPHA, mean_std  # noqa: E402
from pipeline.reports.batch_eval import MEMBER  # noqa: E402
from pipeline.reports.claims import load_claims  # noqa: E402
from pipeline.training.tune import DRAWN, TPE_STARTUP_TRIALS  # noqa: E402
from pipeline.training.tune_spec import NO_PRUNER  # noqa: E402

if TYPE_CHECKING:  # annotations only: reality_check imports this module
    from reality_check import LossStudy, Spec

TUNED = "-best"                 # `vse tune --export`'s sweep: STUDY-best (tune_table.Study.sweep_folder)
KINDS = ("default", "tuned", "unpruned")
SUMMARY_FORMAT = "vse-reality-studies"
SUMMARY_FILES = ("studies.json", "default_vs_tuned.md", "pruner_check.md", "claims_compare.json")


# ---------------------------------------------------------------------------- a study's trials
def trial_counts(study: LossStudy) -> dict:
    """The study's trials by state, and its counted ones (COMPLETE + PRUNED) by how they were drawn."""
    records = tt.trial_records(study)
    states = [r.get("state") for r in records]
    counted = [r for r in records if r.get("state") in tt.COUNTED]
    drawn = {kind: sum(r.get("drawn") == kind for r in counted) for kind in DRAWN}
    return {"complete": states.count("COMPLETE"), "pruned": states.count("PRUNED"),
            "failed": states.count("FAIL"), "running": states.count("RUNNING"),
            **{k.lower().replace("-", "_"): n for k, n in drawn.items()},
            "unrecorded": sum(r.get("drawn") not in DRAWN for r in counted),
            "epochs": sum(len(r.get("intermediate") or {}) for r in counted)}


def study_minutes(study: LossStudy) -> float:
    return sum(r["minutes"] for r in tt.trial_records(study) if r.get("minutes") is not None)


# ---------------------------------------------------------------------------- the summary and tables
def tables(spec: Spec) -> list[Path]:
    return [spec.out / "table_recall.md", *([spec.out / "table_human.md"] if spec.judgments else [])]


def rsums(rows: list[dict], metric: str = "rsum") -> list[float]:
    return [float(r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]


def write_summary(spec: Spec, rows: dict, same: list[str]) -> None:
    """Every file of the summary step from ``rows`` (reality_check.arm_rows: {(loss, kind): rows}) and
    ``same``, the losses whose unpruned study chose the pruned study's options (reality_check.same_options:
    passed in, as this module imports nothing from reality_check)."""
    from pipeline.reports.report import format_results

    flat = [row for loss in spec.losses for kind in KINDS for row in rows.get((loss, kind), [])]
    for path, layout in zip(tables(spec), ("recall", "human")):
        tt._write(path, format_results(flat, fmt="md", layout=layout, epochs=layout == "recall") + "\n")
    summary = studies_summary(spec, rows, same)
    tt._write(spec.out / "studies.json", json.dumps(summary, indent=1) + "\n")
    tt._write(spec.out / "default_vs_tuned.md", default_vs_tuned(spec, rows, summary))
    tt._write(spec.out / "pruner_check.md", pruner_table(spec, summary))
    write_claims_compare(spec, rows)


def studies_summary(spec: Spec, rows: dict, same: list[str]) -> dict:
    """studies.json: each study's best options, trial counts and minutes, the seed runs' minutes, the
    pruner's check and the cost."""
    studies = []
    for study in spec.studies:
        best = tt.best_record(study)
        studies.append({
            "study": study.name, "loss": study.method, "pruner": study.pruner,
            "best": None if best is None else {
                "trial": best["trial"], "dev_" + str(best.get("metric", "rsum")): best["value"],
                "params": best["params"], "drawn": best.get("drawn")},
            "trials": trial_counts(study), "minutes": study_minutes(study),
            "seed_minutes": tt.seed_minutes(study, spec)})
    defaults = [{"loss": d.method, "seed_minutes": tt.seed_minutes(d, spec)} for d in spec.defaults]
    tune = sum(s["minutes"] for s in studies)
    seeds = sum(s["seed_minutes"] or 0.0 for s in studies) + sum(d["seed_minutes"] or 0.0 for d in defaults)
    return {"format": SUMMARY_FORMAT, "spec": str(spec.path), "budget": str(spec.budget),
            "pruner": spec.pruner, "sampler": "TPE", "tpe_startup_trials": TPE_STARTUP_TRIALS,
            "sampler_seed": spec.sampler_seed,
            "seeds": spec.seeds, "epochs": spec.epochs, "member": spec.member, "studies": studies,
            "defaults": defaults, "pruner_check": pruner_check(spec, rows, same),
            "minutes": {"tune": tune, "seeds": seeds, "total": tune + seeds,
                        "note": "process time: wall minutes summed over runs; processes run side by side "
                                "each count"}}


def pruner_check(spec: Spec, rows: dict, same: list[str]) -> list[dict]:
    """Per unpruned study: its best options and the pruned study's, their test rsum over the seeds,
    Welch's two-sided p, and the verdict: inside the seed noise (p >= ALPHA), differs, or the same
    options (nothing trained twice)."""
    checks = []
    for study in (s for s in spec.studies if s.check):
        loss = study.method
        pruned, unpruned = rows.get((loss, "tuned"), []), rows.get((loss, "unpruned"), [])
        p = None if loss in same else tt.two_sided_p(rsums(unpruned), rsums(pruned))
        verdict = ("the same options" if loss in same else "not measured" if p is None
                   else "inside the seed noise" if p >= ALPHA else "differs")
        entry = {"loss": loss, "verdict": verdict, "p": p}
        for side, rows_of, folder in (("pruned", pruned, spec.study(loss)), ("unpruned", unpruned, study)):
            best = tt.best_record(folder)
            mean, std, n = mean_std(rsums(rows_of))
            entry[side] = {"params": best and best["params"], "trial": best and best["trial"],
                           "test_rsum": {"mean": mean, "std": std, "n": n} if n else {"n": 0},
                           "minutes": study_minutes(folder)}
        checks.append(entry)
    return checks


def _options(params: dict | None) -> str:
    return ", ".join(tt._option(k, v) for k, v in (params or {}).items())


def default_vs_tuned(spec: Spec, rows: dict, summary: dict) -> str:
    """The markdown table: per loss, the default and tuned test rsum, their difference and Welch's
    two-sided p, the chosen options and their dev value, the trials and the minutes."""
    by_study = {s["study"]: s for s in summary["studies"]}
    by_default = {d["loss"]: d for d in summary["defaults"]}
    lines = ["| loss | default rsum | tuned rsum | Δ | p | tuned options | dev (best trial) | trials: "
             "complete + pruned | drawn: random + TPE | tune min | seeds min (tuned, default) |",
             "|:---|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|"]
    for loss in spec.losses:
        before, after = rsums(rows.get((loss, "default"), [])), rsums(rows.get((loss, "tuned"), []))
        delta = f"{mean_std(after)[0] - mean_std(before)[0]:+.1f}" if before and after else ""
        p = tt.two_sided_p(after, before)
        study = by_study[loss]
        best, trials = study["best"], study["trials"]
        dev = next((v for k, v in (best or {}).items() if k.startswith("dev_")), None)
        member = any(MEMBER in r.get("run", "") for r in rows.get((loss, "tuned"), []))
        minutes = [study["seed_minutes"], by_default[loss]["seed_minutes"]]
        lines.append(" | ".join([
            f"| {loss}" + (f" (network {spec.member})" if member else ""), tt._cell(before), tt._cell(after),
            delta, "" if p is None else f"{p:.2g}", _options(best and best["params"]),
            "" if dev is None else f"{dev:.1f}", f"{trials['complete']} + {trials['pruned']}",
            f"{trials['random']} + {trials['tpe']}", f"{study['minutes']:.1f}",
            ", ".join("" if m is None else f"{m:.1f}" for m in minutes)]) + " |")
    cost = summary["minutes"]
    lines += ["", f"Test rsum, mean ± std (n seeds {', '.join(map(str, spec.seeds))}), a {spec.epochs}-epoch "
              "schedule; default: the loss's default options; tuned: its study's best trial on dev (budget "
              f"{spec.budget}: {spec.budget.trials} trials of the whole schedule, TPE after "
              f"{TPE_STARTUP_TRIALS} random start-up trials, sampler seed {spec.sampler_seed}, "
              f"{'no' if spec.pruner == NO_PRUNER else spec.pruner} pruner). Δ = tuned − default; "
              "p: Welch's two-sided t-test over the seeds. "
              f"A co-trained loss is read as its network {spec.member} alone (tuned on its networks' mean "
              "on dev, the value that picks best.pt). Minutes: wall time summed over a study's trials and "
              "over seed runs; processes run side by side count each.",
              "", f"Cost: {cost['tune']:.1f} min of tuning for {len(spec.studies)} studies, "
              f"{cost['seeds']:.1f} min of seed runs; {cost['total']:.1f} min of process time in all."]
    return "\n".join(lines) + "\n"


def pruner_table(spec: Spec, summary: dict) -> str:
    if spec.pruner == NO_PRUNER:
        return (f"No pruner: every trial of every study trained the whole {spec.epochs}-epoch schedule, so "
                "there is no pruner to check.\n")
    lines = ["| loss | pruned: options | test rsum | unpruned: options | test rsum | p | verdict | tune min "
             "(pruned, unpruned) |", "|:---|:---|---:|:---|---:|---:|:---|---:|"]
    for check in summary["pruner_check"]:
        cells = []
        for side in ("pruned", "unpruned"):
            rsum = check[side]["test_rsum"]
            cells += [_options(check[side]["params"]),
                      "" if not rsum["n"] else f"{rsum['mean']:.1f} ± {rsum['std']:.1f} ({rsum['n']})"]
        minutes = f"{check['pruned']['minutes']:.1f}, {check['unpruned']['minutes']:.1f}"
        p = "" if check["p"] is None else f"{check['p']:.2g}"
        lines.append(" | ".join([f"| {check['loss']}", *cells, p, check["verdict"], minutes]) + " |")
    lines += ["", f"The pruner's check: each loss tuned twice with the same budget ({spec.budget}) and "
              f"sampler seed, with the {spec.pruner} pruner and with none; each study's best options trained "
              f"with seeds {', '.join(map(str, spec.seeds))}. Inside the seed noise: Welch's two-sided p >= "
              f"{ALPHA} over the seeds' test rsum; the same options: both studies chose one trial's values."]
    return "\n".join(lines) + "\n"


def write_claims_compare(spec: Spec, rows: dict) -> None:
    """The spec's claims (on tuned rows, LOSS-best) tested on the default rows as well: each claim's
    two verdicts and how equal tuning changed it (tune_table.claim_change)."""
    from pipeline.reports.claims import claim_groups

    def groups(kind: str) -> dict:
        named = [{**row, "run": f"{loss}{TUNED}/{row['run'].rsplit(',', 1)[-1]}"}
                 for (loss, k), found in rows.items() if k == kind for row in found]
        return claim_groups(named)

    claims = load_claims(spec.claims).claims
    _, compared, summary = tt.compare_claims(claims, groups("default"), groups("tuned"))
    tt._write(spec.out / "claims_compare.json", json.dumps({
        "claims_file": str(spec.claims), "budget": str(spec.budget), "seeds": spec.seeds,
        "test": f"Welch one-sided over seeds, alpha {ALPHA}",
        "rule": "each claim on the default rows (LOSS-default read as LOSS-best) and on the tuned rows; "
                "holds: in both; flips: holds in one, reversed in the other; disappears: holds or reversed "
                "with the defaults, inside the seed noise tuned; appears: the other way",
        "summary": summary, "claims": compared}, indent=1) + "\n")
