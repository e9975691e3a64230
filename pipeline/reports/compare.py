"""`vse compare`: is A better than B, beyond chance?

Two runs (``compare_runs``): both are embedded on the same split (the same images and captions in
the same order, checked), their per-query ranks computed with the protocol of docs/PROTOCOL.md, and
each of R@1/5/10 (both directions) and rsum gets its difference A − B with the p-value of a paired
permutation test over the test queries (pipeline.evaluation.stats.paired_permutation_test).

Two groups of seeds (``compare_groups``: `vse compare 'runs/s/loss=topk*' 'runs/s/loss=mh*'`, or
`--runs GLOB... --baseline NAME`): every run is evaluated as `vse evaluate --runs` evaluates it
(reports.batch_eval; rows of unchanged checkpoints are taken from ``--results``), and each metric
gets each group's mean ± std (n), the difference of the means, Welch's two-sided t-test over seeds,
and, where the two groups hold the same seeds, the paired t-test over those seeds (docs/PROTOCOL.md
"Seeds and significance"). A group is one configuration: runs of several configurations, precisions
or code identities are refused unless pooled on purpose (``across_precision``, ``across_code``).

Both forms refuse to compare results that average different numbers of networks' scores (ncr's two
co-trained networks against one network; docs/PROTOCOL.md "Ensemble size") unless ``across_ensemble``;
``member`` compares a co-trained run by its network of that index alone (a run of one network as it is).

A correction against hubness (docs/PROTOCOL.md, "Re-scoring at test time"): ``compare_rescored`` is one
run's re-scored ranks (``RUN + METHOD``) against its raw ones, the same paired permutation test over the
test queries; ``compare_groups(..., rescore=plan)`` evaluates each run's re-scored rows too, and one
group is then compared with its own re-scored groups (``GROUP + METHOD`` against ``GROUP``, Welch and
paired by seed), or, with ``baseline``, every configuration, re-scored ones included, with the baseline.
A transductive row (it read the test queries) is never compared with an inductive one unless
``across_transduction``, as precisions are not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.core import code_identity, precision
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.evaluation.inference import ensemble_size
from pipeline.evaluation.metrics import metric_keys, similarity_ranks
from pipeline.evaluation.stats import ALPHA, DEFAULT_PERMUTATIONS, paired_permutation_test
from pipeline.reports.batch_eval import MEMBER, RunEvaluator
from pipeline.reports.report import mixed_ensembles, row_ensemble
from pipeline.training.factories import run_schedule_note
from pipeline.training.run_folder import run_names

COMPARED = (*metric_keys("recall"), "rsum")  # what the paired test over queries covers


def row_transductive(row: dict) -> bool:
    """Whether a results row's numbers read the evaluated queries: its ``rescore`` column ends as
    ``rescore.RescorePlan.label`` ends a transductive correction's."""
    return str(row.get("rescore") or "").endswith(", transductive")


def mixed_transduction(transductive: dict) -> str | None:
    """None when every one of ``transductive`` (name → bool) is alike, else the line naming which read
    the test queries (as ``report.mixed_ensembles`` says it of ensembles)."""
    if len(set(transductive.values())) < 2:
        return None
    read = [str(name) for name, t in transductive.items() if t]
    other = [str(name) for name, t in transductive.items() if not t]
    return (f"{', '.join(read)} read the test queries (transductive), {', '.join(other)} did not: not one "
            "protocol (--across-transduction compares them anyway)")


def refuse_transduction(plan, plain: str, where=None) -> None:
    """VseError when a correction of ``plan`` is transductive: ``PLAIN + METHOD`` would be compared with
    the raw ``plain``."""
    for method in plan.methods:
        if line := mixed_transduction({f"{plain} {plan.row_name(method)}": plan.is_transductive(method),
                                       plain: False}):
            raise VseError(line, where)


