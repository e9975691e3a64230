"""`vse compare RUN_A RUN_B`: is A better than B on this test split, beyond chance?

Both runs are embedded on the same split (the same images and captions in the same order,
checked), their per-query ranks computed with the protocol of docs/PROTOCOL.md, and each of
R@1/5/10 (both directions) and rsum gets its difference A − B with the p-value of a paired
permutation test over the test queries (pipeline.evaluation.stats.paired_permutation_test).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipeline.core import precision
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.evaluation.metrics import metric_keys, similarity_ranks
from pipeline.evaluation.stats import DEFAULT_PERMUTATIONS, paired_permutation_test
from pipeline.reports.batch_eval import RunEvaluator
from pipeline.training.factories import run_schedule_note
from pipeline.training.run_folder import run_names

COMPARED = (*metric_keys("recall"), "rsum")  # what the paired test over queries covers


def compare_runs(run_a, run_b, *, device: torch.device, split: str = "test", features=None,
                 checkpoint: str = "best.pt", permutations: int = DEFAULT_PERMUTATIONS,
                 seed: int = 0, across_precision: bool = False) -> dict:
    """{"runs": [name_a, name_b], "split", "queries": {...}, "metrics": {key: {a, b, diff, p}},
    "precision": [label_a, label_b], "schedule": [note_a, note_b]} (a note: the run ended before its
    loss's method began, ``training.factories.run_schedule_note``; else None). Runs trained in
    different precisions are refused unless ``across_precision`` (a precision ablation compares them
    on purpose)."""
    # both checkpoints are read once, before anything is embedded: a refusal costs no embedding
    states = [load_checkpoint(Path(run) / checkpoint) for run in (run_a, run_b)]
    labels = {str(run): precision.label_of(state) for run, state in zip((run_a, run_b), states)}
    if not across_precision and (line := precision.mixed(labels)):
        raise VseError(f"{line}: they are not one method (--across-precision compares them anyway)",
                       Path(run_b))
    ranks, ids = [], []
    with RunEvaluator(device, split, features=features) as evaluator:
        for run, state in zip((run_a, run_b), states):
            emb, _, _, _ = evaluator.embed(run, checkpoint, state=state)
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
            "schedule": [run_schedule_note(Path(run)) for run in (run_a, run_b)]}


def format_comparison(result: dict) -> str:
    a, b = result["runs"]
    lines = [f"A = {a}, B = {b}; {result['split']}: {result['queries']['images']} images, "
             f"{result['queries']['captions']} captions; paired permutation test over queries "
             f"({result['permutations']} sign flips, two-sided); precision (network/loss/evaluation) "
             f"{' vs '.join(dict.fromkeys(result.get('precision') or ['?']))}",
             f"{'metric':10s}{'A':>9s}{'B':>9s}{'A - B':>9s}{'p':>9s}"]
    for key, m in result["metrics"].items():
        mark = "  *" if m["p"] < 0.05 else ""
        lines.append(f"{key:10s}{m['a']:9.1f}{m['b']:9.1f}{m['diff']:+9.1f}{m['p']:9.4f}{mark}")
    lines.append("* p < 0.05")
    lines += [f"{name}: {note}" for name, note in zip("AB", result.get("schedule") or ()) if note]
    return "\n".join(lines)
