"""``build_run``: everything a training run needs, built from its config and its run folder,
handed to the ``Trainer`` as one ``RunParts`` (``training.parts``). The Trainer only fits, steps,
validates and saves.

The config is read once: ``training.settings.run_settings`` derives each part's settings, and each
factory is handed its own part's (never the whole config). The resolved config itself goes only to
the run folder and the Trainer, which record it (config.json, checkpoints).

The order of the steps is part of the run's result: the global RNG is seeded just before the
loss and the model are built, so their initial weights depend on the seed alone, whatever was
read before (a resumed run then restores every RNG from its checkpoint).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core import code_identity, precision
from pipeline.core import distributed as dist
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.core.runtime import (
    configure_kernels,
    default_workers,
    describe,
    resolve_device,
    seed_everything,
    train_dtype,
)
from pipeline.networks.network import network_kind
from pipeline.training import factories
from pipeline.training.curves import Curves
from pipeline.training.parts import Network, Objective, Optimization, RunData, RunParts, Runtime
from pipeline.training.run_folder import RunFolder, file_identity
from pipeline.training.settings import (
    NoiseSettings,
    RunSettings,
    RuntimeSettings,
    run_settings,
    unreached_phases,
)
from pipeline.training.trainer import Trainer

__all__ = ["RunParts", "build_run", "build_trainer"]


def build_run(config: TrainConfig, resume: bool = False, echo=print, given=None,
              overwrite: bool = False, run: RunFolder | None = None) -> RunParts:
    """``given``: the names of the options the user set (the CLI's flags and config file);
    with ``resume`` the others are the run's own. None: every option of ``config``.
    ``overwrite``: replace a run already in the folder (kept until this run's first
    checkpoint is complete); without it or ``resume`` such a folder is refused. ``run``: the
    run folder a caller has claimed already (``RunFolder.claim``), in the same mode."""
    if run is None:
        run = RunFolder(config.run_dir, resume=resume, overwrite=overwrite)
    # before the process group exists, the rank comes from torchrun's environment
    quiet_echo = echo if dist.env_is_main() else (lambda *a, **k: None)
    resume_state = None
    config.absolute_plugins()  # the run records where its plug-ins are, wherever it began
    if run.resuming:  # rank 0 holds the folder from here on: nobody writes it while it is read
        run.begin()
        resume_state, config, notes = run.resume(config, given)
        if notes:
            quiet_echo(f"resuming with {', '.join(notes)}")
        config.absolute_plugins()  # a run saved before they were recorded so
    for note in config.old_spellings():
        quiet_echo(f"note: {note}")
    config.check()
    settings = run_settings(config)  # the one reading of the config: each part's settings
    code = _code_identity(settings.code, resume_state, run)  # a resumed run on other code: refused first
    runtime = _runtime(settings.runtime, resume_state, run)
    echo = echo if dist.is_main() else (lambda *a, **k: None)  # the rank is known now

    data, init_state = _data(settings, resume_state, run, quiet_echo)
    seed_everything(settings.runtime.seed)
    loss, traits = factories.create_loss(settings.loss, runtime.device)
    unreached = unreached_phases(settings.loss.name, traits.starts, settings.loop.epochs)
    if unreached:  # the method never starts: said, not trained silently under its name
        echo(f"warning: {unreached}")
    model = factories.create_model(settings.model, data.source, data.captions, traits, runtime.device,
                                   runtime.distributed)
    factories.tell_loss_the_scores(settings.loss, loss, model)
    if init_state is not None:
        factories.init_from_checkpoint(model, init_state, settings.model, echo)
    elif settings.model.glove:
        factories.load_glove(model, data.captions.vocab, echo)
    relevance = factories.create_relevance(settings.loss, traits, data.source)
    trainable, loss_parameters = factories.trainable_parameters(model, loss)
    optimizer = factories.create_optimizer(settings.optimizer, model, trainable)
    # a resumed run's curves drop what the stopped process logged after its checkpoint
    purge = resume_state["progress"]["iteration"] + 1 if resume_state is not None else None
    optimization = Optimization(
        optimizer=optimizer, scheduler=factories.create_scheduler(settings.optimizer, optimizer),
        scaler=factories.create_scaler(settings.runtime, runtime.device), trainable=trainable,
        loss_parameters=loss_parameters)
    network = Network(model=model, ddp_model=factories.wrap_ddp(model, settings.model, runtime.distributed),
                      pairwise=network_kind(model) == "pairwise")
    return RunParts(
        config=config, settings=settings, run=run, echo=echo, runtime=runtime, data=data,
        objective=Objective(loss=loss, loss_traits=traits, relevance=relevance), network=network,
        optimization=optimization, file_identity=_file_identity(settings.files, resume_state),
        curves=Curves(run.curves_dir, purge_step=purge, enabled=dist.is_main()),
        resume_state=resume_state, code_identity=code)


def build_trainer(config: TrainConfig, resume: bool = False, echo=print, given=None,
                  overwrite: bool = False, run: RunFolder | None = None) -> Trainer:
    """The Trainer of a run folder and its config, in one call (``build_run``'s arguments)."""
    return Trainer(build_run(config, resume=resume, echo=echo, given=given, overwrite=overwrite, run=run))


def _runtime(settings: RuntimeSettings, resume_state: dict | None, run: RunFolder) -> Runtime:
    """The device, the process group (under torchrun), the kernels and the step's precision."""
    device = resolve_device(settings.device)
    distributed = dist.init_from_env(device)
    world = dist.world_size()
    if resume_state is not None:
        _check_world_size(resume_state, world, run.last)
    kernels = configure_kernels(device, settings.deterministic, fixed_shapes=settings.fixed_shapes)
    dtype = train_dtype(device, settings.amp, settings.cpu_amp)  # refuses --cpu-amp without native bf16
    setup_line = (f"device {describe(device, settings.amp, settings.cpu_amp)}"
                  + (f", {kernels}" if kernels else "")
                  + (f"; {world} processes ({dist.backend()})" if distributed else ""))
    return Runtime(device=device, distributed=distributed, world=world, train_dtype=dtype,
                   precision=precision.of_step(dtype, device.type), setup_line=setup_line)


def _data(settings: RunSettings, resume_state: dict | None, run: RunFolder,
          echo) -> tuple[RunData, dict | None]:
    """The pairs of the run: their source, the caption side, the training captions and each one's
    image (a noisy one on noisy pairs); the splits are checked, and a resumed run's files. With
    them the checkpoint --init-from names (its vocabulary is the caption side's; its weights the
    model's)."""
    data = settings.data
    source = factories.create_pair_source(data)
    workers = data.workers if data.workers is not None else (default_workers() if data.rc else 0)
    init_from = settings.model.init_from
    init_state = load_checkpoint(init_from) if init_from else None
    index = source.index
    train_captions = np.flatnonzero(np.isin(index.caption_image, index.split(data.train_split)))
    captions = factories.create_caption_side(data, source, train_captions, resume_state, init_state, run.last)
    if len(train_captions) == 0:
        raise VseError(f"split {data.train_split!r} has no captions", source.location)
    if len(index.split(data.val_split)) == 0:  # fail now, not after the first epoch
        raise VseError(f"validation split {data.val_split!r} has no images", source.location)
    noise, train_caption_image = _noise(settings.noise, data.train_split, index, train_captions, run,
                                        resume_state, echo)
    if resume_state is not None:
        _check_files_unchanged(settings.files, resume_state)
    return RunData(source=source, captions=captions, train_captions=train_captions,
                   train_caption_image=train_caption_image, noise=noise, workers=workers), init_state


def _noise(settings: NoiseSettings, train_split: str, index, train_captions: np.ndarray, run: RunFolder,
           resume_state, echo):
    """(the noise index, each caption's training image) of a run on noisy pairs; (None, the
    cache's) otherwise. A resumed run's index must be the one its folder kept (its
    ``noise_index.npy``, else the sha256 its ``noise.json`` records): one drawn or read anew that
    differs is refused, never written over it."""
    if not settings.wanted:
        return None, index.caption_image
    from pipeline.data.noise import NOISE_FILE, NoiseIndex, drawn_for, saved_sha256

    images = np.unique(index.caption_image[train_captions])  # the training images, in cache order
    local = np.searchsorted(images, index.caption_image[train_captions])
    split = drawn_for(train_split, [index.captions[i] for i in train_captions], len(images))
    if settings.index:
        noise = NoiseIndex.read(settings.index, local, len(images), split)
    else:
        noise = NoiseIndex.make(settings.mode, settings.rate, settings.seed, local, len(images), split)
    kept = saved_sha256(run.path) if resume_state is not None else None
    if kept not in (None, noise.sha256()):
        raise VseError(f"the noise index ({noise.source}, sha256 {noise.sha256()[:12]}…) is not the one this "
                       f"run trained on ({run.path / NOISE_FILE}, {kept[:12]}…): was it drawn again since?",
                       settings.index or run.path)
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


def _check_files_unchanged(files: dict, resume_state) -> None:
    """A resumed run reads the files it began with: a file it names (the cache, the relevance, a
    noise index...) rewritten in place since (another sha256 than its checkpoint recorded at the
    start) is refused, as --resume refuses another file by another path. Every process checks:
    each must stop."""
    for name, recorded in (resume_state.get("file_identity") or {}).items():
        path = files.get(name)
        if path and Path(path).is_file() and file_identity(path) != recorded:
            raise VseError(f"changed since the run began (its --{name.replace('_', '-')}, sha256 "
                           f"{str(recorded.get('sha256'))[:12]}… then): --resume would go on with other data "
                           "than the run's first steps; start a new --run-dir", path)


def _code_identity(options: dict, resume_state: dict | None, run: RunFolder) -> dict:
    """The code identity of the run (``core.code_identity``: imports its plug-ins). A resumed run
    whose code differs from what its checkpoint recorded (a plug-in file or a sibling edited, a
    built-in loss or network file changed, another vse version) is refused, naming the file and
    both sha256: its steps would come from two programs. It keeps the record of its start (none, for
    a run begun before vse recorded it: its first steps' code is unknown)."""
    code = code_identity.of_config(options)
    if resume_state is None:
        return code
    recorded = code_identity.of_state(resume_state)
    line = code_identity.differences(recorded, code)
    if line:
        raise VseError(f"--resume: {line}: the run would go on with other code than its first steps; "
                       "train it anew (--overwrite, or another --run-dir)", run.path)
    return recorded


def _file_identity(files: dict, resume_state) -> dict:
    """The identity of each file the run names (``run_folder.file_identity``), so that a resumed
    run may name them by another path: a resumed run keeps what its checkpoint recorded."""
    if resume_state is not None and "file_identity" in resume_state:
        return resume_state["file_identity"]
    if not dist.is_main():
        return {}
    return {name: file_identity(path) for name, path in files.items() if path and Path(path).is_file()}
