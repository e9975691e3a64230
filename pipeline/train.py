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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from . import distributed as dist
from .batches import Batch, CachedFeatures, LoadFailure, PairBatches, PairSource, batch_slices, epoch_order
from .captions import CachedCaptionVectors, CaptionEncoder, GRUCaptions
from .checkpoint import load_checkpoint, save_checkpoint
from .errors import VseError
from .fsutil import atomic_path, remove_stale_temporaries, write_atomic
from .inference import encode_split
from .losses import build_loss
from .metrics import evaluate_embeddings
from .models import PROJECTIONS, ModelConfig, VSEModel, join_state
from .runtime import (autocast, default_workers, needs_grad_scaler, pin_memory, resolve_device,
                      rng_state, seed_everything, set_rng_state)
from .text import Vocabulary

CONTRASTIVE = ("csn", "cmn", "mvn")


@dataclass
class TrainConfig:
    """Every option of a run. Defaults are the VSE++ paper's (Faghri et al. 2018)."""

    features: str = ""                  # feature cache (cached mode)
    run_dir: str = ""
    rc: bool = False                     # RC mode: images → crops → CNN every step
    dataset: str = "flickr8k"            # RC: dataset kind and folder (pipeline.datasets)
    root: str = ""
    backbone: str = "efficientnet-lite0"  # RC: the CNN (pipeline.backbones)
    backbone_weights: str | None = None
    finetune: bool = False               # RC: train the CNN too (else frozen)
    backbone_lr_factor: float = 1.0      # RC --finetune: CNN lr = lr × this
    freeze_bn: bool = True               # RC --finetune: keep BatchNorm statistics fixed
    crop: str = "random"                 # RC training crop: "random" | "random-resized"
    loss: str = "mh"
    margin: float | None = None          # None = the loss's own default (PROTOCOL.md)
    loss_options: dict = field(default_factory=dict)
    relevance: str | None = None         # relevance file for lseh / ladder
    epochs: int = 30
    batch_size: int = 128                # per process; the global batch is world_size × this
    lr: float = 2e-4
    lr_decay_epoch: int = 15
    lr_decay: float = 0.1
    grad_clip: float = 2.0
    embed_dim: int = 1024
    word_dim: int = 300
    glove: bool = False                  # initialise word embeddings from GloVe 6B-50d
    min_word_count: int = 4
    max_caption_tokens: int = 100
    img_norm: bool = True
    projection: str = "linear"           # "mlp" = ConVSE heads
    text_features: str | None = None     # caption-feature file (`vse encode-text`): a head over
    text_projection: str = "linear"      # these frozen vectors replaces the GRU ("linear" | "mlp")
    train_split: str = "train"
    val_split: str = "dev"
    val_images: int = 1000
    val_every: int = 500                 # iterations; validation also runs at each epoch end
    seed: int = 0
    workers: int | None = None           # loader processes; None: 0 cached, all cores but one RC
    preload: bool = False                # load the whole feature array into RAM
    device: str = "auto"
    amp: bool = True
    init_from: str | None = None
    log_every: int = 10

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise VseError(f"unknown training option(s): {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        """Options that only make sense together (VseError otherwise)."""
        if self.rc:
            if not self.root:
                raise VseError("--rc needs --root, the dataset folder")
            if self.features:
                raise VseError("--rc reads images: give --features (cached) or --rc, not both")
            if self.preload:
                raise VseError("--preload loads a feature cache; it does not apply to --rc")
        else:
            if not self.features:
                raise VseError("--features is required (or --rc with --dataset and --root)")
            if self.finetune:
                raise VseError("--finetune needs --rc: a feature cache has no CNN to train")
        if self.text_features and self.glove:
            raise VseError("--glove initialises the GRU's word embeddings; with --text-features "
                           "there is no GRU")
        if self.text_projection not in PROJECTIONS:
            raise VseError(f"--text-projection must be one of {', '.join(PROJECTIONS)}, "
                           f"not {self.text_projection!r}")

    @property
    def similarity(self) -> str:
        return "order" if self.loss == "order" else "cosine"

    def loss_kwargs(self) -> dict:
        kwargs = dict(self.loss_options)
        if self.margin is not None:
            kwargs["margin"] = self.margin
        return kwargs


@dataclass
class Progress:
    epoch: int = 0            # current epoch (0-based)
    batch: int = 0            # next batch within the epoch
    iteration: int = 0        # optimizer steps done
    best_rsum: float = -math.inf
    best_epoch: int = -1


class Trainer:
    """Owns the model, optimizer and data of one run. ``fit()`` trains to the end."""

    def __init__(self, config: TrainConfig, resume: bool = False, echo=print):
        config.check()
        self.cfg = config
        self.echo = echo if dist.is_main() else (lambda *a, **k: None)
        self.run_dir = Path(config.run_dir)
        self.device = resolve_device(config.device)
        self.distributed = dist.init_from_env(self.device)
        self.world = dist.world_size()
        resume_state = self._resume_state() if resume else None

        self.source = open_pair_source(config)
        self.index = self.source.index
        self.workers = config.workers if config.workers is not None else (default_workers() if config.rc else 0)
        init_state = load_checkpoint(config.init_from) if config.init_from else None
        self.captions = self._caption_encoder(resume_state, init_state)
        self.vocab = self.captions.vocab  # None with cached caption features
        train_images = self.index.split(config.train_split)
        self.train_captions = np.flatnonzero(np.isin(self.index.caption_image, train_images))
        if len(self.train_captions) == 0:
            raise VseError(f"split {config.train_split!r} has no captions", self.source.location)
        if len(self.index.split(config.val_split)) == 0:  # fail now, not after the first epoch
            raise VseError(f"validation split {config.val_split!r} has no images", self.source.location)

        seed_everything(config.seed)
        self.model_config = ModelConfig(
            feature_dim=self.source.feature_dim, embed_dim=config.embed_dim, img_norm=config.img_norm,
            similarity=config.similarity, projection=config.projection, **self.captions.model_fields(config))
        self.model = VSEModel(self.model_config, self.source.backbone).to(self.device)
        if self.distributed and config.finetune and not config.freeze_bn and self.device.type == "cuda":
            # BatchNorm statistics of the global batch, as one process with N×B would compute
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        if init_state is not None:
            self._init_from(init_state)
        elif config.glove:
            self._load_glove()
        try:
            self.loss = build_loss(config.loss, **config.loss_kwargs())
        except ValueError as exc:
            raise VseError(str(exc)) from exc
        self.relevance = self._relevance()
        self.trainable = [q for q in self.model.parameters() if q.requires_grad]
        self.optimizer = torch.optim.Adam(self._param_groups(), lr=config.lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=max(1, config.lr_decay_epoch),
                                                         gamma=config.lr_decay)
        self.scaler = torch.amp.GradScaler("cuda", enabled=needs_grad_scaler(self.device, config.amp))
        self.progress = Progress()
        self.monitor = CollapseMonitor(config.loss, self.loss, config.batch_size * self.world, self.echo)
        # buffers change only in BatchNorm layers that train their statistics
        self.ddp_model = (DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                                  forward_sync_buffers=config.finetune and not config.freeze_bn)
                          if self.distributed else self.model)
        if resume_state is not None:
            self._restore(resume_state)

    # ----------------------------------------------------------------- set-up helpers
    def _resume_state(self):
        last = self.run_dir / "last.pt"
        if not last.exists():
            raise VseError("--resume given but the run has no last.pt", self.run_dir)
        state = load_checkpoint(last)
        saved = TrainConfig.from_dict(state["train_config"])
        for key in ("features", "rc", "dataset", "backbone", "finetune", "crop", "loss", "batch_size",
                    "seed", "embed_dim", "train_split"):
            if getattr(saved, key) != getattr(self.cfg, key):
                raise VseError(f"--resume with a different {key} ({getattr(self.cfg, key)!r}) than the run "
                               f"was started with ({getattr(saved, key)!r})", last)
        return state

    def _caption_encoder(self, resume_state, init_state) -> CaptionEncoder:
        """Frozen caption vectors (--text-features) or the GRU's tokens; a resumed run must
        keep the caption side it was started with."""
        saved = resume_state.get("text_features") if resume_state is not None else None
        if resume_state is not None and bool(saved) != bool(self.cfg.text_features):
            started = f"with {saved['path']}" if saved else "without"
            raise VseError(f"--resume {'without' if saved else 'with'} --text-features, but the run was "
                           f"started {started}", self.run_dir / "last.pt")
        if self.cfg.text_features:
            return CachedCaptionVectors.open(self.cfg.text_features, self.index.captions,
                                             self.source.location, expected=saved,
                                             checkpoint=self.run_dir / "last.pt")
        vocab = self._vocabulary(resume_state or init_state)
        return GRUCaptions(vocab, self.index.captions, self.cfg.max_caption_tokens)

    def _vocabulary(self, state) -> Vocabulary:
        if state is not None and state["vocab"]:  # (a run on caption features has none)
            return Vocabulary(state["vocab"])
        train_images = self.index.split(self.cfg.train_split)
        caption_rows = np.flatnonzero(np.isin(self.index.caption_image, train_images))
        captions = self.index.captions
        return Vocabulary.build((captions[j] for j in caption_rows), self.cfg.min_word_count)

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
        if not getattr(self.loss, "uses_relevance", False):
            return None
        if not self.cfg.relevance:
            raise VseError(f"loss {self.cfg.loss!r} needs --relevance FILE (made by `vse relevance`)")
        from .relevance import BatchRelevance

        return BatchRelevance(self.cfg.relevance, num_captions=len(self.index.captions))

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(join_state(state["model"], state.get("backbone", {}).get("state")))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        set_rng_state(state["rng"])
        if dist.is_main():
            self._drop_metrics_after(self.progress.iteration)
        self.echo(f"resumed at epoch {self.progress.epoch + 1}, batch {self.progress.batch}, "
                  f"iteration {self.progress.iteration} (best rsum {self.progress.best_rsum:.2f})")

    def _drop_metrics_after(self, iteration: int) -> None:
        """A run killed between appending a validation record and saving last.pt would log
        that validation twice after --resume: keep only the records the checkpoint covers."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if line.strip() and json.loads(line)["iteration"] <= iteration]
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
                    bar.set_postfix(loss=f"{loss:.3f}", pairs_s=f"{seen / (time.perf_counter() - started):.0f}")
            if cfg.val_every and p.iteration % cfg.val_every == 0 and p.batch < len(pairs):
                self.validate_and_save()
        if bar is not None:
            bar.close()
        return seen

    def step(self, batch: Batch) -> float:
        batch = batch.to(self.device)
        with autocast(self.device, self.cfg.amp):
            img, cap = self.ddp_model(batch.images, *batch.captions)
        img, cap = dist.gather_with_grad(img.float()), dist.gather_with_grad(cap.float())
        image_ids = _gather_ids(batch.image_ids)
        caption_ids = _gather_ids(batch.caption_ids)
        relevance = self.relevance(caption_ids) if self.relevance is not None else None
        loss = self.loss(img, cap, image_ids=image_ids, relevance=relevance)
        if not torch.isfinite(loss):
            raise VseError(f"loss became {loss.item()} at epoch {self.progress.epoch + 1}, iteration "
                           f"{self.progress.iteration + 1}; lower --lr, or check the features for NaNs "
                           f"(`vse info` checks a cache)", self.source.location)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over ranks; every rank computed the loss of the whole global
        # batch, so scaling by the world size gives the gradient of that one loss.
        self.scaler.scale(loss * self.world).backward()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.trainable, self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item()

    # ----------------------------------------------------------------- validation, checkpoints
    def validate(self) -> dict:
        emb = encode_split(self.model, self.index, self.captions, self.cfg.val_split, self.device,
                           max_images=self.cfg.val_images, batch_size=self.source.encode_batch_size,
                           amp=self.cfg.amp)
        return evaluate_embeddings(emb.images, emb.captions, emb.caption_image,
                                   order=self.cfg.similarity == "order")

    def validate_and_save(self) -> None:
        p = self.progress
        metrics = self.validate() if dist.is_main() else None
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
            state = self.state_dict()
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

    def state_dict(self) -> dict:
        backbone = self.model.backbone
        return {
            "model": self.model.head_state_dict(),
            **({"backbone": self.source.checkpoint_entry(backbone)} if backbone is not None else {}),
            "model_config": self.model_config.to_dict(),
            **self.captions.checkpoint_entry(),  # the vocabulary, or the caption features
            "train_config": self.cfg.to_dict(),
            "feature_source": self.source.feature_source,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": asdict(self.progress),
            "epoch": self.progress.epoch,
            "iteration": self.progress.iteration,
            "rng": rng_state(),
        }


def open_pair_source(cfg: TrainConfig) -> PairSource:
    if not cfg.rc:  # with caption features too, both sides of training sit in memory
        return CachedFeatures(cfg.features, preload=cfg.preload or bool(cfg.text_features))
    from .rc import ImageSource  # torchvision and the image stack: only RC mode pays their import

    return ImageSource(cfg.dataset, cfg.root, cfg.backbone, weights=cfg.backbone_weights, finetune=cfg.finetune,
                       freeze_bn=cfg.freeze_bn, crop=cfg.crop, seed=cfg.seed, batch_size=cfg.batch_size)


class CollapseMonitor:
    """Warns when max-of-hinges sits at its collapse value 2·B·margin (all embeddings equal)."""

    def __init__(self, loss_name: str, loss, global_batch: int, echo, patience: int = 200):
        margin = getattr(loss, "margin", None)
        self.value = 2 * global_batch * margin if loss_name in ("mh", "lseh") and margin else None
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
