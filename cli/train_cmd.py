"""`vse train`: options ↔ TrainConfig, config files, resume; cached features or --rc images.

Under torchrun (``torchrun --nproc-per-node N -m cli.main train ...``) the same command
trains with DistributedDataParallel; --batch-size is per process.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.train_options import TrainOption, given_values, train_options
from pipeline.core.config import LOSS_FLAGS, TrainConfig, option_names, run_options
from pipeline.core.errors import VseError

__all__ = ["TrainOption", "train_command"]


def _read_config_file(path: str) -> dict:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VseError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                       path) from None
    except OSError as exc:
        raise VseError(f"cannot read ({exc.strerror})", path) from None
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as exc:  # yaml/json syntax errors
        raise VseError(f"cannot parse config ({str(exc).splitlines()[0]})", path) from exc
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise VseError("config must be a mapping of option names to values", path)
    values = run_options({k.replace("-", "_"): v for k, v in values.items()})  # a run's config.json too
    options = set(option_names())
    unknown = sorted(set(values) - options - set(LOSS_FLAGS))
    if unknown:
        raise VseError(f"unknown training option(s): {', '.join(unknown)}", path)
    try:  # types and ranges here, to name the file
        TrainConfig.checked({k: v for k, v in values.items() if k in options})
    except VseError as exc:
        raise VseError(str(exc), path) from None
    return values


@click.command("train")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON file of options; flags given on the command line win.")
@click.option("--resume", is_flag=True, help="Continue from RUN_DIR/last.pt at the same epoch and iteration, "
              "with the run's options (README: the few that may change).")
@click.option("--overwrite", is_flag=True, help="Replace the run already in --run-dir (its files stay until "
              "this run's first checkpoint is complete). Without --resume or this, such a folder is refused.")
@train_options()
@click.pass_context
def train_command(ctx, config_file, resume, overwrite, loss_option, **options):
    """Train a joint embedding on a feature cache, or end to end on images (--rc).

    Every option and its default: docs/OPTIONS.md."""
    from pipeline.core import distributed
    from pipeline.evaluation.chance import chance_note, small_split_note
    from pipeline.training.build import build_trainer
    from pipeline.training.run_folder import RunFolder

    values, given = given_values(ctx, options, loss_option,
                                 _read_config_file(config_file) if config_file else {})
    if not values.get("run_dir"):
        raise click.UsageError("--run-dir is required (flag or config file)")
    config = TrainConfig.from_dict(values)
    if not resume:  # the options first, then the folder (a resumed run takes the run's options)
        config.check()
    run = RunFolder(config.run_dir, resume=resume, overwrite=overwrite)  # the folder's one owner
    with run.claim():  # refused here, before anything is built; the trainer asks the same folder
        trainer = build_trainer(config, echo=click.echo, given=given, run=run)
        split = trainer.loop.val_split  # the run's own (a resumed run's options are its own)
        images, captions, _ = trainer.index.split_rows(split, trainer.loop.val_images)
        small = small_split_note(len(images), f"{split} (validation)")
        if small and distributed.is_main():
            click.echo(small)
        summary = trainer.fit()
    if distributed.is_main():  # under torchrun the other ranks say nothing
        click.echo(f"done: best validation rsum {summary['best_rsum']:.2f} at epoch {summary['best_epoch']} "
                   f"→ {Path(config.run_dir) / 'best.pt'}")
        at_chance = chance_note(summary["best_rsum"], f"{split} rsum", len(images), len(captions))
        if at_chance:  # the last line: a run that learnt nothing measurable never passes in silence
            click.echo(at_chance)