def compare_runs(run_a, run_b, *, device: torch.device, split: str = "test", features=None,
                 checkpoint: str = "best.pt", permutations: int = DEFAULT_PERMUTATIONS,
                 seed: int = 0, across_precision: bool = False, across_code: bool = False,
                 across_ensemble: bool = False, member: int | None = None) -> dict:
    """{"runs": [name_a, name_b], "split", "queries": {...}, "metrics": {key: {a, b, diff, p}},
    "precision": [label_a, label_b], "schedule": [note_a, note_b]} (a note: the run ended before its
    loss's method began, ``training.factories.run_schedule_note``; else None). Runs trained in
    different precisions are refused unless ``across_precision`` (a precision ablation compares them
    on purpose); runs of different code identity unless ``across_code``; results of different ensemble
    sizes (``"ensemble": [size_a, size_b]``) unless ``across_ensemble``. ``member``: a run of co-trained
    networks is embedded by its network ``member`` alone."""
    # both checkpoints are read once, before anything is embedded: a refusal costs no embedding
    states = [load_checkpoint(Path(run) / checkpoint) for run in (run_a, run_b)]
    labels = {str(run): precision.label_of(state) for run, state in zip((run_a, run_b), states)}
    if not across_precision and (line := precision.mixed(labels)):
        raise VseError(f"{line}: they are not one method (--across-precision compares them anyway)",
                       Path(run_b))
    codes = {str(run): code_identity.of_state(state) for run, state in zip((run_a, run_b), states)}
    if not across_code and (line := code_identity.clash(codes)):  # two versions of one file, or of vse
        raise VseError(f"{line}: not one program (--across-code compares them anyway)", Path(run_b))
    picked = [member if member is not None and ensemble_size(state) > 1 else None for state in states]
    sizes = {str(run): 1 if k is not None else ensemble_size(state)
             for run, state, k in zip((run_a, run_b), states, picked)}
    if not across_ensemble and (line := mixed_ensembles(sizes)):
        raise VseError(f"{line}: compare at equal size (--member K, or --across-ensemble compares them "
                       "anyway)", Path(run_b))
    ranks, ids = [], []
    with RunEvaluator(device, split, features=features) as evaluator:
        for run, state, k in zip((run_a, run_b), states, picked):
            emb, _, _, _ = evaluator.embed(run, checkpoint, state=state, member=k)
            ranks.append(similarity_ranks(emb.images, emb.captions, emb.caption_image,
                                          similarity=emb.similarity, device=device))
            ids.append((np.asarray(emb.caption_rows), np.asarray(emb.caption_image)))
    if len(ids[0][0]) != len(ids[1][0]) or not all(np.array_equal(x, y) for x, y in zip(*ids)):
        raise VseError(f"the runs' {split!r} splits hold different captions (trained on different "
                       "caches?): give the same --features to compare them", Path(run_b))
    metrics = paired_permutation_test(ranks[0], ranks[1], permutations=permutations, seed=seed)
    return {"runs": run_names([run_a, run_b]), "split": split, "permutations": permutations,
            "queries": {"images": int(len(ranks[0][0])), "captions": int(len(ranks[0][1]))},
            "metrics": {key: metrics[key] for key in COMPARED}, "precision": list(labels.values()),
            "ensemble": list(sizes.values()), "member": picked,
            "schedule": [run_schedule_note(Path(run)) for run in (run_a, run_b)]}



