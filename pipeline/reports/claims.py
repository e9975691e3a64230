"""`vse claims FILE.yaml`: the papers' claims ("A beats B on M") tested over seeds, as data.

A claims file (YAML) names the results table(s) the claims read and lists the claims; relative paths
are read from the file's own folder. The claim sets of this repository's results folders live in
``experiments/claims/`` (``CLAIMS_DIR``), one file per set, named by the set (``noisy.yaml``: the set
``noisy``, which a tune table spec's ``claims: noisy`` names too)::

    results: ../../bench/results/f8k_fast/results.csv   # or a list: their rows one table
    out: ../../bench/results/f8k_fast/claims.json       # optional; --out replaces it
    claims:
      - claim: VSE++ (max of hinges) beats VSE0 (sum of hinges)
        paper: VSE++
        better: mh          # a configuration: a loss name, or a run name without its seed=N
        worse: sh
        metric: rsum        # a metric of pipeline/evaluation/metric_table.py: which way is better is its
        across_ensemble: false  # optional: true compares configurations of different ensemble sizes
    ranking:                # optional: do some methods rank alike on two tables? (``same_ranking``)
      claim: the ranking of mh, rcl, ncr is the same on the fast loop and on SGR (image20)
      methods: [mh, rcl, ncr]
      tables:               # name: the table's results and how a method's configuration is named in it
        fast: {results: ../../bench/results/f8k_noisy/results.csv, label: "noise=image20,method={}"}
        sgr: {results: ../../bench/results/f8k_noisy_sgr/results.csv, label: "method={}"}

A configuration is named by its loss (the first configuration of that loss in the table) or by its
label (``report.seed_groups``: the run name without the seed; a sweep's grid point, e.g.
``image=grid-gpo``). Each claim compares the two configurations' per-seed values of its metric with
Welch's one-sided t-test (pipeline.evaluation.stats, docs/PROTOCOL.md "Seeds and significance"):
"holds" when p < ALPHA in the claimed direction, "reversed" when p < ALPHA the other way, otherwise
"inside the seed noise". Configurations of two precisions are "not compared" (core.precision), a
name that two configurations answer to (the same label in two code identities or precisions) is
"not compared" either, and so are configurations averaging different numbers of networks' scores
(``report.row_ensemble``: ncr's two co-trained networks against one network; docs/PROTOCOL.md
"Ensemble size") unless the claim says ``across_ensemble: true`` (its verdict then records both sizes).
Fewer than two seeds on a side is "not testable".

The result (claims.json, ``CLAIMS_FORMAT``) is written atomically and never over a file that is not
one (pipeline/core/fsutil.guard_output).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import precision
from pipeline.core.errors import VseError
from pipeline.core.fsutil import guard_output, write_atomic
from pipeline.evaluation.metrics import is_metric, metric_of
from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater
from pipeline.reports.batch_eval import MEMBER
from pipeline.reports.report import mixed_ensembles, read_results, row_ensemble, row_precision, seed_groups

CLAIMS_FORMAT = "vse-claims"   # claims.json's leading "format" item (fsutil.output_format)
CLAIMS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "claims"  # this repository's claim sets
TEST = f"Welch one-sided over seeds, alpha {ALPHA}"
FILE_KEYS = ("results", "out", "claims", "ranking")
CLAIM_KEYS = ("claim", "paper", "better", "worse", "metric", "across_ensemble")
OPTIONAL_KEYS = ("paper", "across_ensemble")
RANKING_KEYS = ("claim", "methods", "tables")
RANKING_RULE = "holds/reversed over the pairs Welch separates (p < 0.05) on both networks"


@dataclass(frozen=True)
class Claim:
    """"``better`` beats ``worse`` on ``metric``" (which way is better: the metric table's)."""

    claim: str
    paper: str
    better: str
    worse: str
    metric: str
    across_ensemble: bool = False   # compared even when the two average different numbers of networks

    @property
    def lower_is_better(self) -> bool:
        return not metric_of(self.metric).higher_is_better


@dataclass
class ClaimsFile:
    path: Path
    results: list[Path]
    out: Path | None
    claims: list[Claim]
    ranking: dict | None = None     # {"claim", "methods", "tables": {name: (results path, label)}}


# ---------------------------------------------------------------------------- the file


def claim_set_path(name: str, folder=None) -> Path:
    """A claim set of this repository by name (``experiments/claims/NAME.yaml``), or a path to a
    claims file (a relative one from ``folder`` when given: the folder of the file that names it);
    VseError naming the sets when neither exists."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path if folder is None or path.is_absolute() else Path(folder) / path
    found = CLAIMS_DIR / f"{name}.yaml"
    if not found.is_file():
        sets = sorted(p.stem for p in CLAIMS_DIR.glob("*.yaml"))
        raise VseError(f"{name!r} is no claim set of {CLAIMS_DIR.relative_to(CLAIMS_DIR.parents[1])}/ "
                       f"(one of {', '.join(sets)}) and no claims .yaml file")
    return found


def load_claims(path) -> ClaimsFile:
    """Read and check a claims file; every problem is one VseError naming the file and the entry."""
    from pipeline.training.sweep import read_yaml_mapping

    path = Path(path)
    spec = read_yaml_mapping(path, "claims file", "results: and claims:")
    unknown = sorted(set(spec) - set(FILE_KEYS))
    if unknown:
        raise VseError(f"unknown key(s) {', '.join(unknown)} (expected {', '.join(FILE_KEYS)})", path)
    if not spec.get("claims") or not isinstance(spec["claims"], list):
        raise VseError("claims: a non-empty list of claims (claim:, paper:, better:, worse:, metric:)", path)
    claims = [_claim(entry, i, path) for i, entry in enumerate(spec["claims"], 1)]
    out = _relative(spec["out"], path, "out") if spec.get("out") else None
    ranking = _ranking(spec["ranking"], path) if spec.get("ranking") is not None else None
    return ClaimsFile(path, _results(spec.get("results"), path, "results"), out, claims, ranking)


def _relative(value, path: Path, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise VseError(f"{key}: a path, got {value!r}", path)
    given = Path(os.path.expanduser(value))
    return given if given.is_absolute() else Path(os.path.normpath(path.parent / given))


def _results(value, path: Path, key: str) -> list[Path]:
    values = value if isinstance(value, list) else [value]
    if not value or not all(isinstance(v, str) and v for v in values):
        raise VseError(f"{key}: a results .csv (or a list of them), got {value!r}", path)
    return [_relative(v, path, key) for v in values]


def _claim(entry, i: int, path: Path) -> Claim:
    where = f"claims: {i}"
    if not isinstance(entry, dict):
        raise VseError(f"{where}: a mapping with {', '.join(CLAIM_KEYS)}, got {entry!r}", path)
    unknown = sorted(set(entry) - set(CLAIM_KEYS))
    missing = [k for k in CLAIM_KEYS if k not in OPTIONAL_KEYS and not entry.get(k)]
    if unknown or missing:
        what = (f"unknown key(s) {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}")
        raise VseError(f"{where}: {what} (expected {', '.join(CLAIM_KEYS)})", path)
    metric = str(entry["metric"])
    if not is_metric(metric):
        raise VseError(f"{where}: metric {metric!r} is no metric of pipeline/evaluation/metric_table.py",
                       path)
    across = entry.get("across_ensemble", False)
    if not isinstance(across, bool):
        raise VseError(f"{where}: across_ensemble: true or false, got {across!r}", path)
    return Claim(str(entry["claim"]), str(entry.get("paper") or ""), str(entry["better"]),
                 str(entry["worse"]), metric, across)


def _ranking(entry, path: Path) -> dict:
    where = "ranking"
    if not isinstance(entry, dict) or set(entry) - set(RANKING_KEYS) or not all(entry.get(k)
                                                                               for k in RANKING_KEYS):
        raise VseError(f"{where}: a mapping with {', '.join(RANKING_KEYS)}", path)
    methods, tables = entry["methods"], entry["tables"]
    if not isinstance(methods, list) or len(methods) < 2:
        raise VseError(f"{where}: methods: a list of at least two names, got {methods!r}", path)
    if not isinstance(tables, dict) or len(tables) != 2:
        raise VseError(f"{where}: tables: two tables by name, each with results: and label:", path)
    checked = {}
    for name, table in tables.items():
        if not isinstance(table, dict) or set(table) != {"results", "label"} or "{}" not in str(
                table["label"]):
            raise VseError(f"{where}: tables: {name}: results: and label: (a configuration's name, {{}} "
                           "the method)", path)
        checked[str(name)] = (_results(table["results"], path, f"{where}: tables: {name}: results"),
                              str(table["label"]))
    return {"claim": str(entry["claim"]), "methods": [str(m) for m in methods], "tables": checked}


# ---------------------------------------------------------------------------- the verdicts


def claim_groups(rows) -> dict:
    """Each configuration of ``rows`` (a results table's rows, over seeds) by the names a claim may
    give it: its loss (the first configuration of that loss) and its label (the run name without
    the seed). A label two configurations answer to maps to the list of both (never pooled)."""
    groups, labels = {}, {}
    for g in seed_groups(rows):
        labels.setdefault(g.label, []).append(g)
    for g in seed_groups(rows):
        groups.setdefault(g.rows[0].get("loss"), g)
    groups.update({label: found[0] if len(found) == 1 else found for label, found in labels.items()})
    return groups


def _peaked_last(row: dict) -> bool:
    """True when a run's best epoch is its last one, so it might have gone on improving."""
    try:
        return int(float(row["epochs_to_best"])) >= int(float(row["epochs"]))
    except (KeyError, TypeError, ValueError):
        return False


def verdicts(groups: dict, claims) -> list[dict]:
    """The verdict of each of ``claims`` (``Claim``) on ``groups`` (``claim_groups``)."""
    out = []
    for c in claims:
        better, worse, metric = c.better, c.worse, c.metric
        if better not in groups or worse not in groups:
            out.append({"claim": c.claim, "verdict": "not measured"})
            continue
        ambiguous = [name for name in (better, worse) if isinstance(groups[name], list)]
        if ambiguous:
            out.append({"claim": c.claim, "verdict": f"not compared: {ambiguous[0]!r} names "
                        f"{len(groups[ambiguous[0]])} configurations (another code, precision or options)"})
            continue
        if metric not in groups[better].samples or metric not in groups[worse].samples:
            out.append({"claim": c.claim, "verdict": "not measured"})
            continue
        labels = {name: row_precision(groups[name].rows[0]) for name in (better, worse)}
        if line := precision.mixed(labels):  # two precisions are two methods (core/precision)
            out.append({"claim": c.claim, "verdict": f"not compared: {line}"})
            continue
        sizes = {name: row_ensemble(groups[name].rows[0]) for name in (better, worse)}
        if (line := mixed_ensembles(sizes)) and not c.across_ensemble:  # ncr's two networks against one
            out.append({"claim": c.claim, "verdict": f"not compared: {line} (across_ensemble: true "
                        "compares them)"})
            continue
        a, b = groups[better].samples[metric], groups[worse].samples[metric]
        if min(len(a), len(b)) < 2:
            out.append({"claim": c.claim,
                        "verdict": f"not testable: {len(a)} and {len(b)} seeds (one seed is an anecdote)"})
            continue
        sign = -1.0 if c.lower_is_better else 1.0
        p_claimed = welch_greater([sign * v for v in a], [sign * v for v in b])
        p_reverse = welch_greater([sign * v for v in b], [sign * v for v in a])
        verdict = ("holds" if p_claimed < ALPHA else "reversed" if p_reverse < ALPHA
                   else "inside the seed noise")
        if metric == "epochs_to_best" and all(_peaked_last(r) for g in (better, worse)
                                              for r in groups[g].rows):
            verdict = "not measurable: every run was best at its last epoch (still improving)"
        (ma, sa, na), (mb, sb, nb) = mean_std(a), mean_std(b)
        out.append({"claim": c.claim, "paper": c.paper, "metric": metric,
                    better: {"mean": ma, "std": sa, "n": na}, worse: {"mean": mb, "std": sb, "n": nb},
                    "p_claimed": p_claimed, "p_reverse": p_reverse, "verdict": verdict,
                    **({"precision": labels[better]} if labels[better] != precision.UNRECORDED else {}),
                    **({"ensemble": sizes} if line else {})})
    return out


def read_tables(paths) -> list[dict]:
    """The rows of one or more results tables, one after another; a row that another one already
    holds (the same checkpoint bytes, evaluation, member and re-scoring: e.g. a run evaluated in two
    tables, or as its own row and as a partner of `--average-with-runs`) is read once, so one
    run is never two seeds."""
    rows, seen = [], set()
    for row in (row for path in paths for row in read_results(path)):
        key = (row.get("checkpoint_sha256"), row.get("evaluation_id"), row.get(MEMBER), row.get("rescore"))
        if key[0] and key[1]:  # rows of older tables without them are all read
            if key in seen:
                continue
            seen.add(key)
        rows.append(row)
    return rows


def same_ranking(ranking: dict) -> dict:
    """Do ``ranking``'s methods rank alike on its two tables (rsum)? For every pair of methods, its
    order on each table and whether Welch's test separates it there (an order inside the seed noise
    is no evidence either way)."""
    methods = ranking["methods"]
    tables = {}
    for name, (paths, label) in ranking["tables"].items():
        wanted = {label.format(m) for m in methods}
        tables[name] = (label, {g.label: g for g in seed_groups(read_tables(paths)) if g.label in wanted})
    pairs = []
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            entry = {"pair": f"{a} vs {b}"}
            for name, (label, table) in tables.items():
                ga, gb = table.get(label.format(a)), table.get(label.format(b))
                if ga is None or gb is None:
                    entry[name] = "not measured"
                    continue
                sa, sb = ga.samples["rsum"], gb.samples["rsum"]
                p = min(welch_greater(sa, sb), welch_greater(sb, sa))
                entry[name] = {"order": f"{a} > {b}" if mean_std(sa)[0] > mean_std(sb)[0] else f"{b} > {a}",
                               "p": p, "separated": p < ALPHA}
            pairs.append(entry)
    names = list(tables)
    measured = [e for e in pairs if all(isinstance(e.get(n), dict) for n in names)]
    both = [e for e in measured if all(e[n]["separated"] for n in names)]
    verdict = ("not measured" if not measured else "inside the seed noise" if not both else
               "holds" if all(len({e[n]["order"] for n in names}) == 1 for e in both) else "reversed")
    return {"claim": ranking["claim"], "pairs": pairs, "verdict": verdict, "rule": RANKING_RULE}


def run_claims(spec: ClaimsFile, out: Path | None = None) -> dict:
    """claims.json's object: the format, the results read (relative to the output's folder), the
    test and each claim's verdict (and the ranking's, when the file has one)."""
    where = Path(out or output_path(spec)).parent

    def shown(paths):
        named = [os.path.relpath(p, where) for p in paths]
        return named[0] if len(named) == 1 else named

    result = {"format": CLAIMS_FORMAT, "results": shown(spec.results), "test": TEST,
              "claims": verdicts(claim_groups(read_tables(spec.results)), spec.claims)}
    if spec.ranking:
        result["ranking"] = same_ranking(spec.ranking)
    return result


def output_path(spec: ClaimsFile, out=None) -> Path:
    """--out, else the file's out:, else FILE.json beside FILE.yaml."""
    return Path(out) if out else spec.out or spec.path.with_suffix(".json")


def claims_json(result: dict) -> str:
    return json.dumps(result, indent=1) + "\n"


def write_claims(path, out=None, overwrite: bool = False) -> tuple[Path, dict]:
    """Test the claims of the claims file ``path`` and write claims.json (checked before anything is
    read: never over a file that is not a claims file, unless ``overwrite``)."""
    spec = load_claims(path)
    target = output_path(spec, out)
    guard_output(target, CLAIMS_FORMAT, "a vse claims file", overwrite)
    result = run_claims(spec, target)
    write_atomic(target, claims_json(result).encode("utf-8"))
    return target, result


def format_verdicts(result: dict) -> str:
    """One line per claim: its verdict and its claimed p."""
    lines = [f"{result['test']}:"]
    for c in result["claims"]:
        tested = isinstance(c.get("p_claimed"), float) and not c["verdict"].startswith("not ")
        p = f" (p {c['p_claimed']:.3g})" if tested else ""
        lines.append(f"- {c['claim']}: {c['verdict']}{p}")
    if result.get("ranking"):
        lines.append(f"- {result['ranking']['claim']}: {result['ranking']['verdict']}")
    return "\n".join(lines)
