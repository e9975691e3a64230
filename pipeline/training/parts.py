"""``RunParts``: the built parts of one run, grouped by part, as ``build_run`` hands them to the
``Trainer``. Both import this module; neither imports the other back (build → trainer → parts).

    RunParts
      config        the resolved TrainConfig: what config.json and checkpoints record
      settings      each part's settings (training.settings), derived once from it
      run           the RunFolder, the one owner of the run's files
      runtime       device, autocast dtype, processes
      data          the pairs: source, caption side, training captions (their images: noisy or not)
      objective     the loss, what it declares, the batch relevance it may read
      network       the model, the one the step runs (DDP under torchrun), its kind
      optimization  optimizer, schedule, fp16 scaler, the parameters they move
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import numpy as np
    import torch

    from pipeline.core.config import TrainConfig
    from pipeline.core.precision import Precision
    from pipeline.data.batches import PairSource
    from pipeline.data.captions import CaptionEncoder
    from pipeline.data.noise import NoiseIndex
    from pipeline.losses.plugins import LossTraits
    from pipeline.relevance.batch import RelevanceFn
    from pipeline.training.curves import Curves
    from pipeline.training.run_folder import RunFolder
    from pipeline.training.settings import RunSettings

Echo = Callable[..., None]  # print on rank 0, silent elsewhere


@dataclass
class Runtime:
    device: torch.device
    distributed: bool               # under torchrun (DDP)
    world: int                      # processes
    train_dtype: torch.dtype | None  # the step's autocast dtype (None: fp32)
    precision: Precision            # what each part computes in: the run records it (core/precision)
    setup_line: str                 # what fit says first: device, precision, kernels, processes


@dataclass
class RunData:
    source: PairSource              # where the pairs come from (a cache, or images + CNN)
    captions: CaptionEncoder        # the caption side (tokens, or frozen caption features)
    train_captions: np.ndarray      # the training captions, in cache order
    train_caption_image: np.ndarray  # each caption's image in training: the cache's, or a noisy one
    noise: NoiseIndex | None        # the noise index of a run on noisy pairs
    workers: int                    # DataLoader workers


@dataclass
class Objective:
    loss: torch.nn.Module           # a VseLoss, or a user's loss (loss_plugins.make_loss)
    loss_traits: LossTraits         # what it declares
    relevance: RelevanceFn | None   # the batch relevance of a loss that uses it


@dataclass
class Network:
    model: torch.nn.Module          # VSE's model, a dual or pairwise network, or co-trained copies
    ddp_model: torch.nn.Module      # the model the step runs (DDP under torchrun)
    pairwise: bool                  # the model scores pairs (networks.network.network_kind)


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    trainable: list[torch.Tensor]   # what the optimizer moves (the loss's own parameters included)
    loss_parameters: list[torch.Tensor]


@dataclass
class RunParts:
    """The built parts of one run. ``resume_state``: the checkpoint a resumed run continues
    (the Trainer restores it), else None."""

    config: TrainConfig
    settings: RunSettings
    run: RunFolder
    echo: Echo
    runtime: Runtime
    data: RunData
    objective: Objective
    network: Network
    optimization: Optimization
    file_identity: dict[str, dict]  # each file the run names → its sha256 (run_folder.file_identity)
    curves: Curves
    resume_state: dict | None = None
    code_identity: dict | None = None  # the code that trains it (core.code_identity): code.json, checkpoints

    # the data part's names of before the parts were grouped
    @property
    def source(self) -> PairSource:
        return self.data.source

    @property
    def train_captions(self) -> np.ndarray:
        return self.data.train_captions

    @property
    def train_caption_image(self) -> np.ndarray:
        return self.data.train_caption_image
