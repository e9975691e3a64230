"""`vse sweep`: a grid of training runs from one YAML file, restartable after a kill; the file's
base: options can be overridden by the training options themselves (generated from TrainConfig)."""

from __future__ import annotations

import click

from cli.train_options import given_values, train_options
from pipeline.training.launchers import LAUNCHERS, SLURM_OPTIONS


def slurm_options(function):
    """--partition, --time, --cpus, --gpus, --mem: the jobs' resources under --launcher slurm
    (launchers.SLURM_OPTIONS; a sweep file's slurm: mapping sets them too, the command line wins)."""
    for option in reversed(SLURM_OPTIONS):
        default = f" [default: {option.default}]" if option.default is not None else ""
        function = click.option(f"--{option.name}", f"slurm_{option.name}", type=option.type, default=None,
                                help=option.help + default)(function)
    return function


def slurm_given(options: dict) -> dict:
    """The --partition ... values given (None where not), popped from the command's options."""
    return {option.name: options.pop(f"slurm_{option.name}") for option in SLURM_OPTIONS}


@click.command("sweep")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--jobs", type=int, default=1, show_default=True,
              help="Runs trained at the same time (processes).")
@click.option("--resume", is_flag=True, help="Continue unfinished runs from their last.pt.")
@click.option("--runs-dir", type=click.Path(file_okay=False), default=None,
              help="Parent of the sweep folder (default: the file's runs_dir, else runs).")
@click.option("--name", default=None,
              help="The sweep's folder under the runs dir (default: the file's name:, else its stem).")
@click.option("--dry-run", is_flag=True, help="List the runs and their status; train nothing.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="local", show_default=True,
              help="Train here (--jobs at a time), or submit one Slurm job per run that is not done nor held "
              "by its job (submitit; the run folders on the filesystem the nodes share).")
@click.option("--status", "show_status", is_flag=True,
              help="Each run's state from its folder and its Slurm job (id and state); train nothing.")
@slurm_options
@click.option("--overwrite", is_flag=True,
              help="Train again, in their folders, the runs trained by other code than the sweep's (an "
              "edited plug-in file, another vse); refused without it.")
@click.option("--seeds", default=None, callback=lambda ctx, param, value: _int_list(value),
              help="Repeat every grid point with these seeds, e.g. 0,1,2,3,4 (or 0-4).")
@click.option("--only", multiple=True, metavar="KEY=VALUE",
              help="Only the runs whose names have KEY=VALUE (repeatable: all of them), e.g. --only "
              "method=mh --seeds 3-5: one method's extra seeds.")
@train_options(exclude=("run_dir",))
@click.pass_context
def sweep_command(ctx, config, jobs, resume, runs_dir, name, dry_run, launcher, show_status, overwrite, seeds,
                  only, loss_option, **options):
    """Train the grid of CONFIG (YAML: base: + grid:), skipping finished runs.

    Training options given here override the file's base: for every run (not a grid axis)."""
    from pipeline.training.sweep import load_sweep, plan, run_sweep, unreached

    if jobs < 1:
        raise click.UsageError("--jobs must be at least 1")
    given_slurm = slurm_given(options)
    overrides, _ = given_values(ctx, options, loss_option)
    sweep = load_sweep(config, runs_dir, seeds, overrides=overrides, name=name, only=only)
    if show_status:
        from pipeline.training.launchers import status_lines

        for line in status_lines(sweep):
            click.echo(line)
        return
    if dry_run:
        for run in plan(sweep).runs:
            click.echo(f"{run.status:10s} {run.run_dir}" + (f"  ({run.detail})" if run.detail else ""))
        for run, note in unreached(sweep.runs):
            click.echo(f"warning: {run.name}: {note}")
        return
    if launcher == "slurm":
        from pipeline.training.launchers import slurm_settings, submit_sweep

        if jobs != 1:
            raise click.UsageError("--jobs is the local launcher's: under --launcher slurm each run is a job")
        settings = slurm_settings(sweep.slurm, given_slurm, sweep.path)
        submit_sweep(sweep, settings, resume=resume, overwrite=overwrite, echo=click.echo)
        return
    if any(value is not None for value in given_slurm.values()):
        raise click.UsageError("--partition, --time, --cpus, --gpus and --mem are --launcher slurm's options")
    run_sweep(sweep, jobs=jobs, resume=resume, echo=click.echo, overwrite=overwrite)
    failed = [run for run in sweep.runs if run.status == "failed"]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(sweep.runs)} runs failed: "
                                   + "; ".join(f"{r.name}: {r.detail}" for r in failed))
    click.echo(f"sweep {sweep.name}: {sum(r.status in ('done', 'trained') for r in sweep.runs)} of "
               f"{len(sweep.runs)} runs finished in {sweep.root}")


def _int_list(value):
    """'0,1,2' or '0-4' (inclusive) → a list of ints; None stays None."""
    if value is None:
        return None
    out = []
    try:
        for part in value.split(","):
            low, sep, high = part.strip().partition("-")
            out.extend(range(int(low), int(high) + 1) if sep and low else [int(part)])
    except ValueError:
        raise click.BadParameter(f"expected integers like 0,1,2 or 0-4, got {value!r}") from None
    return out


