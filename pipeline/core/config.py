"""Every option of a training run, declared once (torch-free).

``TrainConfig`` is the one place of each option: its default, type, help, choices, range,
whether ``--resume`` may change it, whether it is part of the run's identity, and the value
runs older than the option used. Everything else is derived from these fields:

- the click options of `vse train` and `vse sweep` (``cli/train_options.py``) and the
  option table of docs/OPTIONS.md;
- the type, range and choice checks (``TrainConfig.checked``), for flags, config files and
  sweep grids alike;
- the resume rule (``resume_config``): which options a resumed run may change;
- a run's identity (``identity_values``: seed groups in reports) and the values of options a
  run written before they existed used (``with_old_defaults``).

A new option is one field here, declared with ``option(...)``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields

from pipeline.core import precision
from pipeline.core.errors import VseError
from pipeline.core.registry import (
    ADAM_KERNELS,
    BACKBONES,
    CROP_MODES,
    IMAGE_DATASET_KINDS,
    IMAGE_POOLS,
    LAST,
    LOSSES,
    NETWORKS,
    NOISE_MODES,
    PROJECTIONS,
    READERS,
    SET_POOLS,
    SET_PROJECTIONS,
    SIZE_AUGMENT_RULES,
    check_image_pool,
    check_text_pool,
)
from pipeline.core.values import as_type

META = "vse"  # the key of an option's facts in its field's metadata


class _Unset:
    """No value: an option that every run has had (``before``), a flag with two ways (``flag_value``)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


@dataclass(frozen=True)
class OptionInfo:
    """What is known of one option besides its default and type."""

    help: str = ""
    choices: tuple | None = None     # the allowed values (a registry's names)
    minimum: float | None = None     # lowest value ...
    inclusive: bool = True           # ... and whether it is allowed itself
    resume: bool = False             # --resume may change it (it never changes which updates are made)
    identity: bool = True            # part of what a run computes (False: where and how it ran)
    before: object = UNSET           # the value of runs written before the option existed
    flag: str | None = None          # the click declaration when not --name (e.g. "--amp/--no-amp")
    flag_value: object = UNSET       # a one-way flag's value (--no-img-norm sets False)
    path: str | None = None          # names a "file" or a "folder"
    metavar: str | None = None
    cli: bool = True                 # a command-line option (False: config files only)
    shared: bool = False             # declared by a shared CLI option (cli/dataset_root.py)