def compare_rescored(run, plan, *, device: torch.device, split: str = "test", features=None,
                     checkpoint: str = "best.pt", permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0,
                     across_transduction: bool = False) -> dict:
    """{"comparisons": [...]}: each correction of ``plan`` (``rescore.RescorePlan``) of one run against
    its raw scores, as ``compare_runs`` compares two runs (A = ``RUN + METHOD``, B = ``RUN``; the paired
    permutation test over the test queries of the ranks of the corrected and the raw matrices), with
    ``rescore``: what A's correction saw (its ``label`` and ``RescorePlan.record``), B's None. A
    transductive correction is refused before anything is embedded unless ``across_transduction``."""
    from pipeline.evaluation.command import checkpoint_banks, rescored_metrics
    from pipeline.evaluation.metrics import score_ranks
    from pipeline.evaluation.rescore import split_scores

    [name] = run_names([run])
    if not across_transduction:
        refuse_transduction(plan, name, Path(run))
    rows = [f"{name} {plan.row_name(m)}" for m in plan.methods]
    state = load_checkpoint(Path(run) / checkpoint)
    label, size = precision.label_of(state), ensemble_size(state)
    with RunEvaluator(device, split, features=features) as evaluator:
        emb, loaded, path, cache_path = evaluator.embed(run, checkpoint, state=state)
        cache = evaluator.cache(cache_path)
        bank_images = plan.check_bank(len(cache.split_rows(plan.bank_split)[0]))
        banks = None
        if plan.uses_bank:
            banks = checkpoint_banks(path, cache, emb, plan, device, loaded=loaded,
                                     captions=evaluator.captions(cache, loaded, path)).__getitem__
        scores = split_scores(emb)
        raw = score_ranks(scores, scores.T, emb.caption_image)
        corrected = [rescored_metrics(scores, emb.caption_image, m, banks)[1] for m in plan.methods]
    note = run_schedule_note(Path(run))
    comparisons = []
    for method, ranks, row in zip(plan.methods, corrected, rows):
        metrics = paired_permutation_test(ranks, raw, permutations=permutations, seed=seed)
        comparisons.append({
            "runs": [row, name], "split": split, "permutations": permutations,
            "queries": {"images": int(len(raw[0])), "captions": int(len(raw[1]))},
            "metrics": {key: metrics[key] for key in COMPARED}, "precision": [label, label],
            "ensemble": [size, size], "member": [None, None], "schedule": [note, note],
            "rescore": [{"label": plan.label(method, bank_images), **plan.record(method, bank_images)},
                        None]})
    return {"comparisons": comparisons}


def format_comparison(result: dict) -> str:
    a, b = result["runs"]
    lines = [f"A = {a}, B = {b}; {result['split']}: {result['queries']['images']} images, "
             f"{result['queries']['captions']} captions; paired permutation test over queries "
             f"({result['permutations']} sign flips, two-sided); precision (network/loss/evaluation) "
             f"{' vs '.join(dict.fromkeys(result.get('precision') or ['?']))}"
             + _ensemble_note(result.get("ensemble"), result.get("member")),
             f"{'metric':10s}{'A':>9s}{'B':>9s}{'A - B':>9s}{'p':>9s}"]
    for key, m in result["metrics"].items():
        mark = "  *" if m["p"] < 0.05 else ""
        lines.append(f"{key:10s}{m['a']:9.1f}{m['b']:9.1f}{m['diff']:+9.1f}{m['p']:9.4f}{mark}")
    lines.append("* p < 0.05")
    lines += [f"{name}: {note}" for name, note in zip("AB", result.get("schedule") or ()) if note]
    lines += [f"{name} re-scored: {seen['label']}" for name, seen in zip("AB", result.get("rescore") or ())
              if seen]
    return "\n".join(lines)


def _ensemble_note(sizes, members) -> str:
    """'; networks averaged 2 vs 1' when a side averages several networks or is one of them."""
    if not sizes or (max(sizes) == 1 and not any(k is not None for k in members or ())):
        return ""
    sides = [f"{size} (network {k} alone)" if k is not None else str(size)
             for size, k in zip(sizes, members or (None, None))]
    return "; networks averaged " + " vs ".join(sides)


# ---------------------------------------------------------------------------- groups of seeds

GROUP_TEST = ("Welch's t-test over seeds (two-sided); paired t-test over the seeds both groups hold "
              "(two-sided)")


def expand_runs(pattern) -> list[Path]:
    """The run folders of one argument: a run folder, a sweep folder (its runs) or a glob."""
    from pipeline.training.run_folder import find_runs

    found = find_runs([pattern])
    if not found and Path(pattern).is_dir():  # a run folder without its files yet: as compare_runs reads it
        found = [Path(pattern)]
    return found


