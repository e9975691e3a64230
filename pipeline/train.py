"""The training loop: batches → model → loss → optimizer; validation; checkpoints; exact
resume; torchrun (DDP) with hard negatives mined over the global batch.

One loop serves both modes; they differ only in the pair source (``batches``): cached
features, or images whose crops go through the CNN every step (RC mode, ``rc``), frozen or
fine-tuned.  Under torchrun every rank embeds its B pairs, the embeddings are gathered with
gradient and every rank computes the loss of the whole global batch of N×B pairs, so each
loss — hardest negatives included — sees what a single process with batch N×B would.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from . import distributed as dist
from .batches import Batch, CachedFeatures, LoadFailure, PairBatches, PairSource, batch_slices, epoch_order
from .captions import CachedCaptionVectors, CaptionEncoder, GRUCaptions
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, resume_config
from .errors import VseError
from .fsutil import atomic_path, remove_stale_temporaries, write_atomic
from .inference import encode_split
from .loss_plugins import loss_traits, make_loss
from .metrics import evaluate_embeddings
from .models import ModelConfig, VSEModel, join_state
from .runlock import RunLock
from .runs import validation_log_lines
from .runtime import (
    autocast,
    configure_kernels,
    default_workers,
    describe,
    device_rng_state,
    needs_grad_scaler,
    pin_memory,
    resolve_device,
    rng_state,
    seed_everything,
    set_rng_state,
)
from .text import Vocabulary


@dataclass
class Progress:
    epoch: int = 0            # current epoch (0-based)
    batch: int = 0            # next batch within the epoch
    iteration: int = 0        # optimizer steps done
    best_rsum: float = -math.inf
    best_epoch: int = -1


class Trainer:
    """Owns the model, optimizer and data of one run. ``fit()`` trains to the end."""

    def __init__(self, config: TrainConfig, resume: bool = False, echo=print, given=None):
        """``given``: the names of the options the user set (the CLI's flags and config file);
        with ``resume`` the others are the run's own. None: every option of ``config``."""
        self.run_dir = Path(config.run_dir)
        self.lock = RunLock(self.run_dir)  # taken before last.pt is read, or at fit()
        # before the process group exists, the rank comes from torchrun's environment
        self.echo = echo if dist.env_is_main() else (lambda *a, **k: None)
        resume_state = None
        if resume:
            resume_state, config = self._resume_state(config, given)
        config.check()
        self.cfg = config
        self.device = resolve_device(config.device)
        self.distributed = dist.init_from_env(self.device)
        self.echo = echo if dist.is_main() else (lambda *a, **k: None)  # the rank is known now
        self.world = dist.world_size()
        if resume_state is not None:
            self._check_world_size(resume_state)
        kernels = configure_kernels(self.device, config.deterministic, fixed_shapes=config.rc)
        self.setup_line = (f"device {describe(self.device, config.amp)}" + (f", {kernels}" if kernels else "")
                           + (f"; {self.world} processes ({dist.backend()})" if self.distributed else ""))

        self.source = open_pair_source(config)
        self.index = self.source.index
        self.workers = (config.workers if config.workers is not None
                        else (default_workers() if config.rc else 0))
        init_state = load_checkpoint(config.init_from) if config.init_from else None
        # the training pairs, in cache order (the epoch order permutes these positions)
        train_images = self.index.split(config.train_split)
        self.train_captions = np.flatnonzero(np.isin(self.index.caption_image, train_images))
        self.captions = self._caption_encoder(resume_state, init_state)
        self.vocab = self.captions.vocab  # None with cached caption features
        if len(self.train_captions) == 0:
            raise VseError(f"split {config.train_split!r} has no captions", self.source.location)
        if len(self.index.split(config.val_split)) == 0:  # fail now, not after the first epoch
            raise VseError(f"validation split {config.val_split!r} has no images", self.source.location)

        seed_everything(config.seed)
        self.loss = make_loss(config.loss, config.loss_kwargs()).to(self.device)
        self.loss_traits = loss_traits(self.loss, config.loss)
        self.model_config = ModelConfig(  # the loss declares the similarity its scores use
            feature_dim=self.source.feature_dim, embed_dim=config.embed_dim, img_norm=config.img_norm,
            similarity=self.loss_traits.similarity, projection=config.projection,
            **self.captions.model_fields(config))
        self.model = VSEModel(self.model_config, self.source.backbone).to(self.device)
        if self.distributed and config.finetune and not config.freeze_bn and self.device.type == "cuda":
            # BatchNorm statistics of the global batch, as one process with N×B would compute
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        if init_state is not None:
            self._init_from(init_state)
        elif config.glove:
            self._load_glove()
        self.relevance = self._relevance()
        # a loss's own parameters (e.g. a learnable temperature) train with the head
        self.loss_parameters = [q for q in self.loss.parameters() if q.requires_grad]
        self.trainable = [q for q in self.model.parameters() if q.requires_grad] + self.loss_parameters
        self.optimizer = torch.optim.Adam(self._param_groups(), lr=config.lr,
                                          fused=config.adam_kernel == "fused" or None)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer,
                                                         step_size=max(1, config.lr_decay_epoch),
                                                         gamma=config.lr_decay)
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=needs_grad_scaler(self.device, config.amp))
        self.progress = Progress()
        self.monitor = CollapseMonitor(self.loss_traits, config.batch_size * self.world, self.echo)
        # No device_ids: DDP would move every input to the GPU, the caption lengths too, which
        # pack_padded_sequence then copies back (a host sync); the batch is on its device already.
        # Buffers change only in BatchNorm layers that train their statistics.
        self.ddp_model = (DistributedDataParallel(self.model, device_ids=None,
                                                  forward_sync_buffers=(config.finetune
                                                                        and not config.freeze_bn))
                          if self.distributed else self.model)
        if resume_state is not None:
            self._restore(resume_state)

    # ----------------------------------------------------------------- set-up helpers
    def _resume_state(self, config: TrainConfig, given) -> tuple[dict, TrainConfig]:
        """last.pt and the effective config: the run's own, with the options in ``given`` as
        the user set them; VseError if one outside RESUME_MAY_CHANGE differs from the run's."""
        last = self.run_dir / "last.pt"
        if not last.exists():
            raise VseError("--resume given but the run has no last.pt", self.run_dir)
        self.lock.acquire()  # no other process may write the run while it is read and continued
        state = load_checkpoint(last)
        config, _, kept = resume_config(state["train_config"], config, given, last)
        if kept:
            self.echo(f"resuming with {', '.join(kept)}")
        return state, config

    def _check_world_size(self, state: dict) -> None:
        """The global batch (and so each pair's place in it) depends on the number of processes."""
        saved = int(state.get("world_size", 1))  # checkpoints before world_size: one process
        if saved != self.world:
            raise VseError(f"--resume with {self.world} process(es), but the run was trained with {saved}: "
                           f"the global batch and the order of pairs depend on it", self.run_dir / "last.pt")

    def _caption_encoder(self, resume_state, init_state) -> CaptionEncoder:
        """Frozen caption vectors (--text-features) or the GRU's tokens (a resumed run keeps its
        text_features option: ``_resume_state`` refuses a change; the file itself must still
        hold the vectors the run was trained on)."""
        saved = resume_state.get("text_features") if resume_state is not None else None
        if self.cfg.text_features:
            return CachedCaptionVectors.open(self.cfg.text_features, self.index.captions,
                                             self.source.location, expected=saved,
                                             checkpoint=self.run_dir / "last.pt")
        vocab = self._vocabulary(resume_state or init_state)
        return GRUCaptions(vocab, self.index.captions, self.cfg.max_caption_tokens)

    def _vocabulary(self, state) -> Vocabulary:
        if state is not None and state["vocab"]:  # (a run on caption features has none)
            return Vocabulary(state["vocab"])
        captions = self.index.captions  # the vocabulary of the training captions
        return Vocabulary.build((captions[j] for j in self.train_captions), self.cfg.min_word_count)

    def _init_from(self, state: dict) -> None:
        """The head (projection + text encoder) of any run, cached or RC; the CNN too when
        the checkpoint is an RC run of the same backbone."""
        own = self.model.head_state_dict()
        weights = {k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape}
        skipped = sorted(set(own) - set(weights))
        self.model.load_state_dict(weights, strict=False)
        message = f"initialised {len(weights)} tensors from {self.cfg.init_from}"
        backbone, saved = self.model.backbone, state.get("backbone")
        if backbone is not None:
            trained_on = saved["name"] if saved else state.get("feature_source", {}).get("backbone")
            if saved and saved["name"] == self.cfg.backbone:
                backbone.cnn.load_state_dict(saved["state"])
                message += " and its CNN"
            elif trained_on != self.cfg.backbone:
                self.echo(f"warning: {self.cfg.init_from} was trained on features of {trained_on!r}, "
                          f"not of backbone {self.cfg.backbone!r}")
        self.echo(message + (f"; kept fresh: {', '.join(skipped)}" if skipped else ""))

    def _param_groups(self) -> list[dict]:
        """The head at lr; a fine-tuned CNN in its own group at lr × backbone_lr_factor."""
        cnn = {id(q) for q in self.model.backbone.parameters()} if self.model.backbone is not None else set()
        groups = [{"params": [q for q in self.trainable if id(q) not in cnn], "lr": self.cfg.lr}]
        cnn_params = [q for q in self.trainable if id(q) in cnn]
        if cnn_params:
            groups.append({"params": cnn_params, "lr": self.cfg.lr * self.cfg.backbone_lr_factor})
        return groups

    def _load_glove(self) -> None:
        from .glove import vectors_for

        vectors, found = vectors_for(self.vocab.words)
        n = self.model.text_encoder.load_word_vectors(torch.from_numpy(vectors), torch.from_numpy(found))
        self.echo(f"GloVe initialised {n} of {len(self.vocab)} words")

    def _relevance(self):
        if not self.loss_traits.uses_relevance:
            return None
        if not self.cfg.relevance:
            raise VseError(f"loss {self.cfg.loss!r} needs --relevance FILE (made by `vse relevance`)")
        from .relevance import BatchRelevance

        return BatchRelevance(self.cfg.relevance, num_captions=len(self.index.captions),
                              caption_fingerprint=self.index.caption_fingerprint,
                              captions_from=self.source.location)

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(join_state(state["model"], state.get("backbone", {}).get("state")))
        if state.get("loss"):
            self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._restore_scaler(state.get("scaler") or {})
        self.progress = Progress(**state["progress"])
        set_rng_state(state["rng"], self.device, dist.rank())
        if dist.is_main():
            self._drop_metrics_after(self.progress.iteration)
        self.echo(f"resumed at epoch {self.progress.epoch + 1}, batch {self.progress.batch}, "
                  f"iteration {self.progress.iteration} (best rsum {self.progress.best_rsum:.2f})")

    def _restore_scaler(self, saved: dict) -> None:
        """The fp16 loss scale.  A run saved without loss scaling (CPU, bf16, --no-amp) saves
        ``{}``: resumed on an fp16 GPU its scale starts afresh; a saved scale is ignored by a
        run that does not scale (both continue, not bit for bit)."""
        if self.scaler.is_enabled() and saved:
            self.scaler.load_state_dict(saved)
        elif self.scaler.is_enabled():
            self.echo("note: the run was saved without fp16 loss scaling (CPU, bf16 or --no-amp); "
                      "the loss scale starts afresh")
        elif saved:
            self.echo("note: the run was saved with fp16 loss scaling, which this run does not use")

    def _drop_metrics_after(self, iteration: int) -> None:
        """A run killed between appending a validation record and saving last.pt would log
        that validation twice after --resume: keep only the records the checkpoint covers."""
        path = self.run_dir / "metrics.jsonl"
        lines = validation_log_lines(path)
        kept = [line for line, record in lines if record is not None and record["iteration"] <= iteration]
        if len(kept) != len(lines):
            with atomic_path(path) as tmp:
                Path(tmp).write_text("".join(kept), encoding="utf-8")

    # ----------------------------------------------------------------- the loop
    def epoch_batches(self, epoch: int) -> PairBatches:
        order = epoch_order(len(self.train_captions), self.cfg.seed, epoch)
        global_batch = self.cfg.batch_size * self.world
        slices = batch_slices(len(order), global_batch, drop_last=self.distributed)
        if self.distributed:  # this rank's part of every global batch
            r, b = dist.rank(), self.cfg.batch_size
            slices = [slice(s.start + r * b, s.start + (r + 1) * b) for s in slices]
        return PairBatches(self.source.inputs, self.captions, self.train_captions, self.index.caption_image,
                           order, slices, epoch)

    def loader(self, pairs: PairBatches, start: int):
        generator = torch.Generator().manual_seed(self.cfg.seed)  # keeps the global RNG untouched
        return torch.utils.data.DataLoader(
            pairs, batch_size=None, sampler=range(start, len(pairs)), num_workers=self.workers,
            pin_memory=pin_memory(self.device), generator=generator,
            persistent_workers=False)

    def fit(self) -> dict:
        """Train to the end, holding the run folder's lock (pipeline.runlock) throughout."""
        with self.lock:
            self.echo(self.setup_line)  # once the folder is ours: a refused second run says one line
            return self._fit()

    def _fit(self) -> dict:
        cfg, p = self.cfg, self.progress
        if dist.is_main():
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise VseError(f"cannot create the run folder ({exc.strerror})", self.run_dir) from exc
            remove_stale_temporaries(self.run_dir)
            with atomic_path(self.run_dir / "config.json") as tmp:
                Path(tmp).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
            self.captions.save(self.run_dir)
        self.model.train()
        while p.epoch < cfg.epochs:
            self.train_epoch()
            p.epoch, p.batch = p.epoch + 1, 0
            self.scheduler.step()
            self.validate_and_save()
        return {"best_rsum": p.best_rsum, "best_epoch": p.best_epoch, "iterations": p.iteration}

    def train_epoch(self) -> int:
        """Train from the current position to the end of the epoch; returns the pairs seen."""
        cfg, p = self.cfg, self.progress
        if hasattr(self.loss, "set_epoch"):
            self.loss.set_epoch(p.epoch)
        pairs = self.epoch_batches(p.epoch)
        bar = _progress_bar(len(pairs), p.batch, f"epoch {p.epoch + 1}/{cfg.epochs}")
        started, seen = time.perf_counter(), 0
        for batch in self.loader(pairs, p.batch):
            if isinstance(batch, LoadFailure):
                raise batch.error()
            loss = self.step(batch)
            self.monitor.update(loss)
            p.batch += 1
            p.iteration += 1
            seen += len(batch.caption_ids) * self.world
            if bar is not None:
                bar.update(1)
                if p.iteration % cfg.log_every == 0:
                    bar.set_postfix(loss=f"{loss:.3f}",
                                    pairs_s=f"{seen / (time.perf_counter() - started):.0f}")
            if cfg.val_every and p.iteration % cfg.val_every == 0 and p.batch < len(pairs):
                self.validate_and_save()
        if bar is not None:
            bar.close()
        return seen

    def step(self, batch: Batch) -> float:
        """One optimizer step; returns the loss.  One host sync: reading the loss after the
        optimizer step, which also tells whether it was finite — a non-finite loss stops the
        run right there, before anything (validation, checkpoint) sees the weights it made."""
        batch = batch.to(self.device)  # the lengths stay on the CPU
        with autocast(self.device, self.cfg.amp):
            img, cap = self.ddp_model(batch.images, *batch.captions)
        img, cap = dist.gather_with_grad(img.float()), dist.gather_with_grad(cap.float())
        image_ids = _gather_ids(batch.image_ids)
        caption_ids = _gather_ids(batch.caption_ids)
        relevance = self.relevance(caption_ids) if self.relevance is not None else None
        loss = self.loss(img, cap, image_ids=image_ids, relevance=relevance)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over ranks; every rank computed the loss of the whole global
        # batch, so scaling by the world size gives the gradient of that one loss.
        self.scaler.scale(loss * self.world).backward()
        if self.world > 1:  # the loss's own parameters: every rank holds world × the full gradient
            for q in self.loss_parameters:
                if q.grad is not None:
                    q.grad.div_(self.world)
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            clip_gradients(self.trainable, self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        value = loss.item()
        if not math.isfinite(value):
            raise VseError(f"loss became {value} at epoch {self.progress.epoch + 1}, iteration "
                           f"{self.progress.iteration + 1}; lower --lr, or check the features for NaNs "
                           f"(`vse info` checks a cache)", self.source.location)
        return value

    # ----------------------------------------------------------------- validation, checkpoints
    def validate(self) -> dict:
        # in fp32 as `vse evaluate`: metrics.jsonl and an evaluation of best.pt agree
        emb = encode_split(self.model, self.index, self.captions, self.cfg.val_split, self.device,
                           max_images=self.cfg.val_images, batch_size=self.source.encode_batch_size)
        return evaluate_embeddings(emb.images, emb.captions, emb.caption_image,
                                   order=self.model_config.similarity)

    def validate_and_save(self) -> None:
        p = self.progress
        metrics = self.validate() if dist.is_main() else None
        rng = self.rng_state()  # every rank: it gathers each rank's CUDA generator
        if dist.is_main():
            epoch = p.epoch + (p.batch > 0)  # 1-based epoch this validation belongs to
            improved = metrics["rsum"] > p.best_rsum
            if improved:
                p.best_rsum, p.best_epoch = metrics["rsum"], epoch
            record = {"epoch": epoch, "iteration": p.iteration, "split": self.cfg.val_split,
                      "lr": self.optimizer.param_groups[0]["lr"], "time": time.time(), **metrics}
            self._append_metrics(record)
            self.echo(f"[epoch {record['epoch']} it {p.iteration}] rsum {metrics['rsum']:.2f}  "
                      f"i2t R@1 {metrics['i2t_r1']:.1f}  t2i R@1 {metrics['t2i_r1']:.1f}"
                      + ("  (best)" if improved else ""))
            state = self.state_dict(rng)
            if improved:
                save_checkpoint({**state, "metrics": metrics}, self.run_dir / "best.pt")
            save_checkpoint(state, self.run_dir / "last.pt")
        dist.barrier()

    def _append_metrics(self, record: dict) -> None:
        """Rewritten whole and atomically (it is small): a full disk leaves the previous
        file intact, never a torn last line."""
        path = self.run_dir / "metrics.jsonl"
        old = path.read_bytes() if path.exists() else b""
        write_atomic(path, old + (json.dumps(record) + "\n").encode("utf-8"))

    def rng_state(self) -> dict:
        """The RNG states of a checkpoint, each rank's CUDA generator included (a collective
        under torchrun on GPUs: every rank calls it)."""
        own = device_rng_state(self.device)
        return rng_state(dist.all_gather_object(own) if own is not None else None)

    def state_dict(self, rng: dict | None = None) -> dict:
        """``rng``: from ``rng_state()`` called by every rank; by default this process's only."""
        backbone = self.model.backbone
        return {
            "model": self.model.head_state_dict(),
            **({"backbone": self.source.checkpoint_entry(backbone)} if backbone is not None else {}),
            "model_config": self.model_config.to_dict(),
            **({"loss": self.loss.state_dict()} if self.loss.state_dict() else {}),
            **self.captions.checkpoint_entry(),  # the vocabulary, or the caption features
            "train_config": self.cfg.to_dict(),
            "world_size": self.world,
            "feature_source": self.source.feature_source,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": asdict(self.progress),
            "epoch": self.progress.epoch,
            "iteration": self.progress.iteration,
            "rng": rng if rng is not None else rng_state([device_rng_state(self.device)]),
        }


def clip_gradients(parameters: list[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` (VSE++'s clipping), bit for bit, without its multiply
    of every gradient by 1.0 when the norm is within ``max_norm``: that multiply only spares
    GPUs a host sync, and on a CPU it was a pass over all the gradients at every step."""
    total = torch.nn.utils.get_total_norm([q.grad for q in parameters if q.grad is not None])
    if total.device.type == "cpu" and bool(max_norm / (total + 1e-6) >= 1.0):  # torch's coefficient
        return
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)


def open_pair_source(cfg: TrainConfig) -> PairSource:
    if not cfg.rc:  # with caption features too, both sides of training sit in memory
        return CachedFeatures(cfg.features, preload=cfg.preload or bool(cfg.text_features))
    from .rc import ImageSource  # torchvision and the image stack: only RC mode pays their import

    return ImageSource(cfg.dataset, cfg.root, cfg.backbone, weights=cfg.backbone_weights,
                       finetune=cfg.finetune, freeze_bn=cfg.freeze_bn, crop=cfg.crop, seed=cfg.seed,
                       batch_size=cfg.batch_size, dataset_options=cfg.dataset_options())


class CollapseMonitor:
    """Warns when the loss sits at its collapse value (all embeddings equal), as the loss
    declares it (``collapse_value``; max-of-hinges: 2·B·margin)."""

    def __init__(self, traits, global_batch: int, echo, patience: int = 200):
        self.value = traits.collapse_value(global_batch) if traits.collapse_value else None
        self.patience, self.count, self.warned, self.echo = patience, 0, False, echo

    def update(self, loss: float) -> None:
        if self.value is None or self.warned:
            return
        self.count = self.count + 1 if abs(loss - self.value) < 0.01 * self.value else 0
        if self.count >= self.patience:
            self.warned = True
            message = (f"the max-of-hinges loss has sat at its collapse value {self.value:.1f} for "
                       f"{self.patience} iterations: all embeddings are nearly equal. Start with "
                       f"sum-of-hinges: --warmup-epochs 1 (or 2)")
            warnings.warn(message, stacklevel=2)
            self.echo("warning: " + message)


def _gather_ids(ids: torch.Tensor) -> torch.Tensor:
    if not dist.is_distributed():
        return ids
    return dist.gather_with_grad(ids)


def _progress_bar(total: int, initial: int, desc: str):
    if not dist.is_main():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="it", leave=False, dynamic_ncols=True,
                disable=None)  # no bar when stderr is not a terminal (logs, CI)
