"""What each part of a run reads of its ``TrainConfig``: small frozen settings, each derived by one
function from the checked config, all at once by ``run_settings`` (``build_run`` calls it once).

A factory is handed its own part's settings, never the whole config; the resolved ``TrainConfig``
stays what the run records (config.json, a checkpoint's ``train_config``). Torch-free: values
only, nothing is opened or built here.

    RuntimeSettings    device, precision, kernels (and the seed the RNGs start from)
    DataSettings       the pairs: feature cache or images (RC), caption features, splits,
                       preload, workers, and what the caption side is built from
    NoiseSettings      a run on noisy pairs: the drawn index or the file of one
    LossSettings       the loss, its options and the relevance file it may read
    ModelSettings      the network and its heads (and the fields the caption side's
                       ``model_fields`` reads: word_dim, glove, text_pool, text_projection)
    OptimizerSettings  Adam's learning rates and kernel, the step schedule, clipping
    LoopSettings       epochs, batch, seed, validation
    LoggingSettings    how often the training curves get a point
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core import code_identity
from pipeline.core.config import TrainConfig, file_options


@dataclass(frozen=True)
class RuntimeSettings:
    device: str               # as asked ("auto", "cpu", "cuda", ...): core.runtime resolves it
    amp: bool
    cpu_amp: bool
    deterministic: bool
    fixed_shapes: bool        # RC mode: every batch has the same shapes (the kernels may be tuned)
    seed: int


@dataclass(frozen=True)
class DataSettings:
    rc: bool                  # images through the CNN every step, not a feature cache
    features: str | None
    preload: bool             # hold the cache in memory (always with caption features)
    text_features: str | None
    dataset: str | None       # RC: the layout, its folder, its reader's options, the CNN
    root: str | None
    dataset_options: dict | None
    backbone: str
    backbone_weights: str | None
    finetune: bool
    freeze_bn: bool
    crop: str
    grid: bool
    seed: int
    batch_size: int
    train_split: str
    val_split: str
    workers: int | None       # None: one per core but one in RC mode, none over a cache
    min_word_count: int
    max_caption_tokens: int


@dataclass(frozen=True)
class NoiseSettings:
    rate: float
    mode: str
    seed: int
    index: str | None         # a noise index file, read as it is

    @property
    def wanted(self) -> bool:
        return bool(self.rate or self.index)


@dataclass(frozen=True)
class LossSettings:
    name: str                 # a built-in loss or FILE.py:Class
    options: dict             # its keyword options (--margin included)
    loss_options: dict        # those the run sets itself by name (--loss-option, loss_options:)
    relevance: str | None


@dataclass(frozen=True)
class ModelSettings:
    network: str
    network_options: dict
    embed_dim: int
    word_dim: int
    glove: bool
    img_norm: bool
    projection: str
    text_features: str | None
    text_projection: str
    image_pool: str | None
    set_projection: str
    size_augment: str
    text_pool: str
    pool_options: dict
    caption_loss_weight: float | None
    rc: bool
    backbone: str
    finetune: bool
    freeze_bn: bool
    init_from: str | None
    loss: str                 # the loss's name, for the refusals that name it


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float
    backbone_lr_factor: float
    adam_kernel: str
    lr_decay: float
    lr_decay_epoch: int
    grad_clip: float


@dataclass(frozen=True)
class LoopSettings:
    epochs: int
    batch_size: int           # per process
    seed: int
    val_every: int
    val_split: str
    val_images: int | None


@dataclass(frozen=True)
class LoggingSettings:
    log_every: int            # steps between two points of the training curves (RUN/tb)


@dataclass(frozen=True)
class RunSettings:
    """Every part's settings of one run, the files it names (option → path, for --resume's
    identity checks) and the options its code identity is read from (``core.code_identity.OPTIONS``)."""

    runtime: RuntimeSettings
    data: DataSettings
    noise: NoiseSettings
    loss: LossSettings
    model: ModelSettings
    optimizer: OptimizerSettings
    loop: LoopSettings
    logging: LoggingSettings
    files: dict
    code: dict


def runtime_settings(config: TrainConfig) -> RuntimeSettings:
    return RuntimeSettings(device=config.device, amp=config.amp, cpu_amp=config.cpu_amp,
                           deterministic=config.deterministic, fixed_shapes=config.rc, seed=config.seed)


def data_settings(config: TrainConfig) -> DataSettings:
    """``dataset_options`` only in RC mode (``TrainConfig.check`` has checked them there)."""
    return DataSettings(
        rc=config.rc, features=config.features, preload=config.preload, text_features=config.text_features,
        dataset=config.dataset, root=config.root,
        dataset_options=config.dataset_options() if config.rc else None,
        backbone=config.backbone, backbone_weights=config.backbone_weights, finetune=config.finetune,
        freeze_bn=config.freeze_bn, crop=config.crop, grid=config.grid, seed=config.seed,
        batch_size=config.batch_size, train_split=config.train_split, val_split=config.val_split,
        workers=config.workers, min_word_count=config.min_word_count,
        max_caption_tokens=config.max_caption_tokens)


def noise_settings(config: TrainConfig) -> NoiseSettings:
    return NoiseSettings(rate=config.noise_rate, mode=config.noise_mode, seed=config.noise_seed,
                         index=config.noise_index)


def loss_settings(config: TrainConfig) -> LossSettings:
    return LossSettings(name=config.loss, options=config.loss_kwargs(), loss_options=config.loss_options,
                        relevance=config.relevance)


def model_settings(config: TrainConfig) -> ModelSettings:
    return ModelSettings(
        network=config.network, network_options=config.network_options, embed_dim=config.embed_dim,
        word_dim=config.word_dim, glove=config.glove, img_norm=config.img_norm, projection=config.projection,
        text_features=config.text_features, text_projection=config.text_projection,
        image_pool=config.image_pool, set_projection=config.set_projection, size_augment=config.size_augment,
        text_pool=config.text_pool, pool_options=config.pool_options,
        caption_loss_weight=config.caption_loss_weight, rc=config.rc, backbone=config.backbone,
        finetune=config.finetune, freeze_bn=config.freeze_bn, init_from=config.init_from, loss=config.loss)


def optimizer_settings(config: TrainConfig) -> OptimizerSettings:
    return OptimizerSettings(lr=config.lr, backbone_lr_factor=config.backbone_lr_factor,
                             adam_kernel=config.adam_kernel, lr_decay=config.lr_decay,
                             lr_decay_epoch=config.lr_decay_epoch, grad_clip=config.grad_clip)


def loop_settings(config: TrainConfig) -> LoopSettings:
    return LoopSettings(epochs=config.epochs, batch_size=config.batch_size, seed=config.seed,
                        val_every=config.val_every, val_split=config.val_split, val_images=config.val_images)


def logging_settings(config: TrainConfig) -> LoggingSettings:
    return LoggingSettings(log_every=config.log_every)


def named_files(config: TrainConfig) -> dict:
    """The options that name a file or folder (``config.file_options``) → their values."""
    return {name: getattr(config, name) for name in file_options()}


def run_settings(config: TrainConfig) -> RunSettings:
    """Every part's settings of a checked config (after ``old_spellings`` and ``check``)."""
    return RunSettings(runtime=runtime_settings(config), data=data_settings(config),
                       noise=noise_settings(config), loss=loss_settings(config), model=model_settings(config),
                       optimizer=optimizer_settings(config), loop=loop_settings(config),
                       logging=logging_settings(config), files=named_files(config),
                       code={name: getattr(config, name) for name in code_identity.OPTIONS})


def unreached_phases(loss: str, starts, epochs: int) -> str | None:
    """One line when a run of ``epochs`` epochs ends before a part of its loss's method begins
    (``starts``: the (what, first epoch 0-based) pairs a loss declares, ``VseLoss.starts``): such a
    run trains another method under the loss's name, e.g. mh with warmup_epochs >= epochs is sum of
    hinges throughout. None when every part begins within the run. The one check behind `vse train`'s
    warning, the sweep's, the refused tune search and the report's mark (issue 49)."""
    missed = [f"{what} would begin in epoch {first + 1}" for what, first in starts if first >= epochs]
    if not missed:
        return None
    return (f"loss {loss}: {'; '.join(missed)}, after the run's {epochs} epoch(s): the run trains without it "
            f"under {loss}'s name")