def compare_groups(patterns: dict, *, device: torch.device, baseline: str | None = None, split: str = "test",
                   features=None, checkpoint: str = "best.pt", results=None, judgments=None,
                   across_precision: bool = False, across_code: bool = False, across_ensemble: bool = False,
                   member: int | None = None, rescore=None, across_transduction: bool = False,
                   echo=lambda _: None) -> dict:
    """Compare seed groups. ``patterns``: {group name: [pattern, ...]}, each group's runs one
    configuration (the two-group form, refused when its runs are several); or, with ``baseline``, one
    entry whose runs form any number of configurations (seed groups, ``report.seed_groups``), each
    compared with the one named ``baseline``. ``results``: a results.csv whose rows of unchanged
    checkpoints (the same bytes, the same evaluation) are used instead of evaluating them again.
    Groups of different ensemble sizes are refused unless ``across_ensemble``; ``member``: each
    co-trained run stands in its group by its network ``member`` alone. ``rescore``
    (``rescore.RescorePlan``): each run's re-scored rows are evaluated too; with one group (no
    ``baseline``) each of its re-scored groups (``NAME + METHOD``) is compared with it, with ``baseline``
    they are configurations as any other. A transductive group is compared with an inductive one only
    with ``across_transduction``."""
    from pipeline.reports.batch_eval import evaluate_runs
    from pipeline.reports.report import find_group, read_results, seed_groups

    runs = {name: list(dict.fromkeys(r for p in pats for r in expand_runs(p)))
            for name, pats in patterns.items()}
    for name, found in runs.items():
        if not found:
            raise VseError(f"no run folders match {' '.join(map(str, patterns[name]))}")
    if rescore is not None and baseline is None and len(patterns) != 1:
        raise VseError("re-scoring compares one group with its own re-scored rows: give one group (or "
                       "--runs ... --baseline NAME)")
    if rescore is not None and not across_transduction:  # before any evaluation: each re-scored group is
        refuse_transduction(rescore, baseline or next(iter(patterns)))  # compared with a raw one here
    if baseline is None:  # before any evaluation: each side one configuration, by its runs' configs
        for name, found in runs.items():
            _one_config_id(name, patterns[name], found)
    everything = list(dict.fromkeys(r for found in runs.values() for r in found))
    if results and not Path(results).is_file():
        raise VseError("no such results table (--results: a results.csv of `vse evaluate --runs --out`)",
                       results)
    kept = read_results(results) if results else ()
    evaluated = evaluate_runs(everything, device=device, split=split, features=features,
                              checkpoint=checkpoint, echo=echo, judgments=judgments, kept=kept, member=member,
                              rescore=rescore)
    if evaluated.skipped:
        first = evaluated.skipped[0]
        raise VseError(f"could not be evaluated ({first.reason}): a group's seeds would be missing; "
                       "leave the run out of the pattern", first.run_dir)
    by_checkpoint = {(str(row["checkpoint"]), row.get(MEMBER)): row for row in evaluated.rows
                     if not row.get("rescore")}
    by_name = {str(row["run"]): row for row in evaluated.rows}

    def row_of(run):  # its network ``member`` alone when it has one, else the run whole
        path = str(Path(run) / checkpoint)
        return by_checkpoint.get((path, member)) or by_checkpoint[(path, None)]

    def rescored(row, method):  # a raw row's re-scored row (RunEvaluator.rescored_rows' name)
        return by_name[f"{row['run']} {rescore.row_name(method)}"]

    rows = {name: [row_of(r) for r in found] for name, found in runs.items()}
    if baseline is None:
        groups = {name: _one_configuration(name, patterns[name], rows[name], across_precision, across_code)
                  for name in patterns}
        pairs = [tuple(groups)]
        if rescore is not None:
            [(name, raw)] = rows.items()
            for method in rescore.methods:
                corrected = f"{name} {rescore.row_name(method)}"
                groups[corrected] = _one_configuration(corrected, patterns[name],
                                                       [rescored(row, method) for row in raw],
                                                       across_precision, across_code)
            pairs = [(corrected, name) for corrected in groups if corrected != name]
    else:
        [name] = rows
        if rescore is not None:
            rows[name] = [r for row in rows[name]
                          for r in (row, *(rescored(row, m) for m in rescore.methods))]
        found = seed_groups(rows[name])
        base = find_group(found, baseline)
        groups = {g.label + _distinct(g, found): g for g in found}
        base_name = next(n for n, g in groups.items() if g is base)
        pairs = [(n, base_name) for n in groups if n != base_name]
    for a, b in pairs:
        sizes = {a: row_ensemble(groups[a].rows[0]), b: row_ensemble(groups[b].rows[0])}
        if not across_ensemble and (line := mixed_ensembles(sizes)):
            raise VseError(f"{line}: compare at equal size (--member K, or --across-ensemble compares them "
                           "anyway)")
        modes = {a: row_transductive(groups[a].rows[0]), b: row_transductive(groups[b].rows[0])}
        if not across_transduction and (line := mixed_transduction(modes)):
            raise VseError(line)
    return {"split": split, "test": GROUP_TEST, "alpha": ALPHA,
            "groups": {n: _described(g) for n, g in groups.items()},
            "comparisons": [_compared(a, groups[a], b, groups[b]) for a, b in pairs]}


