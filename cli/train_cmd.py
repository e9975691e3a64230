"""`vse train`: options ↔ TrainConfig, config files, resume; cached features or --rc images.

Under torchrun (``torchrun --nproc-per-node N -m cli.main train ...``) the same command
trains with DistributedDataParallel; --batch-size is per process.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from pipeline.backbones import BACKBONE_NAMES
from pipeline.errors import VseError

# Loss-specific flags → the option names of pipeline.losses.build_loss.
LOSS_FLAGS = {
    "negative_set_size": "negative_set_size",
    "warmup_epochs": "warmup_epochs",
    "tau": "tau",
    "lseh_lambda": "lambda_",
    "ladder_levels": "levels",
}


def _parse_loss_option(ctx, param, values):
    options = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def _read_config_file(path: str) -> dict:
    text = Path(path).read_text(encoding="utf-8")
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as exc:  # yaml/json syntax errors
        raise VseError(f"cannot parse config ({str(exc).splitlines()[0]})", path) from exc
    if not isinstance(values, dict):
        raise VseError("config must be a mapping of option names to values", path)
    return {k.replace("-", "_"): v for k, v in values.items()}


@click.command("train")
@click.option("--features", type=click.Path(dir_okay=False), help="Feature cache (.h5) from `vse extract`.")
@click.option("--rc", is_flag=True, help="End to end: decode images, random crops through the CNN every step "
              "(no feature cache; needs --root).")
@click.option("--dataset", default="flickr8k", show_default=True,
              type=click.Choice(["flickr8k", "karpathy"]), help="--rc: dataset layout of --root.")
@click.option("--root", type=click.Path(file_okay=False), help="--rc: the dataset folder.")
@click.option("--backbone", default="efficientnet-lite0", show_default=True,
              type=click.Choice(BACKBONE_NAMES), help="--rc: the CNN.")
@click.option("--backbone-weights", type=click.Path(dir_okay=False), default=None,
              help="--rc: the CNN's ImageNet weights file (default: where `vse extract` finds it).")
@click.option("--finetune", is_flag=True, help="--rc: train the CNN too (else it stays frozen).")
@click.option("--backbone-lr-factor", type=float, default=1.0, show_default=True,
              help="--finetune: the CNN's learning rate is --lr times this.")
@click.option("--freeze-bn/--no-freeze-bn", default=True, show_default=True,
              help="--finetune: keep BatchNorm statistics fixed (small batches).")
@click.option("--crop", type=click.Choice(["random", "random-resized"]), default="random", show_default=True,
              help="--rc training crop: resize 256 + random 224 (VSE++), or random-resized; + flip.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Where checkpoints, config and metrics go.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON file of options; flags given on the command line win.")
@click.option("--resume", is_flag=True, help="Continue from RUN_DIR/last.pt at the same epoch and iteration.")
@click.option("--loss", default="mh", show_default=True,
              type=click.Choice(["sh", "mh", "order", "lseh", "ladder", "csn", "cmn", "mvn"]))
@click.option("--margin", type=float, default=None, help="Hinge margin (default: the loss's own, PROTOCOL.md).")
@click.option("--negative-set-size", type=int, default=None, help="mh: hardest negative among k random negatives.")
@click.option("--warmup-epochs", type=int, default=None, help="mh: sum of hinges for the first E epochs.")
@click.option("--tau", type=float, default=None, help="Temperature of the contrastive losses.")
@click.option("--lseh-lambda", type=float, default=None, help="lseh: weight of the semantic margin.")
@click.option("--ladder-levels", type=int, default=None, help="ladder: L (2 or 3).")
@click.option("--loss-option", "loss_option", multiple=True, callback=_parse_loss_option,
              help="Any other loss option, KEY=VALUE (JSON value), repeatable.")
@click.option("--relevance", type=click.Path(dir_okay=False), default=None,
              help="Relevance file from `vse relevance` (lseh, ladder).")
@click.option("--epochs", type=int, default=30, show_default=True)
@click.option("--batch-size", type=int, default=128, show_default=True)
@click.option("--lr", type=float, default=2e-4, show_default=True)
@click.option("--lr-decay-epoch", type=int, default=15, show_default=True, help="lr × lr-decay every this many epochs.")
@click.option("--lr-decay", type=float, default=0.1, show_default=True)
@click.option("--grad-clip", type=float, default=2.0, show_default=True)
@click.option("--embed-dim", type=int, default=1024, show_default=True)
@click.option("--word-dim", type=int, default=300, show_default=True)
@click.option("--glove", is_flag=True, help="Initialise word embeddings from GloVe 6B-50d (word dim 50).")
@click.option("--min-word-count", type=int, default=4, show_default=True)
@click.option("--no-img-norm", "img_norm", flag_value=False, default=True, help="VSE0 variant: images not L2-normalised.")
@click.option("--projection", type=click.Choice(["linear", "mlp"]), default="linear", show_default=True)
@click.option("--val-split", default="dev", show_default=True)
@click.option("--val-images", type=int, default=1000, show_default=True)
@click.option("--val-every", type=int, default=500, show_default=True, help="Validate every N iterations (0: epoch ends only).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, default=None,
              help="Loader processes (default: 0 with --features, all cores but one with --rc).")
@click.option("--preload", is_flag=True, help="Load the whole feature array into RAM.")
@click.option("--device", default="auto", show_default=True)
@click.option("--amp/--no-amp", default=True, show_default=True, help="Mixed precision on GPU.")
@click.option("--init-from", type=click.Path(dir_okay=False), default=None,
              help="Start from another run's checkpoint (e.g. VSE++ best.pt for ConVSE).")
@click.pass_context
def train_command(ctx, config_file, resume, loss_option, **options):
    """Train a joint embedding on a feature cache, or end to end on images (--rc)."""
    from pipeline import distributed
    from pipeline.train import TrainConfig, Trainer

    values = _read_config_file(config_file) if config_file else {}
    for name, value in options.items():
        explicit = ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
        if explicit or name not in values and name not in LOSS_FLAGS:
            values[name] = value
    loss_options = dict(values.pop("loss_options", {}) or {})
    for flag, option in LOSS_FLAGS.items():
        value = values.pop(flag, None)
        if value is not None:
            loss_options[option] = value
    loss_options.update(loss_option)
    values["loss_options"] = loss_options
    if not values.get("run_dir"):
        raise click.UsageError("--run-dir is required (flag or config file)")
    config = TrainConfig.from_dict(values)
    summary = Trainer(config, resume=resume, echo=click.echo).fit()
    if distributed.is_main():  # under torchrun the other ranks say nothing
            click.echo(f"done: best validation rsum {summary['best_rsum']:.2f} at epoch {summary['best_epoch']} "
                   f"→ {Path(config.run_dir) / 'best.pt'}")


def register(group: click.Group) -> None:
    group.add_command(train_command)
