"""`vse train`: options ↔ TrainConfig, config files, resume; cached features or --rc images.

Under torchrun (``torchrun --nproc-per-node N -m cli.main train ...``) the same command
trains with DistributedDataParallel; --batch-size is per process.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import click
from click.core import ParameterSource

from cli.dataset_root import root_option
from pipeline.backbones import BACKBONE_NAMES
from pipeline.datasets import IMAGE_DATASET_KINDS
from pipeline.errors import VseError
from pipeline.losses import LOSS_NAMES
from pipeline.models import PROJECTIONS
from pipeline.train import ADAM_KERNELS

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


class TrainOption(click.Option):
    """An option of TrainConfig: default None here (TrainConfig holds the default, and an
    option not given stays unset, which --resume needs), shown in --help from the dataclass."""

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        from pipeline.train import TrainConfig  # torch: only when the help is shown

        default = TrainConfig.default(self.name)
        if self.is_bool_flag and self.secondary_opts:
            extra["default"] = (self.opts if default else self.secondary_opts)[0].lstrip("-")
        elif default not in (None, "") and not self.is_bool_flag:
            extra["default"] = str(default)
        return extra


def option(*names, **kwargs):
    """click.option for a TrainConfig field: no default of its own."""
    return click.option(*names, cls=TrainOption, default=None, **kwargs)


def _read_config_file(path: str) -> dict:
    from pipeline.train import TrainConfig

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
    values = {k.replace("-", "_"): v for k, v in values.items()}
    options = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(values) - options - set(LOSS_FLAGS))
    if unknown:
        raise VseError(f"unknown training option(s): {', '.join(unknown)}", path)
    try:  # types and ranges here, to name the file
        TrainConfig.checked({k: v for k, v in values.items() if k in options})
    except VseError as exc:
        raise VseError(str(exc), path) from None
    return values


@click.command("train")
@option("--features", type=click.Path(dir_okay=False), help="Feature cache (.h5) from `vse extract`.")
@option("--rc", is_flag=True, help="End to end: decode images, random crops through the CNN every step "
        "(no feature cache; needs --root).")
@option("--dataset", type=click.Choice(IMAGE_DATASET_KINDS), help="--rc: dataset layout of --root.")
@root_option(prefix="--rc: ")
@option("--backbone", type=click.Choice(BACKBONE_NAMES), help="--rc: the CNN.")
@option("--backbone-weights", type=click.Path(dir_okay=False),
        help="--rc: the CNN's ImageNet weights file (default: where `vse extract` finds it).")
@option("--finetune", is_flag=True, help="--rc: train the CNN too (else it stays frozen).")
@option("--backbone-lr-factor", type=float, help="--finetune: the CNN's learning rate is --lr times this.")
@option("--freeze-bn/--no-freeze-bn", help="--finetune: keep BatchNorm statistics fixed (small batches).")
@option("--crop", type=click.Choice(["random", "random-resized"]),
        help="--rc training crop: resize 256 + random 224 (VSE++), or random-resized; + flip.")
@option("--run-dir", type=click.Path(file_okay=False), help="Where checkpoints, config and metrics go.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON file of options; flags given on the command line win.")
@click.option("--resume", is_flag=True, help="Continue from RUN_DIR/last.pt at the same epoch and iteration, "
              "with the run's options (README: the few that may change).")
@option("--loss", help=f"{', '.join(LOSS_NAMES)}, or your own: FILE.py:Class or package.module:Class "
        "(any torch.nn.Module called as loss(img, cap, image_ids=None, relevance=None)).")
@option("--margin", type=float, help="Hinge margin (default: the loss's own, PROTOCOL.md).")
@click.option("--negative-set-size", type=int, default=None,
              help="mh: hardest negative among k random negatives.")
@click.option("--warmup-epochs", type=int, default=None, help="mh: sum of hinges for the first E epochs.")
@click.option("--tau", type=float, default=None, help="Temperature of the contrastive losses.")
@click.option("--lseh-lambda", type=float, default=None, help="lseh: weight of the semantic margin.")
@click.option("--ladder-levels", type=int, default=None, help="ladder: L (2 or 3).")
@click.option("--loss-option", "loss_option", multiple=True, callback=_parse_loss_option,
              help="Any other loss option, KEY=VALUE (JSON value), repeatable.")
@option("--relevance", type=click.Path(dir_okay=False),
        help="Relevance file from `vse relevance` (lseh, ladder).")
@option("--epochs", type=int)
@option("--batch-size", type=int)
@option("--lr", type=float)
@option("--lr-decay-epoch", type=int, help="lr × lr-decay every this many epochs.")
@option("--lr-decay", type=float)
@option("--grad-clip", type=float)
@option("--adam-kernel", type=click.Choice(ADAM_KERNELS),
        help="fused: one pass per parameter (default; about half the time on a CPU); default: "
             "PyTorch's own kernel, as runs before this option. The same update, rounded differently.")
@option("--embed-dim", type=int)
@option("--word-dim", type=int)
@option("--glove", is_flag=True, help="Initialise word embeddings from GloVe 6B-50d (word dim 50).")
@option("--min-word-count", type=int)
@option("--no-img-norm", "img_norm", flag_value=False, help="VSE0 variant: images not L2-normalised.")
@option("--projection", type=click.Choice(PROJECTIONS))
@option("--text-features", type=click.Path(dir_okay=False),
        help="Caption-feature file from `vse encode-text`: a head over these frozen vectors replaces "
             "the GRU (both sides in memory).")
@option("--text-projection", type=click.Choice(PROJECTIONS), help="--text-features: the caption head.")
@option("--val-split")
@option("--val-images", type=int)
@option("--val-every", type=int, help="Validate every N iterations (0: epoch ends only).")
@option("--seed", type=int)
@option("--workers", type=int,
        help="Loader processes (default: 0 with --features, all cores but one with --rc).")
@option("--preload", is_flag=True, help="Load the whole feature array into RAM.")
@option("--device")
@option("--amp/--no-amp",
        help="Mixed precision on GPU (bf16 on compute capability 8.0+, else fp16 with loss scaling).")
@option("--deterministic", is_flag=True,
        help="GPU: reproducible kernels (cuDNN deterministic, no autotuning) so --resume is exact; "
             "slower. CPU runs are deterministic anyway.")
@option("--init-from", type=click.Path(dir_okay=False),
        help="Start from another run's checkpoint (e.g. VSE++ best.pt for ConVSE).")
@click.pass_context
def train_command(ctx, config_file, resume, loss_option, **options):
    """Train a joint embedding on a feature cache, or end to end on images (--rc)."""
    from pipeline import distributed
    from pipeline.train import TrainConfig, Trainer

    values = _read_config_file(config_file) if config_file else {}
    for name, value in options.items():  # a flag given beats the file; the rest: TrainConfig's defaults
        if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            values[name] = value
    # what the user set; with --resume the other options are the run's own
    given = {"loss_options" if name in LOSS_FLAGS else name for name in values}
    loss_options = dict(values.pop("loss_options", None) or {})
    for flag, option_name in LOSS_FLAGS.items():
        value = values.pop(flag, None)
        if value is not None:
            loss_options[option_name] = value
    loss_options.update(loss_option)
    if loss_options or loss_option:
        values["loss_options"] = loss_options
        given.add("loss_options")
    if not values.get("run_dir"):
        raise click.UsageError("--run-dir is required (flag or config file)")
    config = TrainConfig.from_dict(values)
    summary = Trainer(config, resume=resume, echo=click.echo, given=given).fit()
    if distributed.is_main():  # under torchrun the other ranks say nothing
        click.echo(f"done: best validation rsum {summary['best_rsum']:.2f} at epoch {summary['best_epoch']} "
                   f"→ {Path(config.run_dir) / 'best.pt'}")

def register(group: click.Group) -> None:
    group.add_command(train_command)