def _distinct(group, groups) -> str:
    """' (PRECISION)' or ' (code=…)' when another group has the same label (``report.seed_groups``
    splits precisions and code identities)."""
    from pipeline.core import code_identity
    from pipeline.reports.report import row_precision

    twins = [g for g in groups if g.label == group.label]
    if len(twins) < 2:
        return ""
    if len({row_precision(g.rows[0]) for g in twins}) > 1:
        return f" ({row_precision(group.rows[0])})"
    return code_identity.labelled([g.label for g in twins], [g.rows[0] for g in twins])[
        twins.index(group)][len(group.label):]


def _one_config_id(name: str, patterns, run_dirs) -> None:
    """VseError naming the configurations when a group's runs were trained with several (their
    config.json's config_id), before anything is evaluated."""
    from pipeline.reports.batch_eval import describe_config
    from pipeline.reports.report import without_seed
    from pipeline.training.run_folder import read_code_identity, read_config

    labels = {}  # config_id as results.csv gives it → the first run's name without its seed
    for run_name, run_dir in zip(run_names(run_dirs), run_dirs):
        described = describe_config(read_config(run_dir), read_code_identity(run_dir))
        labels.setdefault(described["config_id"], without_seed(run_name))
    if len(labels) > 1:
        raise VseError(f"group {name} ({' '.join(map(str, patterns))}) holds {len(labels)} configurations "
                       f"({', '.join(labels.values())}): give one per group, or use --runs ... --baseline "
                       "NAME")


def _one_configuration(name: str, patterns, rows: list[dict], across_precision: bool, across_code: bool):
    """The one seed group of a side's rows; VseError naming what differs when they are several."""
    from pipeline.core import code_identity
    from pipeline.reports.report import row_precision, seed_group, seed_groups

    found = seed_groups(rows)
    where = f"group {name} ({' '.join(map(str, patterns))})"
    precisions = {str(row["run"]): row_precision(row) for row in rows}
    codes = {row.get(code_identity.COLUMN) or "" for row in rows}
    several_precisions, several_codes = len(set(precisions.values())) > 1, len(codes) > 1
    if len({row.get("config_id") for row in rows}) > 1 or (len(found) > 1 and not several_precisions
                                                           and not several_codes):
        labels = ", ".join(g.label for g in found)
        code = " (their code differs too: a changed plug-in is another configuration)" * several_codes
        raise VseError(f"{where} holds {len(found)} configurations ({labels}){code}: give one per group, or "
                       "use --runs ... --baseline NAME")
    if several_precisions and not across_precision:
        raise VseError(f"{where}: {precision.mixed(precisions)}: not one method (--across-precision "
                       "pools them)")
    if several_codes and not across_code:
        column = code_identity.COLUMN
        by_code = "; ".join(f"{code or 'unrecorded'}: " + ", ".join(str(r["run"]) for r in rows
                                                                   if (r.get(column) or "") == code)
                            for code in sorted(codes))
        raise VseError(f"{where}: runs of different code identity ({by_code}): not one method "
                       "(--across-code pools them)")
    pooled = found[0] if len(found) == 1 else seed_group(found[0].label, rows)
    return pooled


