"""`vse compare RUN_A RUN_B`: per-metric differences with a paired permutation test."""

from __future__ import annotations

import json

import click


@click.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@click.option("--split", default="test", show_default=True)
@click.option("--features", type=click.Path(dir_okay=False), default=None,
              help="Feature cache for both runs (default: the cache each run trained on).")
@click.option("--checkpoint-name", default="best.pt", show_default=True, help="Which checkpoint of each run.")
@click.option("--permutations", type=click.IntRange(min=100), default=10_000, show_default=True,
              help="Random sign flips of the permutation test.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sign flips.")
@click.option("--device", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--across-precision", is_flag=True,
              help="Compare runs trained in different precisions (refused by default: not one method).")
def compare_command(run_a, run_b, split, features, checkpoint_name, permutations, seed, device, as_json,
                    across_precision):
    """Is RUN_A better than RUN_B on the same test split? R@1/5/10 both ways and rsum, A − B,
    each with the p-value of a paired permutation test over the test queries."""
    from pipeline.core.runtime import resolve_device
    from pipeline.reports.compare import compare_runs, format_comparison

    result = compare_runs(run_a, run_b, device=resolve_device(device), split=split, features=features,
                          checkpoint=checkpoint_name, permutations=permutations, seed=seed,
                          across_precision=across_precision)
    click.echo(json.dumps(result, indent=2) if as_json else format_comparison(result))
