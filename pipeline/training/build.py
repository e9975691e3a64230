"""``build_run``: everything a training run needs, built from its config and its run folder,
handed to the ``Trainer`` as one ``RunParts``. The Trainer only fits, steps, validates and saves.

The order of the steps is part of the run's result: the global RNG is seeded just before the
loss and the model are built, so their initial weights depend on the seed alone, whatever was
read before (a resumed run then restores every RNG from its checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.core import distributed as dist
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig, file_options
from pipeline.core.errors import VseError
from pipeline.core.runtime import (
    configure_kernels,
    default_workers,
    describe,
    resolve_device,
    seed_everything,
    train_dtype,
)
from pipeline.data.batches import PairSource
from pipeline.data.captions import CaptionEncoder
from pipeline.training import factories
from pipeline.training.curves import Curves
from pipeline.training.run_folder import RunFolder, file_identity


@dataclass
class RunParts:
    """The built parts of one run. ``resume_state``: the checkpoint a resumed run continues
    (the Trainer restores it), else None."""

    config: TrainConfig
    run: RunFolder
    echo: object                    # print on rank 0, silent elsewhere
    resume: bool
    overwrite: bool
    device: torch.device
    distributed: bool
    world: int
    setup_line: str
    source: PairSource              # where the pairs come from (a cache, or images + CNN)
    train_captions: np.ndarray      # the training captions, in cache order
    train_caption_image: np.ndarray  # each caption's image in training: the cache's, or a noisy one
    noise: object                   # the NoiseIndex of a run on noisy pairs, else None
    captions: CaptionEncoder        # the caption side (tokens, or frozen caption features)
    workers: int
    loss: torch.nn.Module
    loss_traits: object
    model: torch.nn.Module
    relevance: object               # the batch relevance of a loss that uses it, else None
    trainable: list
    loss_parameters: list
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    train_dtype: torch.dtype | None  # the step's autocast dtype (None: fp32)
    ddp_model: torch.nn.Module      # the model the step runs (DDP under torchrun)
    file_identity: dict
    curves: Curves
    resume_state: dict | None = None


def build_run(config: TrainConfig, resume: bool = False, echo=print, given=None,
              overwrite: bool = False) -> RunParts:
    """``given``: the names of the options the user set (the CLI's flags and config file);
    with ``resume`` the others are the run's own. None: every option of ``config``.
    ``overwrite``: replace a run already in the folder (kept until this run's first
    checkpoint is complete); without it or ``resume`` such a folder is refused."""
    run = RunFolder(config.run_dir)
    # before the process group exists, the rank comes from torchrun's environment
    quiet_echo = echo if dist.env_is_main() else (lambda *a, **k: None)
    resume_state = None
    if resume:  # rank 0 holds the folder from here on: nobody writes it while it is read
        run.lock.acquire()
        if dist.env_is_main():
            run.start(resume, overwrite)
        resume_state, config, notes = run.resume(config, given)
        if notes:
            quiet_echo(f"resuming with {', '.join(notes)}")
    for note in config.old_spellings():
        quiet_echo(f"note: {note}")
    config.check()
    device = resolve_device(config.device)
    distributed = dist.init_from_env(device)
    echo = echo if dist.is_main() else (lambda *a, **k: None)  # the rank is known now
    world = dist.world_size()
    if resume_state is not None:
        _check_world_size(resume_state, world, run.last)
    kernels = configure_kernels(device, config.deterministic, fixed_shapes=config.rc)
    dtype = train_dtype(device, config.amp, config.cpu_amp)  # refuses --cpu-amp without native bf16
    setup_line = (f"device {describe(device, config.amp, config.cpu_amp)}"
                  + (f", {kernels}" if kernels else "")
                  + (f"; {world} processes ({dist.backend()})" if distributed else ""))

    source = factories.create_pair_source(config)
    workers = config.workers if config.workers is not None else (default_workers() if config.rc else 0)
    init_state = load_checkpoint(config.init_from) if config.init_from else None
    index = source.index
    train_captions = np.flatnonzero(np.isin(index.caption_image, index.split(config.train_split)))
    captions = factories.create_caption_side(config, source, train_captions, resume_state, init_state,
                                             run.last)
    if len(train_captions) == 0:
        raise VseError(f"split {config.train_split!r} has no captions", source.location)
    if len(index.split(config.val_split)) == 0:  # fail now, not after the first epoch
        raise VseError(f"validation split {config.val_split!r} has no images", source.location)
    noise, train_caption_image = _noise(config, index, train_captions, run, resume_state, quiet_echo)
    if resume_state is not None:
        _check_files_unchanged(config, resume_state)

    seed_everything(config.seed)
    loss, traits = factories.create_loss(config, device)
    model = factories.create_model(config, source, captions, traits, device, distributed)
    factories.tell_loss_the_scores(config, loss, model)
    if init_state is not None:
        factories.init_from_checkpoint(model, init_state, config, echo)
    elif config.glove:
        factories.load_glove(model, captions.vocab, echo)
    relevance = factories.create_relevance(config, traits, source)
    trainable, loss_parameters = factories.trainable_parameters(model, loss)
    optimizer = factories.create_optimizer(config, model, trainable)
    # a resumed run's curves drop what the stopped process logged after its checkpoint
    purge = resume_state["progress"]["iteration"] + 1 if resume_state is not None else None
    return RunParts(
        config=config, run=run, echo=echo, resume=resume, overwrite=overwrite, device=device,
        distributed=distributed, world=world, setup_line=setup_line, source=source,
        train_captions=train_captions, train_caption_image=train_caption_image, noise=noise,
        captions=captions, workers=workers, loss=loss, loss_traits=traits,
        model=model, relevance=relevance, trainable=trainable, loss_parameters=loss_parameters,
        optimizer=optimizer, scheduler=factories.create_scheduler(config, optimizer),
        scaler=factories.create_scaler(config, device),
        train_dtype=dtype,
        ddp_model=factories.wrap_ddp(model, config, distributed),
        file_identity=_file_identity(config, resume_state),
        curves=Curves(run.curves_dir, purge_step=purge, enabled=dist.is_main()),
        resume_state=resume_state)


def build_trainer(config: TrainConfig, resume: bool = False, echo=print, given=None,
                  overwrite: bool = False):
    """The Trainer of a run folder and its config, in one call (``build_run``'s arguments)."""
    from pipeline.training.trainer import Trainer

    return Trainer(build_run(config, resume=resume, echo=echo, given=given, overwrite=overwrite))


def _noise(config: TrainConfig, index, train_captions: np.ndarray, run: RunFolder, resume_state, echo):
    """(the noise index, each caption's training image) of a run on noisy pairs; (None, the
    cache's) otherwise. A resumed run's index must be the one its folder kept (its
    ``noise_index.npy``, else the sha256 its ``noise.json`` records): one drawn or read anew that
    differs is refused, never written over it."""
    if not (config.noise_rate or config.noise_index):
        return None, index.caption_image
    from pipeline.data.noise import NOISE_FILE, NoiseIndex, drawn_for, saved_sha256

    images = np.unique(index.caption_image[train_captions])  # the training images, in cache order
    local = np.searchsorted(images, index.caption_image[train_captions])
    split = drawn_for(config.train_split, [index.captions[i] for i in train_captions], len(images))
    if config.noise_index:
        noise = NoiseIndex.read(config.noise_index, local, len(images), split)
    else:
        noise = NoiseIndex.make(config.noise_mode, config.noise_rate, config.noise_seed, local, len(images),
                                split)
    kept = saved_sha256(run.path) if resume_state is not None else None
    if kept not in (None, noise.sha256()):
        raise VseError(f"the noise index ({noise.source}, sha256 {noise.sha256()[:12]}…) is not the one this "
                       f"run trained on ({run.path / NOISE_FILE}, {kept[:12]}…): was it drawn again since?",
                       config.noise_index or run.path)
    noisy = index.caption_image.copy()
    noisy[train_captions] = images[noise.per_caption()]
    echo(f"noisy pairs: {noise.layout}-level index ({noise.source}), true rate {noise.true_rate():.4f} "
         f"of {len(local)} training captions")
    if noise.note:
        echo(f"note: {noise.note}")
    return noise, noisy


def _check_world_size(state: dict, world: int, where) -> None:
    """The global batch (and so each pair's place in it) depends on the number of processes."""
    saved = int(state.get("world_size", 1))  # checkpoints before world_size: one process
    if saved != world:
        raise VseError(f"--resume with {world} process(es), but the run was trained with {saved}: "
                       f"the global batch and the order of pairs depend on it", where)


def _check_files_unchanged(config: TrainConfig, resume_state) -> None:
    """A resumed run reads the files it began with: a file it names (the cache, the relevance, a
    noise index...) rewritten in place since (another sha256 than its checkpoint recorded at the
    start) is refused, as --resume refuses another file by another path. Every process checks:
    each must stop."""
    for name, recorded in (resume_state.get("file_identity") or {}).items():
        path = getattr(config, name, None)
        if path and Path(path).is_file() and file_identity(path) != recorded:
            raise VseError(f"changed since the run began (its --{name.replace('_', '-')}, sha256 "
                           f"{str(recorded.get('sha256'))[:12]}… then): --resume would go on with other data "
                           "than the run's first steps; start a new --run-dir", path)


def _file_identity(config: TrainConfig, resume_state) -> dict:
    """The identity of each file the run names (``run_folder.file_identity``), so that a resumed
    run may name them by another path: a resumed run keeps what its checkpoint recorded."""
    if resume_state is not None and "file_identity" in resume_state:
        return resume_state["file_identity"]
    if not dist.is_main():
        return {}
    return {name: file_identity(getattr(config, name)) for name in file_options()
            if getattr(config, name) and Path(getattr(config, name)).is_file()}
