"""`vse tune`: search a tune file's search: space with Optuna (TPE, pruning on the dev metric),
one run folder per trial; resumable, several processes per study; export the best as a sweep file."""

from __future__ import annotations

import click

from cli.sweep_cmd import slurm_given, slurm_options
from pipeline.training.launchers import LAUNCHERS
from pipeline.training.tune import PRUNERS


@click.command("tune")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--budget", default=None, metavar="TRIALSxEPOCHS",
              help="Trials (COMPLETE + PRUNED, in total) of EPOCHS each, e.g. 20x3: the same for every "
                   "method of a comparison. Default: the study's recorded budget.")
@click.option("--trials", type=int, default=None,
              help="Only the number of trials (epochs from --budget, the study, or base:).")
@click.option("--metric", default=None,
              help="The dev metric to optimise (default rsum; e.g. i2t_r1, t2i_medr).")
@click.option("--pruner", type=click.Choice(PRUNERS), default=None,
              help="Stop trailing trials at a validation: median (default) or hyperband; none.")
@click.option("--sampler-seed", type=int, default=None, help="The TPE sampler's seed (default 0).")
@click.option("--storage", default=None,
              help="Optuna storage: an RDB URL (postgresql://…, mysql://…, sqlite:///…) or a journal file "
                   "path. Default: sqlite TUNE/study.db.")
@click.option("--runs-dir", type=click.Path(file_okay=False), default=None,
              help="Parent of the tune folder (default: the file's runs_dir, else runs).")
@click.option("--name", default=None,
              help="The study and its folder (default: the file's name:, else its stem).")
@click.option("--export", "export", type=click.Path(dir_okay=False), default=None,
              help="Write the best trial's options as an experiment YAML for `vse sweep FILE --seeds 0-2`.")
@click.option("--overwrite", is_flag=True, help="--export may replace a file vse tune did not write.")
@click.option("--no-plots", is_flag=True, help="Do not draw TUNE/plots/*.png.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="local", show_default=True,
              help="Run trials here, or submit --workers Slurm jobs that each run this command on the study "
              "(needs --storage: a database server or a journal file on the shared filesystem).")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Under --launcher slurm: the jobs that work on the study at the same time.")
@slurm_options
def tune_command(config, budget, trials, metric, pruner, sampler_seed, storage, runs_dir, name, export,
                 overwrite, no_plots, launcher, workers, **options):
    """Tune the options of CONFIG's search: (YAML: base: + search:) on the dev split.

    Run the same command in several shells (or machines, with --storage) to work on one study;
    run it again after a kill to go on."""
    from pipeline.training.tune import (
        check_metric,
        export_best,
        load_tune,
        open_study,
        parse_budget,
        run_tune,
        storage_errors,
        storage_url,
        summary_lines,
    )
    from pipeline.training.tune_plots import write_plots

    given_slurm = slurm_given(options)
    if launcher == "local" and (workers != 1 or any(v is not None for v in given_slurm.values())):
        raise click.UsageError("--workers, --partition, --time, --cpus, --gpus and --mem are --launcher "
                               "slurm's options (locally, run the command in several shells)")
    if workers < 1:
        raise click.UsageError("--workers must be at least 1")
    if launcher == "slurm" and export:
        raise click.UsageError("--export after the workers: run `vse tune CONFIG --storage URL --export "
                               "FILE` once they are done")
    if launcher == "slurm":
        from pipeline.training.launchers import check_partition, require_shared_storage, slurm_settings

        require_shared_storage(storage)  # before any study is made
        resources = slurm_settings(None, given_slurm)
        check_partition(resources)
    if trials is not None and trials < 1:
        raise click.UsageError("--trials must be at least 1")
    if budget is not None and trials is not None:
        raise click.UsageError("give --budget TRIALSxEPOCHS or --trials N, not both")
    parsed = parse_budget(budget) if budget is not None else None
    tune = load_tune(config, runs_dir, name)  # every check of the file before anything is written
    if metric is not None:
        check_metric(metric, tune.path)
    study, settings = open_study(tune, storage, parsed, trials, metric, pruner, sampler_seed)
    click.echo(f"tune {tune.name}: {tune.root} (budget {settings.budget}, dev {settings.metric}, "
               f"{settings.pruner} pruner)")
    if launcher == "slurm":
        import os

        from cli.main import cli
        from pipeline.training.launchers import submit_tune_workers

        # each worker runs this command on the study just made or reopened: its settings are recorded
        args = ["tune", os.path.abspath(config), "--runs-dir", os.path.abspath(tune.runs_dir), "--name",
                tune.name, "--no-plots"] + (["--storage", storage] if storage else [])
        submit_tune_workers(tune, cli, args, workers, resources, echo=click.echo)
        return
    with storage_errors(storage_url(tune.root, storage)):  # a server gone, a file broken meanwhile: one line
        run_tune(tune, study, settings, echo=click.echo)
        for line in summary_lines(study, settings):
            click.echo(line)
        if not no_plots:
            written = write_plots(study, tune.root, echo=click.echo)
            if written:
                live = storage_url(tune.root, storage) if storage is None else "STORAGE"
                click.echo(f"plots: {' '.join(p.name for p in written)} in {tune.root / 'plots'} "
                           f"(live: optuna-dashboard {live})")
        if export:
            click.echo(f"exported: {export_best(tune, study, settings, export, overwrite)}")