def _described(group) -> dict:
    from pipeline.reports.report import row_precision

    return {"runs": [str(row["run"]) for row in group.rows], "seeds": [row.get("seed") for row in group.rows],
            "precision": sorted({row_precision(row) for row in group.rows}),
            "ensemble": row_ensemble(group.rows[0]), "rescore": group.rows[0].get("rescore") or None,
            "transductive": row_transductive(group.rows[0])}


def _seed_values(group, key: str) -> dict:
    """seed → value of ``key``, for the runs whose seed is recorded once."""
    seeds = [row.get("seed") for row in group.rows]
    return {row["seed"]: float(row[key]) for row in group.rows
            if row.get("seed") is not None and seeds.count(row["seed"]) == 1 and row.get(key) is not None}


def _compared(name_a: str, a, name_b: str, b) -> dict:
    """Each metric both groups have: mean ± std (n) of each, A − B, Welch's p and the paired p."""
    from pipeline.evaluation.stats import mean_std
    from pipeline.reports.report import paired_two_sided, table_columns, welch_two_sided

    rows = [*a.rows, *b.rows]
    keys = list(dict.fromkeys(k for layout in ("recall", "human") for _, cols in table_columns(rows, layout)
                              for _, k in cols))
    keys = [k for k in keys if a.samples.get(k) and b.samples.get(k)]
    seeds_a = [row.get("seed") for row in a.rows]
    paired = (None not in seeds_a and len(set(seeds_a)) == len(seeds_a)
              and sorted(seeds_a) == sorted(row.get("seed") for row in b.rows))
    metrics = {}
    for key in keys:
        (ma, sa, na), (mb, sb, nb) = mean_std(a.samples[key]), mean_std(b.samples[key])
        entry = {"a": {"mean": ma, "std": None if na < 2 else sa, "n": na},
                 "b": {"mean": mb, "std": None if nb < 2 else sb, "n": nb},
                 "diff": ma - mb, "p_welch": welch_two_sided(a.samples[key], b.samples[key]),
                 "p_paired": None}
        if paired:
            va, vb = _seed_values(a, key), _seed_values(b, key)
            common = sorted(set(va) & set(vb))
            entry["p_paired"] = paired_two_sided([va[s] for s in common], [vb[s] for s in common])
        metrics[key] = entry
    return {"a": name_a, "b": name_b, "paired_seeds": sorted(seeds_a) if paired else None, "metrics": metrics}


def format_group_comparison(result: dict) -> str:
    """Each comparison as a table: metric, A and B as mean ± std (n), A − B, Welch's p, the paired p."""
    from pipeline.reports.report import format_p, format_value

    out = [f"split {result['split']}; {result['test']}"]
    for c in result["comparisons"]:
        ga, gb = result["groups"][c["a"]], result["groups"][c["b"]]
        paired = (f"paired over seeds {', '.join(map(str, c['paired_seeds']))}" if c["paired_seeds"]
                  else "not paired: the groups hold different seeds")
        runs = [f"{len(g['runs'])} runs" + f", {g.get('ensemble')} networks each" * (g.get("ensemble", 1) > 1)
                for g in (ga, gb)]
        out += ["", f"A = {c['a']} ({runs[0]}), B = {c['b']} ({runs[1]}); {paired}",
                f"{'metric':18s}{'A':>22s}{'B':>22s}{'A - B':>9s}{'p Welch':>9s}{'p paired':>9s}"]
        for key, m in c["metrics"].items():
            cells = [_mean_std(key, m[side], format_value) for side in ("a", "b")]
            mark = "  *" if any(p is not None and p < ALPHA for p in (m["p_welch"], m["p_paired"])) else ""
            out.append(f"{key:18s}{cells[0]:>22s}{cells[1]:>22s}{format_value(key, m['diff']):>9s}"
                       f"{format_p(m['p_welch']) or '-':>9s}{format_p(m['p_paired']) or '-':>9s}{mark}")
    out += ["", f"* p < {ALPHA}; -: fewer than two seeds on a side (one seed is an anecdote)"]
    return "\n".join(out)


def _mean_std(key: str, side: dict, format_value) -> str:
    text = format_value(key, side["mean"])
    return f"{text} ± {format_value(key, side['std'])} ({side['n']})" if side["std"] is not None \
        else f"{text} ({side['n']})"
