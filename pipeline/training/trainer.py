"""The training loop: batches → model → loss → optimizer; validation; checkpoints; exact
resume; torchrun (DDP) with hard negatives mined over the global batch.

One loop serves both modes; they differ only in the pair source (``batches``): cached
features, or images whose crops go through the CNN every step (RC mode, ``rc``), frozen or
fine-tuned.  Under torchrun every rank embeds its B pairs, the embeddings are gathered with
gradient and every rank computes the loss of the whole global batch of N×B pairs, so each
loss — hardest negatives included — sees what a single process with batch N×B would.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import torch

from pipeline.core import code_identity, precision
from pipeline.core import distributed as dist
from pipeline.core.checkpoint import save_checkpoint
from pipeline.core.config import recorded_config
from pipeline.core.errors import VseError
from pipeline.core.runtime import (
    autocast,
    device_rng_state,
    pin_memory,
    rng_state,
    set_rng_state,
)
from pipeline.data.batches import Batch, LoadFailure, PairBatches, batch_slices, epoch_order
from pipeline.evaluation.inference import encode_split
from pipeline.evaluation.metrics import evaluate_embeddings
from pipeline.networks.vse_model import join_state
from pipeline.training.parts import RunParts


@dataclass
class Progress:
    epoch: int = 0            # current epoch (0-based)
    batch: int = 0            # next batch within the epoch
    iteration: int = 0        # optimizer steps done
    best_rsum: float = -math.inf
    best_epoch: int = -1


def _parts(group: str | None, *names: str) -> tuple[property, ...] | property:
    """Views of the Trainer's parts (``RunParts``, by group): read through ``self.parts``, never
    copied; assigning one replaces the part (a test may swap the loss)."""
    def view(name: str) -> property:
        def owner(trainer):
            return trainer.parts if group is None else getattr(trainer.parts, group)

        return property(lambda self: getattr(owner(self), name),
                        lambda self, value: setattr(owner(self), name, value),
                        doc=f"``parts.{group + '.' if group else ''}{name}``")

    views = tuple(view(name) for name in names)
    return views[0] if len(views) == 1 else views


class Trainer:
    """The loop of one run: fit, step, validate, and the state a checkpoint holds. It is handed
    its parts (``training.parts.RunParts``, built by ``training.build.build_run``; ``build_trainer``
    builds both in one call) and keeps them, reading each through the views below; its files go
    through the run folder (``RunFolder``), which it asks before it trains."""

    cfg, run, echo, settings, file_identity, curves = _parts(
        None, "config", "run", "echo", "settings", "file_identity", "curves")
    device, distributed, world, train_dtype, setup_line = _parts(
        "runtime", "device", "distributed", "world", "train_dtype", "setup_line")
    source, captions, train_captions, train_caption_image, noise, workers = _parts(
        "data", "source", "captions", "train_captions", "train_caption_image", "noise", "workers")
    loss, loss_traits, relevance = _parts("objective", "loss", "loss_traits", "relevance")
    model, ddp_model, pairwise = _parts("network", "model", "ddp_model", "pairwise")
    optimizer, scheduler, scaler, trainable, loss_parameters = _parts(
        "optimization", "optimizer", "scheduler", "scaler", "trainable", "loss_parameters")
    loop = _parts("settings", "loop")  # epochs, batch (per process), seed, validation

    def __init__(self, parts: RunParts):
        self.parts = parts
        self.progress = Progress()
        self.auxiliary: dict = {}  # the network's own loss terms of the last step
        self.loss_after_step = getattr(self.loss, "after_step", None)
        self.monitor = CollapseMonitor(self.loss_traits, self.loop.batch_size * self.world, self.echo)
        self.division: dict = {}  # a dividing method's last division of the training pairs, measured
        if callable(getattr(self.loss, "prepare", None)):  # per-sample state: one entry per caption id
            self.loss.prepare(len(self.index.captions))
        if parts.resume_state is not None:
            self.load_state_dict(parts.resume_state)

    @property
    def index(self):
        return self.source.index  # image ids, captions, caption → image, splits

    @property
    def vocab(self):
        return self.captions.vocab  # None with cached caption features

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule, scaler, position, RNGs."""
        self.model.load_state_dict(join_state(state["model"], state.get("backbone", {}).get("state")))
        if state.get("loss"):
            self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._restore_scaler(state.get("scaler") or {})
        self.progress = Progress(**state["progress"])
        self.division = dict(state.get("division") or {})
        set_rng_state(state["rng"], self.device, dist.rank())
        if dist.is_main():
            self.run.trim_records(self.progress.iteration)
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

    # ----------------------------------------------------------------- the loop
    def epoch_batches(self, epoch: int) -> PairBatches:
        order = epoch_order(len(self.train_captions), self.loop.seed, epoch)
        global_batch = self.loop.batch_size * self.world
        slices = batch_slices(len(order), global_batch, drop_last=self.distributed)
        if self.distributed:  # this rank's part of every global batch
            r, b = dist.rank(), self.loop.batch_size
            slices = [slice(s.start + r * b, s.start + (r + 1) * b) for s in slices]
        return self._pair_batches(order, slices, epoch)

    def _pair_batches(self, order: np.ndarray, slices: list[slice], epoch: int) -> PairBatches:
        """The training pairs ``order[s]`` for each slice s, as loader items."""
        return PairBatches(self.source.inputs, self.captions, self.train_captions, self.train_caption_image,
                           order, slices, epoch)

    def loader(self, pairs: PairBatches, start: int):
        generator = torch.Generator().manual_seed(self.loop.seed)  # keeps the global RNG untouched
        return torch.utils.data.DataLoader(
            pairs, batch_size=None, sampler=range(start, len(pairs)), num_workers=self.workers,
            pin_memory=pin_memory(self.device), generator=generator,
            persistent_workers=False)

    def fit(self) -> dict:
        """Train to the end, holding the run folder (its lock: pipeline.core.runlock) throughout;
        the folder checks first that the run may begin there (a run already here is refused, or
        replaced; a resumed build or the command's claim has asked already)."""
        with self.run.held():
            self.echo(self.setup_line)  # once the folder is ours: a refused second run says one line
            try:
                return self._fit()
            finally:
                self.curves.close()

    def _fit(self) -> dict:
        p = self.progress
        if dist.is_main():
            # config.json: the resolved config. The files' writer holds the parts it writes, not the
            # Trainer: a bound method here made a cycle (parts -> run folder -> Trainer -> parts) that kept
            # a finished run's data and model alive until the next full garbage collection (issue 49)
            files = functools.partial(write_run_files, self.captions, self.noise)
            config = recorded_config(self.cfg, self.parts.runtime.precision, self.device.type)  # as applied
            self.run.prepare(config, files, code=self.parts.code_identity)
        self.model.train()
        while p.epoch < self.loop.epochs:
            self.train_epoch()
            p.epoch, p.batch = p.epoch + 1, 0
            self.scheduler.step()
            self.validate_and_save()
        return {"best_rsum": p.best_rsum, "best_epoch": p.best_epoch, "iterations": p.iteration}

    def train_epoch(self) -> int:
        """Train from the current position to the end of the epoch; returns the pairs seen."""
        loop, p = self.loop, self.progress
        if hasattr(self.loss, "set_epoch"):
            self.loss.set_epoch(p.epoch)
        if self.loss_traits.sample_pass and p.batch == 0:  # mid-epoch, the checkpoint holds its result
            self.begin_epoch()
        plan = self.epoch_plan()
        pairs = self.epoch_batches(p.epoch) if plan is None else self.planned_batches(plan)
        bar = _progress_bar(len(pairs), p.batch, f"epoch {p.epoch + 1}/{loop.epochs}")
        started, seen = time.perf_counter(), 0
        logged = (started, p.iteration)
        for batch in self.loader(pairs, p.batch):
            if isinstance(batch, LoadFailure):
                raise batch.error()
            loss = self.step(batch)
            self.monitor.update(loss)
            p.batch += 1
            p.iteration += 1
            seen += _pairs_in(batch) * self.world
            if bar is not None:
                bar.update(1)
            if p.iteration % self.settings.logging.log_every == 0:
                now = time.perf_counter()
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.3f}", pairs_s=f"{seen / (now - started):.0f}")
                self._log_step(loss, (p.iteration - logged[1]) / max(now - logged[0], 1e-9))
                logged = (now, p.iteration)
            if loop.val_every and p.iteration % loop.val_every == 0 and p.batch < len(pairs):
                self.validate_and_save()
        if bar is not None:
            bar.close()
        if plan is not None:
            self.model.train()  # a phase left the fixed networks in eval mode
        return seen

    def epoch_plan(self) -> list | None:
        """The loss's phases of this epoch (``NoisyPairLoss.epoch_plan``: which network trains, on
        which streams of pairs), or None: every step trains the whole model on a batch of every
        pair. A plan trains one of the co-trained networks at a time (``CoTrained.train_member``)."""
        planner = getattr(self.loss, "epoch_plan", None)
        plan = planner(self.progress.epoch, self.loop.epochs, self.train_captions) if planner else None
        if plan is not None and not hasattr(self.model, "train_member"):
            raise VseError(f"loss {self.settings.loss.name} plans its epochs network by network, but the "
                           "model is not co-trained networks (declare networks >= 2)")
        return plan

    def planned_batches(self, plan: list) -> PlannedBatches:
        """The steps of a plan's phases, one after another (``PlannedBatches``)."""
        phases = []
        for p, phase in enumerate(plan):
            first = self._stream(phase.streams[0], p, 0, 1) if len(phase.streams) else None
            steps = len(first[1]) if first is not None else 0
            later = [self._stream(positions, p, s, steps) for s, positions in enumerate(phase.streams) if s]
            phases.append([None if stream is None else self._pair_batches(*stream, self.progress.epoch)
                           for stream in (first, *later)])
        return PlannedBatches(plan, phases)

    def _stream(self, positions: np.ndarray, phase: int, stream: int, steps: int):
        """(order, slices) of one stream of a phase, or None (no batch): the positions in an order
        drawn from (seed, epoch, phase, stream, cycle), in batches of the global batch (this rank's
        part under torchrun); stream 0 once, a later one as many times over as ``steps`` take, each
        time drawn afresh."""
        positions, epoch = np.asarray(positions), self.progress.epoch
        n = len(positions)
        cycle = batch_slices(n, self.loop.batch_size * self.world, drop_last=self.distributed)
        if not cycle:
            return None
        if self.distributed:  # this rank's part of every global batch
            r, b = dist.rank(), self.loop.batch_size
            cycle = [slice(s.start + r * b, s.start + (r + 1) * b) for s in cycle]
        cycles = 1 if stream == 0 else max(1, -(-steps // len(cycle)))
        orders, slices = [], []
        for c in range(cycles):
            rng = np.random.default_rng([self.loop.seed, epoch, 2000 + phase, stream, c])
            orders.append(positions[rng.permutation(n)])
            slices += [slice(s.start + c * n, s.stop + c * n) for s in cycle]
        return np.concatenate(orders), slices

    def begin_epoch(self) -> None:
        """A method's look at every training pair before the epoch (``sample_pass``: NCR's
        co-divide, DECL's uncertainties): the networks in eval mode over the training pairs in
        cache order, batches of the run's size; its division measured against the noise index."""
        p = self.progress
        statistics = self.sample_statistics()
        division = self.loss.begin_epoch(p.epoch, self.train_captions, statistics, self.loop.seed)
        self.division = {}
        if division is not None:
            from pipeline.losses.noisy.base import division_metrics

            clean = (self.train_caption_image[self.train_captions]
                     == self.index.caption_image[self.train_captions])
            self.division = division_metrics(division[0], division[1], clean)
            for name, value in self.division.items():
                if value is not None:
                    self.curves.scalar(f"division/{name.removeprefix('division_')}", value, p.iteration,
                                       hold=True)
            self.echo(f"[epoch {p.epoch + 1}] division: " + "  ".join(
                f"{name.removeprefix('division_')} {value:.3f}" for name, value in self.division.items()
                if value is not None))

    @torch.no_grad()
    def sample_statistics(self) -> np.ndarray:
        """(rows, N): ``loss.sample_statistic`` of every training pair, in ``train_captions`` order,
        over batches of the run's batch size: fixed cache-order batches, or, for a loss that declares
        ``sample_pass_shuffled`` (NCR's pass reads the shuffled training loader), batches of an order
        drawn from (seed, epoch). Under torchrun the batches are dealt round-robin to the ranks and
        the results gathered, so every rank holds the same array as one process would make, for
        1/world of the work."""
        n = len(self.train_captions)
        shuffled = bool(getattr(self.loss, "sample_pass_shuffled", False))
        order = (np.random.default_rng([self.loop.seed, self.progress.epoch, 1000]).permutation(n) if shuffled
                 else np.arange(n))
        slices = batch_slices(len(order), self.loop.batch_size, drop_last=False)
        mine = dist.dealt(len(slices))
        pairs = self._pair_batches(order, [slices[i] for i in mine], self.progress.epoch)
        was_training = self.model.training
        self.model.eval()
        parts = []
        try:
            for batch in self.loader(pairs, 0):
                if isinstance(batch, LoadFailure):
                    raise batch.error()
                batch = batch.to(self.device)
                with autocast(self.device, self.train_dtype is not None, self.train_dtype):
                    out = self.model(batch.images, *batch.captions)
                if self.pairwise:
                    scores = out.float() if out.ndim == 3 else out.float()[None]
                else:
                    scores = self.loss.score_matrix(out[0].float(), out[1].float())[None]
                parts.append(self.loss.sample_statistic(scores, batch.image_ids).double().cpu().numpy())
        finally:
            self.model.train(was_training)
        every = dist.gather_dealt(dict(zip(mine, parts, strict=True)))
        gathered = np.concatenate([every[i] for i in range(len(slices))], axis=1)
        if not shuffled:
            return gathered
        statistics = np.empty_like(gathered)
        statistics[:, order] = gathered
        return statistics

    def step(self, batch: Batch) -> float:
        """One optimizer step; returns the loss.  One host sync: reading the loss after the
        optimizer step, which also tells whether it was finite — a non-finite loss stops the
        run right there, before anything (validation, checkpoint) sees the weights it made."""
        if isinstance(batch, PlannedStep):
            return self._planned_step(batch)
        batch = batch.to(self.device)  # the lengths stay on the CPU
        with autocast(self.device, self.train_dtype is not None, self.train_dtype):
            out = self.ddp_model(batch.images, *batch.captions)
        if self.pairwise:
            loss, world = self._pairwise_loss(out, batch), 1
        else:
            img, cap = dist.gather_with_grad(out[0].float()), dist.gather_with_grad(out[1].float())
            image_ids = _gather_ids(batch.image_ids)
            caption_ids = _gather_ids(batch.caption_ids)
            relevance = self.relevance(caption_ids) if self.relevance is not None else None
            ids = {"sample_ids": caption_ids} if self.loss_traits.takes_sample_ids else {}
            loss, world = self.loss(img, cap, image_ids=image_ids, relevance=relevance, **ids), self.world
            own = getattr(self.model, "auxiliary_losses", None)
            self.auxiliary = own() if own is not None else {}  # VSRN's caption branch: train/aux/NAME
        # DDP averages gradients over ranks; every rank computed the loss of the whole global
        # batch, so scaling by the world size gives the gradient of that one loss. A pairwise
        # network's loss is its rank's own batch (``_pairwise_loss``): the mean over the ranks,
        # as a dual network's own terms (its rank's batch, averaged by DDP as they are).
        total = loss * world
        if not self.pairwise and self.auxiliary:
            own_terms = sum(self.auxiliary.values())
            total, loss = total + own_terms, loss + own_terms
        return self._update(total, loss)

    def _update(self, total: torch.Tensor, loss: torch.Tensor) -> float:
        """One optimizer step on the gradient of ``total``; returns ``loss``, checked finite. Only
        the parameters with a gradient move (``zero_grad`` sets the others' to None: a network
        that did not run, as NCR's fixed one, keeps its weights and its Adam state)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(total).backward()
        if self.world > 1:  # the loss's own parameters: every rank holds world × the full gradient
            for q in self.loss_parameters:
                if q.grad is not None:
                    q.grad.div_(self.world)
        if self.settings.optimizer.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            clip_gradients(self.trainable, self.settings.optimizer.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.loss_after_step is not None:  # e.g. a learned logit scale clamped (infonce, siglip)
            self.loss_after_step()
        value = loss.item()
        if not math.isfinite(value):
            raise VseError(f"loss became {value} at epoch {self.progress.epoch + 1}, iteration "
                           f"{self.progress.iteration + 1}; lower --lr, or check the features for NaNs "
                           f"(`vse info` checks a cache)", self.source.location)
        return value

    def _planned_step(self, item: PlannedStep) -> float:
        """A step of a phase (``epoch_plan``): ``planned_step`` with this run's model, DDP wrapper,
        loss, autocast and optimizer step."""
        def forward(images, *captions, member):
            with autocast(self.device, self.train_dtype is not None, self.train_dtype):
                return self.ddp_model(images, *captions, member=member).float()

        def predict(images, *captions, member):
            with autocast(self.device, self.train_dtype is not None, self.train_dtype):
                return self.model(images, *captions, member=member).float()

        def update(loss: torch.Tensor) -> float:
            self.auxiliary = self.model.auxiliary_losses(member=item.phase.member)
            for term in self.auxiliary.values():  # a network's own terms (VSRN's captions)
                loss = loss + term
            return self._update(loss, loss)

        return planned_step(self.model, self.loss, item.to(self.device), update, forward, predict)

    def _pairwise_loss(self, scores: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The loss of a pairwise network's (B, B) scores: each rank's local batch is its own
        negatives (its local features are not gathered), plus the network's own terms."""
        relevance = self.relevance(batch.caption_ids) if self.relevance is not None else None
        ids = {"sample_ids": batch.caption_ids} if self.loss_traits.takes_sample_ids else {}
        loss = self.loss.scored(scores.float(), image_ids=batch.image_ids, relevance=relevance, **ids)
        self.auxiliary = self.model.auxiliary_losses()  # logged as train/aux/NAME (``_log_step``)
        for term in self.auxiliary.values():
            loss = loss + term
        return loss

    # ----------------------------------------------------------------- validation, checkpoints
    def validate(self) -> dict | None:
        """The validation metrics (on rank 0; None on the others). In fp32 as `vse evaluate`:
        metrics.jsonl and an evaluation of best.pt agree. Under torchrun a pairwise network's
        score blocks are shared by the ranks (every rank calls this); a dual network's split is
        encoded by rank 0 alone (one pass of each side, no pairs to share)."""
        if not (dist.is_main() or self.pairwise):
            return None
        emb = encode_split(self.model, self.index, self.captions, self.loop.val_split, self.device,
                           max_images=self.loop.val_images, batch_size=self.source.encode_batch_size)
        if not dist.is_main():
            return None
        return evaluate_embeddings(emb.images, emb.captions, emb.caption_image, similarity=emb.similarity)

    def _log_step(self, loss: float, steps_per_s: float) -> None:
        """The training curves (TensorBoard), every ``log_every`` steps."""
        step, hold = self.progress.iteration, self.run.replacing
        self.curves.scalar("train/loss", loss, step, hold=True)
        self.curves.scalar("train/lr", self.optimizer.param_groups[0]["lr"], step, hold=True)
        for name, term in self.auxiliary.items():  # a network's own loss terms (read here only: a sync)
            self.curves.scalar(f"train/aux/{name}", float(term.detach()), step, hold=True)
        self.curves.scalar("train/steps_per_s", steps_per_s, step, hold=hold)

    def validate_and_save(self) -> None:
        p = self.progress
        metrics = self.validate()
        rng = self.rng_state()  # every rank: it gathers each rank's CUDA generator
        if dist.is_main():
            epoch = p.epoch + (p.batch > 0)  # 1-based epoch this validation belongs to
            improved = metrics["rsum"] > p.best_rsum
            if improved:
                p.best_rsum, p.best_epoch = metrics["rsum"], epoch
            record = {"epoch": epoch, "iteration": p.iteration, "split": self.loop.val_split,
                      "lr": self.optimizer.param_groups[0]["lr"], "time": time.time(), **metrics,
                      **({"noise_true_rate": self.noise.true_rate()} if self.noise is not None else {}),
                      **self.division}
            self.echo(f"[epoch {record['epoch']} it {p.iteration}] rsum {metrics['rsum']:.2f}  "
                      f"i2t R@1 {metrics['i2t_r1']:.1f}  t2i R@1 {metrics['t2i_r1']:.1f}"
                      + ("  (best)" if improved else ""))
            self.run.save_validation(record, metrics, self.state_dict(rng), improved, save_checkpoint)
            self.curves.validation(metrics, p.iteration)  # after the files: an overwrite has swapped
        dist.barrier()

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
            "model_config": self.model.config.to_dict(),
            **({"loss": self.loss.state_dict()} if self.loss.state_dict() else {}),
            **self.captions.checkpoint_entry(),  # the vocabulary, or the caption features
            "train_config": recorded_config(self.cfg, self.parts.runtime.precision, self.device.type),
            "world_size": self.world,
            precision.RECORD_KEY: self.parts.runtime.precision.as_dict(),
            "feature_source": self.source.feature_source,
            **({"image_pipeline": self.source.image_pipeline} if self.source.image_pipeline else {}),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": asdict(self.progress),
            **({"division": self.division} if self.division else {}),
            "epoch": self.progress.epoch,
            "iteration": self.progress.iteration,
            "rng": rng if rng is not None else rng_state([device_rng_state(self.device)]),
            "file_identity": self.file_identity,
            **({code_identity.RECORD_KEY: self.parts.code_identity} if self.parts.code_identity else {}),
            **({"pool_weights": weights} if (weights := self.model.pool_weights()) else {}),
        }


def write_run_files(captions, noise, folder) -> None:
    """The run's files besides its config: the vocabulary, the noise index it trains on."""
    captions.save(folder)
    if noise is not None:
        noise.save(folder)


def clip_gradients(parameters: list[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_`` (VSE++'s clipping), bit for bit, without its multiply
    of every gradient by 1.0 when the norm is within ``max_norm``: that multiply only spares
    GPUs a host sync, and on a CPU it was a pass over all the gradients at every step."""
    total = torch.nn.utils.get_total_norm([q.grad for q in parameters if q.grad is not None])
    if total.device.type == "cpu" and bool(max_norm / (total + 1e-6) >= 1.0):  # torch's coefficient
        return
    # a gradient listed twice (VSRN's caption model, as its authors' Adam list) is scaled twice, as
    # their loop does; CUDA's batched multiply may scale such a gradient once, so each batched call
    # holds a gradient once: the first listing of every gradient, then the second of those listed
    # twice (on a GPU two multi-tensor kernels, not one launch a gradient: issue 50)
    for listing in _listings(parameters):
        torch.nn.utils.clip_grads_with_norm_(listing, max_norm, total)


def _listings(parameters: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``parameters`` as lists of distinct tensors: a tensor listed k times is in the first k."""
    seen: dict[int, int] = {}
    listings: list[list[torch.Tensor]] = []
    for q in parameters:
        k = seen[id(q)] = seen.get(id(q), -1) + 1
        if k == len(listings):
            listings.append([])
        listings[k].append(q)
    return listings


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


@dataclass
class PlannedStep:
    """One step of a phase (``PlannedBatches``): the phase and a batch of each of its streams."""

    phase: object            # noisy_losses.Phase
    batches: list            # Batch per stream; None where the stream has no pairs

    def pin_memory(self) -> "PlannedStep":
        return PlannedStep(self.phase, [b.pin_memory() if b is not None else None for b in self.batches])

    def to(self, device) -> "PlannedStep":
        return PlannedStep(self.phase, [b.to(device) if b is not None else None for b in self.batches])


class PlannedBatches(torch.utils.data.Dataset):
    """The steps of an epoch's phases, one phase after another: step t of a phase takes batch t of
    each stream (a later stream's batches run over as many cycles as needed). A phase ends at its
    first step with a batch of one pair (NCR's co_train.py breaks there)."""

    def __init__(self, plan: list, phases: list[list[PairBatches | None]]):
        self.plan, self.phases = plan, phases
        self.items = []
        for p, streams in enumerate(phases):
            if streams[0] is None:
                continue
            for t in range(len(streams[0])):
                sizes = [s.slices[t].stop - s.slices[t].start for s in streams if s is not None]
                if min(sizes) == 1:
                    break
                self.items.append((p, t))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> PlannedStep | LoadFailure:
        p, t = self.items[i]
        batches = [s[t] if s is not None else None for s in self.phases[p]]
        failed = [b for b in batches if isinstance(b, LoadFailure)]
        return failed[0] if failed else PlannedStep(self.plan[p], batches)


def planned_step(model, loss, item: PlannedStep, update, forward=None, predict=None) -> float:
    """One step of a phase (NCR's co_train.py ``train``, one iteration): the loss's targets first,
    from the co-trained networks in eval mode without gradient (``phase_targets``); then, for each
    update, the phase's network alone in train mode, the others fixed in eval mode
    (``CoTrained.train_member``), on its stream's batch: ``update(phase_loss)`` takes the
    optimizer step and returns the loss. ``forward`` / ``predict`` (default: the model) run
    network ``member`` with and without gradient. Returns the sum of the updates' losses."""
    phase, batches = item.phase, item.batches
    forward = forward or model
    predict_forward = predict or model
    predicted: dict = {}

    def predict_scores(member: int, stream: int) -> torch.Tensor:
        if (member, stream) not in predicted:
            b = batches[stream]
            predicted[member, stream] = predict_forward(b.images, *b.captions, member=member)
        return predicted[member, stream]

    model.eval()
    with torch.no_grad():
        updates = loss.phase_targets(
            phase, [(b.caption_ids, b.image_ids) if b is not None else None for b in batches], predict_scores)
    model.train_member(phase.member)
    total = 0.0
    for stream, target in updates:
        b = batches[stream]
        scores = forward(b.images, *b.captions, member=phase.member)
        total += update(loss.phase_loss(phase, scores, target, image_ids=b.image_ids))
    return total


def _pairs_in(item) -> int:
    if isinstance(item, PlannedStep):
        return sum(len(b.caption_ids) for b in item.batches if b is not None)
    return len(item.caption_ids)


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
