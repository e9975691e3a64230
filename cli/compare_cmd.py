"""`vse compare A B`: two runs with a paired permutation test over the test queries, or two groups of
seeds (globs; or `--runs GLOB... --baseline NAME`) with Welch's and the paired t-test over seeds.
`vse compare A --rescore NAME`: a run or group against its own scores re-scored against hubness."""

from __future__ import annotations

import json

import click

from cli.judgment_options import judgment_options
from cli.rescore_options import rescore_options


@click.command("compare")
@click.argument("groups", nargs=-1, metavar="A B")
@click.option("--runs", "patterns", multiple=True, metavar="GLOB",
              help="Run folders (glob, quoted), repeatable: their configurations (seed groups) are each "
              "compared with --baseline's.")
@click.option("--baseline", metavar="NAME", default=None,
              help="With --runs: the configuration the others are compared with (a run name without the "
              "seed, or a loss).")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Groups: a results.csv (vse evaluate --runs --out) whose rows of unchanged checkpoints "
              "(same bytes, same evaluation) are used instead of evaluating them again.")
@click.option("--split", default="test", show_default=True)
@click.option("--features", type=click.Path(dir_okay=False), default=None,
              help="Feature cache for both runs (default: the cache each run trained on).")
@click.option("--checkpoint-name", default="best.pt", show_default=True, help="Which checkpoint of each run.")
@click.option("--permutations", type=click.IntRange(min=100), default=10_000, show_default=True,
              help="Two runs: random sign flips of the permutation test.")
@click.option("--seed", type=int, default=0, show_default=True, help="Two runs: seed of the sign flips.")
@click.option("--device", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@judgment_options
@click.option("--across-precision", is_flag=True,
              help="Compare (or pool in a group) runs trained in different precisions (refused by default: "
              "not one method).")
@click.option("--across-code", is_flag=True,
              help="Compare (or pool in a group) runs trained by different code (another plug-in file or vse "
              "version; refused by default: not one method).")
@click.option("--across-ensemble", is_flag=True,
              help="Compare results that average different numbers of networks' scores (ncr's two co-trained "
              "networks against one network; refused by default: docs/PROTOCOL.md, 'Ensemble size').")
@click.option("--member", type=click.IntRange(min=0), default=None, metavar="K",
              help="A run of networks trained together (ncr) takes part by its network K alone (an ensemble "
              "of 1); a run of one network as it is.")
@rescore_options("With one A (a run or a group): compare A re-scored against hubness by NAME with A itself, "
                 "each method a comparison; with --runs: re-scored rows are configurations too")
@click.option("--across-transduction", is_flag=True,
              help="Compare a transductive result (it read the test queries: dsl, a bank of the evaluated "
              "split) with an inductive one (refused by default: not one protocol).")
def compare_command(groups, patterns, baseline, results, split, features, checkpoint_name, permutations, seed,
                    device, as_json, judgments, across_precision, across_code, across_ensemble, member,
                    rescore, across_transduction):
    """Is A better than B? A and B are run folders or globs (quoted). One run each: R@1/5/10 both ways
    and rsum, A − B, each with the p-value of a paired permutation test over the test queries. Groups of
    seeds (one configuration each): each metric's mean ± std (n) per group, the difference, Welch's
    two-sided t-test over seeds and, where both groups hold the same seeds, the paired t-test over them.
    `--runs GLOB... --baseline NAME` compares every configuration of the runs with NAME's. `A --rescore
    NAME`: A re-scored (A + NAME) against A, by the same tests."""
    from pipeline.core.runtime import resolve_device
    from pipeline.reports.compare import (
        compare_groups,
        compare_rescored,
        compare_runs,
        expand_runs,
        format_comparison,
        format_group_comparison,
    )

    plan = rescore.plan(split, refused=(member is not None or results) and (
        "--rescore goes without --member and --results (re-scored rows are evaluated, never kept)"))
    if patterns or baseline:
        if not (patterns and baseline) or groups:
            raise click.UsageError("--runs GLOB... goes with --baseline NAME, and without A B")
        named = {"runs": list(patterns)}
    elif plan:
        if len(groups) != 1:
            raise click.UsageError("--rescore compares A with A re-scored: give one run or group A (or "
                                   "--runs GLOB... --baseline NAME)")
        named = {groups[0]: [groups[0]]}
        found = expand_runs(groups[0])
        if len(found) == 1 and judgments is None:  # one run: the paired test over queries
            result = compare_rescored(found[0], plan, device=resolve_device(device), split=split,
                                      features=features, checkpoint=checkpoint_name,
                                      permutations=permutations, seed=seed,
                                      across_transduction=across_transduction)
            click.echo(json.dumps(result, indent=2) if as_json
                       else "\n\n".join(map(format_comparison, result["comparisons"])))
            return
    elif len(groups) != 2:
        raise click.UsageError("give two runs or groups of runs, A B (or --runs GLOB... --baseline NAME)")
    else:
        named = {group: [group] for group in groups}
        runs = [expand_runs(group) for group in groups]
        if all(len(found) == 1 for found in runs) and not results and judgments is None:  # one run each
            result = compare_runs(runs[0][0], runs[1][0], device=resolve_device(device), split=split,
                                  features=features, checkpoint=checkpoint_name, permutations=permutations,
                                  seed=seed, across_precision=across_precision, across_code=across_code,
                                  across_ensemble=across_ensemble, member=member)
            click.echo(json.dumps(result, indent=2) if as_json else format_comparison(result))
            return
        if len(named) == 1:
            raise click.UsageError("A and B are the same group")
    result = compare_groups(named, device=resolve_device(device), baseline=baseline, split=split,
                            features=features, checkpoint=checkpoint_name, results=results,
                            judgments=judgments.load() if judgments else None,
                            across_precision=across_precision, across_code=across_code,
                            across_ensemble=across_ensemble, member=member, rescore=plan,
                            across_transduction=across_transduction,
                            echo=lambda line: click.echo(line, err=True))
    click.echo(json.dumps(result, indent=2) if as_json else format_group_comparison(result))