def option(default, help: str = "", **facts) -> dataclasses.Field:
    """A ``TrainConfig`` field: its default and its ``OptionInfo``."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return field(**factory, metadata={META: OptionInfo(help=help, **facts)})


@dataclass
class TrainConfig:
    """Every option of a run. Defaults are the VSE++ paper's (Faghri et al. 2018)."""

    # ---- where the pairs come from
    features: str = option("", "Feature cache (.h5) from `vse extract`.", path="file")
    rc: bool = option(False, "Read pixels and run the CNN each step (random crops; no feature cache; "
                             "needs --root). The CNN stays frozen unless --finetune.")
    grid: bool = option(False, "--rc: the CNN gives its last feature map as a set of h·w grid cells, "
                               "pooled by --image-pool, instead of one pooled vector.", identity=False,
                        before=False)
    dataset: str = option("flickr8k", "--rc: dataset layout of --root.", choices=IMAGE_DATASET_KINDS)
    root: str = option("", shared=True, path="any")
    csv_img_key: str | None = option(None, shared=True, before=None)
    csv_caption_key: str | None = option(None, shared=True, before=None)
    csv_separator: str | None = option(None, shared=True, before=None)
    csv_split_key: str | None = option(None, shared=True, before=None)
    csv_id_key: str | None = option(None, shared=True, before=None)
    split_ratio: str | list | None = option(None, shared=True, before=None)
    split_seed: int | None = option(None, shared=True, minimum=0, before=None)
    backbone: str = option("efficientnet-lite0", "--rc: the CNN.", choices=BACKBONES.names)
    backbone_weights: str | None = option(
        None, "--rc: the CNN's ImageNet weights file (default: where `vse extract` finds it).", path="file")
    finetune: bool = option(False, "--rc: train the CNN too (else it stays frozen).")
    backbone_lr_factor: float = option(1.0, "--finetune: the CNN's learning rate is --lr times this.",
                                       minimum=0)
    freeze_bn: bool = option(True, "--finetune: keep BatchNorm statistics fixed (small batches).",
                             flag="--freeze-bn/--no-freeze-bn")
    crop: str = option("random", "--rc training crop: resize 256 + random 224 (VSE++), or "
                                 "random-resized; + flip.", choices=CROP_MODES)
    run_dir: str = option("", "Where checkpoints, config and metrics go.", resume=True, identity=False,
                          path="folder")
    # ---- the loss
    loss: str = option("mh", f"{', '.join(LOSSES.names)}, or your own: FILE.py:Class or "
                             "package.module:Class (any torch.nn.Module called as loss(img, cap, "
                             "image_ids=None, relevance=None)).")
    margin: float | None = option(None, "Hinge margin (default: the loss's own, PROTOCOL.md).", minimum=0)
    loss_options: dict = option(dict, "The loss's own options (the loss flags below, --loss-option).",
                                cli=False)
    relevance: str | None = option(None, "Relevance file from `vse relevance` (lseh, ladder).", path="file")
    # ---- the schedule
    epochs: int = option(30, minimum=1, resume=True)
    batch_size: int = option(128, minimum=1)  # per process: the global batch is processes × this
    lr: float = option(2e-4, minimum=0, inclusive=False)
    lr_decay_epoch: int = option(15, "lr × lr-decay every this many epochs.", minimum=1)
    lr_decay: float = option(0.1, minimum=0, inclusive=False)
    grad_clip: float = option(2.0, "Clip the gradients' norm to this (0: no clipping).", minimum=0)
    adam_kernel: str = option("fused", "fused: one pass per parameter (about half the time on a CPU); "
                                       "default: PyTorch's own kernel, as runs before this option. The "
                                       "same update, rounded differently.",
                              choices=ADAM_KERNELS, before="default")
    # ---- the model
    network: str = option("vse++", f"{', '.join(NETWORKS.names)}, or your own network FILE.py:Class, "
                                   "dual or pairwise as it declares (pipeline/networks/network.py). "
                                   "vse-infty pools sets with GPO unless "
                                   "--image-pool / --text-pool say otherwise; sgr and saf score each pair "
                                   "jointly over a cache of sets.", before="vse++")
    network_options: dict = option(dict, "The network's own options (--network-option NAME=VALUE; sgr, saf, "
                                          "vsrn: docs/PROTOCOL.md).", cli=False, before={})
    embed_dim: int | None = option(None, "Joint space dimension; unset: 1024 (2048 for --network vsrn, "
                                         "theirs).", minimum=1)
    word_dim: int = option(300, "Word embedding size of the GRU caption encoder.", minimum=1)
    glove: bool = option(False, "Initialise word embeddings from GloVe 6B-50d (word dim 50).")
    min_word_count: int = option(4, "Words seen fewer times in the training captions are <unk>.", minimum=1)
    max_caption_tokens: int = option(100, "Captions are cut to this many tokens.", minimum=1, before=100)
    img_norm: bool = option(True, "VSE0 variant: images not L2-normalised.", flag="--no-img-norm",
                            flag_value=False)
    projection: str = option("linear", "The head of a one-vector image and of the GRU caption encoder "
                                       "(--text-pool last): linear (VSE++) or mlp (ConVSE). Sets use "
                                       "--set-projection, caption features --text-projection.",
                             choices=PROJECTIONS)
    text_features: str | None = option(
        None, "Caption-feature file from `vse encode-text`: a head over these frozen vectors replaces "
              "the GRU (both sides in memory).", path="file")
    text_projection: str = option("linear", "--text-features: the caption head.", choices=PROJECTIONS)
    # ---- sets (VSE∞)
    image_pool: str | None = option(
        None, "Images are sets (a --grid cache, precomputed regions, or --rc's feature map): pool each "
              f"with {', '.join(IMAGE_POOLS)} (VSE∞'s GPO) or your own FILE.py:Class; unset: one vector "
              "per image.",
        before=None)
    set_projection: str = option(
        "linear", "--image-pool: each member's projection, linear (VSE∞ on CNN grids) or linear+mlp (VSE∞ on "
                  "precomputed regions).", choices=SET_PROJECTIONS, before="linear")
    size_augment: str = option(
        "auto", "--image-pool: drop members of training sets: grid or precomp (VSE∞'s two rules), none, "
                "or auto (grid for a CNN's map, precomp for regions).",
        choices=("auto", "none", *SIZE_AUGMENT_RULES), before="auto")
    text_pool: str = option(LAST, f"last: the GRU's last state (VSE++), or the caption vector; a set pool "
                                  f"({', '.join(SET_POOLS.names)} or FILE.py:Class): VSE∞'s BiGRU states, or "
                                  "the token vectors of `vse encode-text --tokens`, pooled.", before=LAST)
    pool_options: dict = option(dict, "Options of the pools of --image-pool and --text-pool (e.g. your own "
                                      "pool's), config files only.", cli=False, before={})
    caption_loss_weight: float | None = option(
        None, "VSRN's caption-generation branch: the weight of its cross-entropy (an attention GRU decoder "
              "that writes the caption from the reasoned regions), added to the loss; unset: 1 for --network "
              "vsrn (the paper's), off otherwise; 0: off.", minimum=0, before=0.0)
    # ---- noisy correspondence (data/noise.py)
    noise_rate: float = option(0.0, "Train on noisy pairs: this share of the training captions (--noise-mode "
                                    "caption, NCR's) or images (image, DECL's) shown with other images.",
                               minimum=0, before=0.0)
    noise_mode: str = option("caption", "--noise-rate: caption (NCR) or image (DECL, RCL) level.",
                             choices=NOISE_MODES, before="caption")
    noise_seed: int = option(0, "--noise-rate: the seed of the noise index (the same seed, the same file).",
                             minimum=0, before=0)
    noise_index: str | None = option(None, "A noise index file instead of --noise-rate: one entry per "
                                           "training caption (NCR's layout) or per training image (DECL's).",
                                     path="file", before=None)
    # ---- validation, reproducibility, execution
    train_split: str = option("train", "The split trained on.")
    val_split: str = option("dev", "The split validated on (best.pt is its best rsum).")
    val_images: int = option(1000, "Validate on the first this many images of --val-split.", minimum=1)
    val_every: int = option(500, "Validate every N iterations (0: epoch ends only).", minimum=0, resume=True)
    seed: int = option(0, minimum=0, identity=False)
    workers: int | None = option(None, "Loader processes (default: 0 with --features, all cores but one "
                                       "with --rc).", minimum=0, resume=True, identity=False)
    preload: bool = option(False, "Load the whole feature array into RAM.", resume=True, identity=False)
    device: str = option("auto", "cpu, cuda, cuda:N or auto (under torchrun: cuda:LOCAL_RANK).",
                         resume=True, identity=False)
    amp: bool | None = option(
        None, "Mixed precision on a GPU (bf16 on compute capability 8.0+, else fp16 with loss scaling); "
              "no effect on a CPU (--cpu-amp). Unset: on for the dual networks, off for the pairwise ones "
              "(sgr, saf: their authors' fp32; bf16 with fp32 scores still changed MH over three epochs; "
              "amp_by_default). config.json records what was applied (false on a CPU) and the precision.",
        flag="--amp/--no-amp", before=True)
    cpu_amp: bool = option(
        False, "bf16 autocast of the heads on a CPU, only when asked for by name: without it every CPU "
               "trains in fp32, so a command gives the same numbers on a laptop and a server. Refused on a "
               "CPU without native bf16 (AVX512-BF16 or AMX); no effect on a GPU (--amp). Validation and "
               "evaluation stay fp32.",
        flag="--cpu-amp/--no-cpu-amp", before=False)
    deterministic: bool = option(False, "GPU: reproducible kernels (cuDNN deterministic, no autotuning) "
                                        "so --resume is exact; slower. CPU runs are deterministic anyway.")
    init_from: str | None = option(None, "Start from another run's checkpoint (e.g. VSE++ best.pt for "
                                         "ConVSE).", path="file")
    log_every: int = option(10, "Log the loss (bar, TensorBoard) every N iterations.", minimum=1,
                            resume=True, identity=False)

    def __post_init__(self):
        for name, value in self.checked(vars(self)).items():
            setattr(self, name, value)
        for name, value in NETWORKS.defaults(self.network).items():  # its declaration's: e.g. VSE∞, GPO
            if getattr(self, name) == self.default(name):
                setattr(self, name, value)
        if self.caption_loss_weight is None:  # unset, and the network sets none: off, stored as such
            self.caption_loss_weight = 0.0    # (one stored value per behaviour: config_id groups them)
        if self.embed_dim is None:  # unset, and the network sets none: VSE++'s 1024, stored as such
            self.embed_dim = 1024
        if self.amp is None:  # unset: the GPU's measured rule, stored as chosen (config_id groups by it)
            self.amp = amp_by_default(self)

    @property
    def pairwise(self) -> bool:
        """The network scores pairs jointly: the kind its declaration says (a user's
        ``FILE.py:Class`` declares its own; networks/network.py)."""
        return NETWORKS.spec(self.network).kind == "pairwise"

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        """Options not in ``values`` take the defaults above (the only place that holds them)."""
        values = run_options(values)  # a run's config.json: its precision record is no option
        unknown = sorted(set(values) - set(option_names(cls)))
        if unknown:
            raise VseError(f"unknown training option(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def default(cls, name: str):
        """The default of option ``name`` (what `vse train --help` shows)."""
        field_ = _field(cls, name)
        return field_.default_factory() if field_.default is MISSING else field_.default

    @classmethod
    def checked(cls, values: dict) -> dict:
        """``values`` (some options, by name) with the types of the annotations, the ranges and
        the choices of the fields checked: VseError naming the first wrong one. Numbers given
        for float options become floats (also text such as '1e-3', which YAML 1.1 reads as text)."""
        hints = typing.get_type_hints(cls)
        out = {}
        for name, value in values.items():
            value = out[name] = as_type(name, value, hints[name], error=VseError, text_numbers=True)
            facts = info(name, cls)
            if value is None:
                continue
            if facts.minimum is not None and (value < facts.minimum
                                              or value == facts.minimum and not facts.inclusive):
                raise VseError(f"{name} must be {'at least' if facts.inclusive else 'more than'} "
                               f"{facts.minimum}, got {value!r}")
            if facts.choices is not None and value not in facts.choices:
                raise VseError(f"{flag_name(name)} must be one of {', '.join(map(str, facts.choices))}, "
                               f"not {value!r}")
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        """Options that only make sense together (VseError otherwise)."""
        LOSSES.check(self.loss)
        NETWORKS.spec(self.network).check(self)  # its kind's rules and its own (its options: when built)
        # the option's own rule, whatever the network: the caption branch reads the vsrn pool's regions
        if self.caption_loss_weight and (self.image_pool != "vsrn" or self.text_features):
            raise VseError("VSRN's caption branch (--caption-loss-weight, 1 by default for --network vsrn) "
                           "writes each caption's word ids from the regions of --network vsrn: it needs that "
                           "network and word ids, not --text-features (--caption-loss-weight 0 turns it off)")
        csv = {name: value for name in READERS.option_names() if (value := getattr(self, name)) is not None}
        if self.rc:
            if not self.root:
                raise VseError("--rc needs --root, the dataset folder")
            if self.features:
                raise VseError("--rc reads images: give --features (cached) or --rc, not both")
            if self.preload:
                raise VseError("--preload loads a feature cache; it does not apply to --rc")
            READERS.reader_options(self.dataset, **csv)  # a wrong reader option stops here, before any write
        else:
            if not self.features:
                raise VseError("--features is required (or --rc with --dataset and --root)")
            if self.finetune:
                raise VseError("--finetune needs --rc: a feature cache has no CNN to train")
            if csv:
                raise VseError(f"{', '.join(map(flag_name, csv))} describe a --dataset csv file for --rc; "
                               "a feature cache already holds its captions and splits")
        if self.grid and not self.rc:
            raise VseError("--grid is for --rc (the CNN runs each step); a cache holds a grid when "
                           "`vse extract --grid` made it")
        if self.grid and self.image_pool is None:
            raise VseError("--grid gives each image a set of grid cells: pool them with --image-pool")
        gru_head = not self.text_features and self.text_pool == LAST
        if self.projection != "linear" and self.image_pool is not None and not gru_head:
            raise VseError(f"--projection {self.projection} applies to a one-vector image and to the GRU "
                           "caption encoder; here the images are sets (--set-projection) and the captions "
                           "are not the GRU's (--text-projection)")
        if self.image_pool is not None:
            check_image_pool(self.image_pool)
        check_text_pool(self.text_pool)
        if self.noise_rate >= 1:
            raise VseError(f"--noise-rate must be below 1, got {self.noise_rate}")
        if self.noise_index and self.noise_rate:
            raise VseError("give --noise-rate (a drawn index) or --noise-index FILE, not both")
        # the file's layout and draw are its own: a value here would be recorded and split config ids
        drawing = [flag_name(name) for name in ("noise_mode", "noise_seed")
                   if getattr(self, name) != self.default(name)]
        if self.noise_index and drawing:
            raise VseError(f"{' and '.join(drawing)} describe the draw of --noise-rate; --noise-index FILE "
                           "is read as it is (its layout from its note or its length): give one or the other")
        if self.text_features and self.glove:
            raise VseError("--glove initialises the GRU's word embeddings; with --text-features "
                           "there is no GRU")

    def absolute_plugins(self) -> None:
        """Name each plug-in file by its absolute path, as the run records it (``code_identity``)."""
        from pipeline.core import code_identity

        options = {name: getattr(self, name) for name in code_identity.OPTIONS}
        for name, spec in code_identity.absolute_plugins(options).items():
            setattr(self, name, spec)

    def old_spellings(self) -> list[str]:
        """Apply the spellings kept for one version; returns a note for each one used."""
        notes = []
        if self.rc and self.image_pool is not None and not self.grid:
            self.grid = True
            notes.append("--rc with --image-pool now needs --grid (the CNN's map as a set); "
                         "taken as --grid for this version")
        return notes

    def dataset_options(self) -> dict:
        """The reader options of --dataset (the csv layout) for ``data.readers.load_dataset``."""
        return READERS.reader_options(self.dataset, **{n: getattr(self, n) for n in READERS.option_names()})

    def loss_kwargs(self) -> dict:
        kwargs = dict(self.loss_options)
        if self.margin is not None:
            kwargs["margin"] = self.margin
        return kwargs


# ---------------------------------------------------------------------------- the loss flags
# A loss's options are declared once, by the loss (its ``Options``: default, type, range, choices;
# ``losses.base.VseLoss``), and checked there: a new loss, built-in or FILE.py:Class, takes them by
# --loss-option KEY=VALUE and config files' ``loss_options:`` and touches nothing here. These five
# flags are only the older command-line spellings of options of the built-in losses, kept as they
# were (torch-free, for --help); tests/test_option_declarations.py checks each against the losses'
# declarations (the key is declared, with this type).
@dataclass(frozen=True)
class LossFlag:
    """A flag for one loss option (``loss_options[key]``): a loss's own options are not fields."""

    key: str
    type: type
    help: str


LOSS_FLAGS = {
    "negative_set_size": LossFlag("negative_set_size", int, "mh: hardest negative among k random negatives."),
    "warmup_epochs": LossFlag("warmup_epochs", int, "mh, lseh: sum of hinges for the first E epochs "
                                                    "(VSE∞'s --vse_mean_warmup_epochs)."),
    "tau": LossFlag("tau", float, "Temperature of the contrastive losses."),
    "lseh_lambda": LossFlag("lambda_", float, "lseh: weight of the semantic margin."),
    "ladder_levels": LossFlag("levels", int, "ladder: L (2 or 3)."),
}


# ---------------------------------------------------------------------------- facts of the fields
def _field(cls, name: str) -> dataclasses.Field:
    for field_ in fields(cls):
        if field_.name == name:
            return field_
    raise KeyError(name)


def info(name: str, cls=TrainConfig) -> OptionInfo:
    """The facts of option ``name``."""
    return _field(cls, name).metadata.get(META, OptionInfo())


def option_names(cls=TrainConfig) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def flag_name(name: str) -> str:
    """``batch_size`` → ``--batch-size``."""
    return "--" + name.replace("_", "-")


def resume_may_change(cls=TrainConfig) -> tuple[str, ...]:
    """The options a resumed run may change: how long, how often to validate and log, and where
    and how fast data is read, never which updates are made."""
    return tuple(name for name in option_names(cls) if info(name, cls).resume)


def execution_only(cls=TrainConfig) -> tuple[str, ...]:
    """Options that say where or how a run was executed, not what it computes: runs whose
    configs differ only in these (and the seed) are one configuration (seed groups)."""
    return tuple(name for name in option_names(cls) if not info(name, cls).identity)


def old_defaults(cls=TrainConfig) -> dict:
    """What a run written before an option existed used for it (its config.json and
    checkpoints lack the key; the option's default today may be another value)."""
    return {name: info(name, cls).before for name in option_names(cls)
            if info(name, cls).before is not UNSET}


def with_old_defaults(values: dict, cls=TrainConfig) -> dict:
    """A saved config with the values of the options it predates filled in (and a config.json's
    precision record read as ``run_options`` reads it)."""
    return {**old_defaults(cls), **run_options(values)}


# ---------------------------------------------------------------------------- the precision applied
def recorded_config(config: TrainConfig, used: precision.Precision, device_type: str) -> dict:
    """What a run's config.json holds: its options, with ``amp`` and ``cpu_amp`` as the device
    applied them (``precision.applied``: a CPU run never says ``"amp": true``), and the precision
    record (``precision.RECORD_KEY``: the checkpoint's, with the device kind). The record also keeps,
    under ``identity``, the two options as the config resolved them before the device was known
    (--amp's GPU default on a CPU run too): config_id, --resume and `vse sweep` compare those, so a
    run keeps the config_id that the same behaviour had before this record existed."""
    values = config.to_dict()
    options = {name: values[name] for name in precision.OPTIONS}
    record = {**used.as_dict(), "device": device_type, "identity": options}
    return {**values, **precision.applied(options, device_type), precision.RECORD_KEY: record}


def run_options(values: dict) -> dict:
    """The options of a saved config: a config.json's precision record taken out, and the
    precision options as the run's identity holds them (``recorded_config``)."""
    record = values.get(precision.RECORD_KEY)
    if record is None:
        return values
    values = {name: value for name, value in values.items() if name != precision.RECORD_KEY}
    identity = record.get("identity") if isinstance(record, dict) else None
    return {**values, **(identity or {})}


def identity_values(values: dict, cls=TrainConfig) -> dict:
    """A config without the options that are not part of a run's identity."""
    dropped = set(execution_only(cls))
    return {k: v for k, v in values.items() if k not in dropped}


# ---------------------------------------------------------------------------- the resume rule
def file_options(cls=TrainConfig) -> tuple[str, ...]:
    """The options that name a file or folder: a resumed run compares them by identity."""
    return tuple(name for name in option_names(cls) if info(name, cls).path)


def resume_config(saved_values: dict, config, given, where, cls=TrainConfig, same_file=None):
    """The config a resumed run continues with: the run's own (``saved_values``, its checkpoint's
    ``train_config``), with the options in ``given`` as ``config`` has them (None: all of
    ``config``). VseError naming ``where`` if an option --resume may not change differs. A file
    option given by another path is no change when ``same_file(name, new, old)`` says it names
    the same file (a relative or absolute path, a symlink, a moved folder); the run continues
    with the new path. Returns (the config, the run's own config, notes on what changed)."""
    try:
        saved = cls.from_dict(with_old_defaults(saved_values, cls))
    except VseError as exc:
        raise VseError(f"its train_config: {exc}", where) from None
    if given is not None:
        values = saved.to_dict()
        for name in given:
            new = getattr(config, name)
            values[name] = {**values[name], **new} if isinstance(new, dict) else new  # loss_options
        config = cls.from_dict({**values, "run_dir": config.run_dir})
    changed = [name for name in option_names(cls) if getattr(config, name) != getattr(saved, name)]
    renamed = [name for name in changed if name in file_options(cls) and same_file is not None
               and getattr(config, name) and getattr(saved, name)
               and same_file(name, getattr(config, name), getattr(saved, name))]
    changed = [name for name in changed if name not in renamed]
    allowed = resume_may_change(cls)
    refused = [name for name in changed if name not in allowed]
    if refused:
        differences = ", ".join(f"{name} {getattr(config, name)!r} (the run's: {getattr(saved, name)!r})"
                                for name in refused)
        raise VseError(f"--resume may not change {differences}; only {', '.join(allowed)} "
                       f"may change (start a new --run-dir to train with other options)", where)
    notes = [f"{name} {getattr(config, name)!r} (was {getattr(saved, name)!r})"
             for name in changed if name != "run_dir"]
    notes += [f"{name} {getattr(config, name)!r} (the same file as the run's {getattr(saved, name)!r})"
              for name in renamed]
    return config, saved, notes


def amp_by_default(config: TrainConfig) -> bool:
    """--amp's default on a GPU: ``precision.mixed_precision_measured`` (on for the dual networks,
    off for the pairwise ones, whose authors trained in fp32 and whose bf16 step is also slower on
    a GPU: bench/results/gpu)."""
    return precision.mixed_precision_measured(config)

