"""Training losses of VSE0/VSE++, order embeddings, LSEH, the ladder loss and ConVSE.

The definitions are those of ``docs/PROTOCOL.md``.  Every loss is called as
``loss(img_emb, cap_emb, image_ids=None, relevance=None)`` on a batch of B pairs
(row i of both is a positive pair) and returns a scalar:

- ``S[i, j] = s(image_i, caption_j)``: the inner product (cosine, since the model
  L2-normalises) or, for ``order``, ``-||max(0, c - i)||^2`` on the given embeddings
  (``similarity.order_scores``).
- ``image_ids`` (B,) names each pair's image.  Pairs (i, j) with the same image are not
  negatives (unless ``mask_same_image=False``): several captions of one image may share a
  batch, and pushing them apart would punish correct matches.
- ``relevance`` (B, B) is the caption–caption relevance of the batch (``lseh``, ``ladder``).
- Hinge family (sh, mh, order, lseh, ladder): the sum over the batch, as VSE++.
  Contrastive family (csn, cmn, mvn): the mean over the batch, temperature ``tau``.

``LOSSES`` (name → class) is the one registry of the built-in losses: the CLI's choices,
config validation, the docs and the tests derive from it.  What a loss is lives on its
class: ``name``, ``similarity`` (a name of ``similarity.SIMILARITIES``: how the model's
embeddings are scored, in training and evaluation), ``uses_relevance`` (the trainer then
needs a relevance file) and ``collapse_value(global_batch)`` (the value when all embeddings
are equal, for the trainer's warning; None: no warning), and its options, ``Options`` (a frozen
dataclass of ``values.declare`` fields: defaults, ranges, choices; ``VseLoss`` checks them).  A
user's own loss (any ``nn.Module`` with this call; ``pipeline.models.loss_plugins``) may declare the
same attributes.

The similarity and the loss are computed in float32 (float64 for float64 inputs) with
autocast disabled: a B × B table is cheap, and hinges of bf16 scores are too coarse.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from pipeline.core import registry, values
from pipeline.core.errors import VseError
from pipeline.core.plugin_import import class_file
from pipeline.core.values import declare
from pipeline.models.similarity import image_caption_scores

LADDER_DEFAULTS = {  # levels → (thetas, margins, betas), from the CVSE++ paper
    2: ([0.63], [0.2, 0.01], [1.0, 0.25]),
    3: ([0.63, 0.56], [0.2, 0.01, 0.01], [1.0, 0.25, 0.125]),
}


def build_loss(name: str, **options) -> nn.Module:
    """The built-in loss ``name`` (one of ``LOSS_NAMES``) with its options (its ``Options``);
    ValueError for an unknown name or option, or a wrong value."""
    if name not in LOSS_NAMES:
        raise ValueError(f"unknown loss {name!r} (known: {', '.join(LOSS_NAMES)})")
    return registry.LOSSES.get_part(name)(**options)


def options_signature(options_class) -> inspect.Signature:
    """``(self, *, name=default, ...)``: the signature of a loss built from ``options_class``."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                             + [inspect.Parameter(f.name, keyword, default=f.default)
                                for f in dataclasses.fields(options_class)])


class Batch(NamedTuple):
    """What every loss needs, prepared once by ``VseLoss.forward``."""

    img: torch.Tensor | None   # (B, D); None for a batch given as its scores (``VseLoss.scored``)
    cap: torch.Tensor | None   # (B, D)
    scores: torch.Tensor       # (B, B) S[i, j] = s(image_i, caption_j)
    same_image: torch.Tensor   # (B, B) bool, pairs of the same image (diagonal included)
    negatives: torch.Tensor    # (B, B) bool, pairs that count as negatives
    relevance: torch.Tensor | None
    sample_ids: torch.Tensor | None = None  # (B,) each pair's caption id, for a loss with per-sample state
    stacked: torch.Tensor | None = None     # (k, B, B) the scores of k networks trained together


class VseLoss(nn.Module):
    """Common input checks, the options and batch preparation; subclasses define ``value(batch)``.

    A loss's options are its ``Options``, a frozen dataclass of ``values.declare`` fields that
    extends its base class's (``class Options(VseLoss.Options): ...``): the loss is built as
    ``Loss(**options)``, and this class checks them (``values.declared_options``: an unknown name,
    a wrong type, a value out of range or choices; the dataclass's ``__post_init__`` for rules
    between options), keeps them as ``self.options`` and sets each as an attribute
    (``self.margin``). A subclass's ``__init__(**options)``, if any, only derives its state
    (parameters, buffers) from them after ``super().__init__(**options)``."""

    name = ""                  # the registry name of a built-in loss
    similarity = "cosine"      # the score S of the embeddings (similarity.SIMILARITIES)
    uses_relevance = False
    needs_embeddings = False   # reads the embeddings, not only S: no loss of a pairwise network

    @dataclass(frozen=True)
    class Options:
        mask_same_image: bool = declare(True, "Pairs of the same image are no negatives (false: only the "
                                              "diagonal is a positive).")

    def __init__(self, *args, **options):
        super().__init__()
        names = [f.name for f in dataclasses.fields(self.Options)]
        if len(args) > len(names) or set(names[:len(args)]) & set(options):
            raise TypeError(f"{type(self).__name__} takes its options by name ({', '.join(names)})")
        options.update(zip(names, args))  # positional: in field order (VseLoss(mask_same_image))
        owner = f"loss {self.name or type(self).__name__}"
        self.options = values.declared_options(self.Options, options, owner)
        for name in names:
            setattr(self, name, getattr(self.options, name))
        self.epoch = 0

    def __init_subclass__(cls, **kwargs):
        """A subclass's ``__init__`` that takes its options as ``**options`` shows them as its
        signature (``inspect.signature``, help()): the fields of its ``Options``, with their defaults."""
        super().__init_subclass__(**kwargs)
        clashes = [f.name for f in dataclasses.fields(cls.Options) if hasattr(cls, f.name)]
        if clashes:
            raise TypeError(f"{cls.__name__}: options named as attributes of the loss: {', '.join(clashes)}")
        init = vars(cls).get("__init__")
        if init is None:
            inherited = cls.__init__

            def init(self, *args, **options):
                inherited(self, *args, **options)

            init.__qualname__, cls.__init__ = f"{cls.__qualname__}.__init__", init
        parameters = list(inspect.signature(init).parameters.values())[1:]
        if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
            init.__signature__ = options_signature(cls.Options)

    def set_epoch(self, epoch: int) -> None:
        """Told by the trainer at the start of each (0-based) epoch."""
        self.epoch = int(epoch)

    def collapse_value(self, global_batch: int) -> float | None:
        """The loss when every embedding is equal (a collapsed model), or None: no warning."""
        return None

    def score_matrix(self, img: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
        """S[i, j] = s(image_i, caption_j) for the declared ``similarity``."""
        return image_caption_scores(img, cap, self.similarity)

    def value(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, img_emb, cap_emb, image_ids=None, relevance=None) -> torch.Tensor:
        return self._embedded(img_emb, cap_emb, image_ids, relevance)

    def _embedded(self, img_emb, cap_emb, image_ids, relevance, **extra) -> torch.Tensor:
        if img_emb.ndim != 2 or img_emb.shape != cap_emb.shape or len(img_emb) == 0:
            raise ValueError("img_emb and cap_emb must both be (B, D) with B >= 1, got "
                             f"{tuple(img_emb.shape)} and {tuple(cap_emb.shape)}")
        dtype = torch.float64 if img_emb.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=img_emb.device.type, enabled=False):
            img, cap = img_emb.to(dtype), cap_emb.to(dtype)
            return self._value(self.score_matrix(img, cap), image_ids, relevance, img, cap, **extra)

    def scored(self, scores, image_ids=None, relevance=None) -> torch.Tensor:
        """The loss of a batch given as its (B, B) score matrix ``S[i, j] = s(image_i, caption_j)``
        (a network that scores pairs jointly, ``models.network``). A loss that reads the
        embeddings themselves (``needs_embeddings``) cannot take one."""
        return self._scored(scores, image_ids, relevance)

    def _scored(self, scores, image_ids, relevance, stacked=None, **extra) -> torch.Tensor:
        if self.needs_embeddings:
            raise ValueError(f"loss {self.name or type(self).__name__} compares the embeddings themselves; "
                             "it cannot train on a score matrix")
        if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or len(scores) == 0:
            raise ValueError(f"scores must be (B, B) with B >= 1, got {tuple(scores.shape)}")
        dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=scores.device.type, enabled=False):
            stacked = stacked.to(dtype) if stacked is not None else None
            return self._value(scores.to(dtype), image_ids, relevance, stacked=stacked, **extra)

    def _value(self, scores, image_ids, relevance, img=None, cap=None, sample_ids=None,
               stacked=None) -> torch.Tensor:
        """The checks and the masks every loss shares, then the subclass's ``value``."""
        size, device, dtype = len(scores), scores.device, scores.dtype
        if self.uses_relevance:
            if relevance is None:
                raise ValueError(f"loss {type(self).__name__} needs the batch relevance "
                                 "(pass relevance=, a B × B caption–caption matrix)")
            relevance = torch.as_tensor(relevance, device=device).to(dtype)
            if relevance.shape != (size, size):
                raise ValueError(f"relevance must be {size} × {size}, "
                                 f"got {tuple(relevance.shape)}")
        else:
            relevance = None
        if sample_ids is not None:
            sample_ids = torch.as_tensor(sample_ids, device=device)
            if sample_ids.shape != (size,):
                raise ValueError(f"sample_ids must have shape ({size},), got {tuple(sample_ids.shape)}")
        same_image, negatives = self.pair_masks(size, image_ids, device)
        value = self.value(Batch(img, cap, scores, same_image, negatives, relevance, sample_ids, stacked))
        if not (isinstance(value, torch.Tensor) and value.ndim == 0):
            raise _not_a_scalar(self, value)
        return value

    def pair_masks(self, size: int, image_ids, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(same_image, negatives), both (B, B) bool: the pairs of one image (the diagonal
        included), and the pairs that count as negatives (``mask_same_image``)."""
        positives = torch.eye(size, dtype=torch.bool, device=device)
        same_image = positives
        if image_ids is not None:
            image_ids = torch.as_tensor(image_ids, device=device)
            if image_ids.shape != (size,):
                raise ValueError(f"image_ids must have shape ({size},), "
                                 f"got {tuple(image_ids.shape)}")
            same_image = (image_ids[:, None] == image_ids[None, :]) | positives
        return same_image, (~same_image if self.mask_same_image else ~positives)


# ---------------------------------------------------------------------------- hinge family


class SumHingeLoss(VseLoss):
    """``sh`` (VSE0): the sum of hinges over all negatives, both directions."""

    name = "sh"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.2, "The hinge margin.", low=0)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = _hinge_costs(batch.scores, batch.negatives, self.margin)
        return to_captions.sum() + to_images.sum()


class _HardestNegativeHinge(VseLoss):
    """The hinge of the hardest negative per query, both directions, after an optional warm-up:
    ``warmup_epochs=E`` sums the hinges over all negatives for epochs 0 … E-1 (``set_epoch``),
    as VSE∞'s code does for its first epoch. Subclasses give the hinge costs."""

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        warmup_epochs: int = declare(0, "Sum of hinges for the first E epochs (VSE∞'s "
                                        "--vse_mean_warmup_epochs).", low=0)

    def collapse_value(self, global_batch: int) -> float | None:
        """Every hardest hinge is (about) the margin: 2 · B · margin (after any warm-up)."""
        return 2 * global_batch * self.margin or None

    def warming_up(self) -> bool:
        return self.epoch < self.warmup_epochs

    def reduce(self, to_captions: torch.Tensor, to_images: torch.Tensor) -> torch.Tensor:
        if self.warming_up():
            return to_captions.sum() + to_images.sum()
        return to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum()


class MaxHingeLoss(_HardestNegativeHinge):
    """``mh`` (VSE++): the hinge of the hardest negative per query, both directions.

    ``negative_set_size=k`` searches the hardest negative in a random subset of k of the
    query's negatives (drawn from torch's RNG, independently per query and direction).
    ``warmup_epochs=E`` uses the sum of hinges for epochs 0 … E-1 (see ``set_epoch``).
    """

    name = "mh"

    @dataclass(frozen=True)
    class Options(_HardestNegativeHinge.Options):
        margin: float = declare(0.2, "The hinge margin.", low=0)
        negative_set_size: int | None = declare(None, "The hardest negative among k random negatives.",
                                                low=1)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = _hinge_costs(batch.scores, batch.negatives, self.margin)
        if self.negative_set_size is not None and not self.warming_up():
            size = self.negative_set_size
            to_captions = to_captions.masked_fill(~_random_subset(batch.negatives, size), 0.0)
            to_images = to_images.masked_fill(~_random_subset(batch.negatives.T, size).T, 0.0)
        return self.reduce(to_captions, to_images)


class OrderLoss(VseLoss):
    """``order``: hinges on the order-embedding score ``-||max(0, c - i)||^2``
    (``similarity.order_scores``, the one definition evaluation uses too).

    ``reduction="sum"`` is Order0 (sum of hinges), ``"max"`` Order++ (hardest negative).
    ``squared=False`` uses VSE++ code's ``-||max(0, c - i)||`` instead (its published Order++
    numbers come from that form); the run then declares the similarity ``"order-norm"`` and
    is evaluated with the same form.  The embeddings are used as given (the model makes
    them non-negative).
    """

    name = "order"

    similarity = "order"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.05, "The hinge margin.", low=0)
        reduction: str = declare("sum", "sum (Order0) or max (Order++: the hardest negative).",
                                 choices=("sum", "max"))
        squared: bool = declare(True, "The score -||max(0, c - i)||^2 (false: VSE++ code's unsquared norm).")

    def __init__(self, **options):
        super().__init__(**options)
        self.similarity = "order" if self.squared else "order-norm"

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = _hinge_costs(batch.scores, batch.negatives, self.margin)
        if self.reduction == "sum":
            return to_captions.sum() + to_images.sum()
        return to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum()


class SemanticHardNegativeLoss(_HardestNegativeHinge):
    """``lseh``: VSE++'s hardest-negative hinge with the per-pair margin
    ``margin + lambda_ * relevance[i, j]`` (relevance zeroed on same-image pairs).

    With ``mask_same_image=False`` same-image pairs are negatives with margin ``margin``;
    ``zero_margin_same_image=True`` (only with ``mask_same_image=False``) gives them margin 0
    — the whole per-pair margin zeroed, as the LSEH reference code does.
    ``warmup_epochs=E`` sums the hinges (with their per-pair margins) for epochs 0 … E-1, as ``mh``.
    """

    name = "lseh"

    uses_relevance = True

    @dataclass(frozen=True)
    class Options(_HardestNegativeHinge.Options):
        margin: float = declare(0.185, "The hinge margin.", low=0)
        lambda_: float = declare(0.025, "The weight of the semantic margin.", low=0)
        zero_margin_same_image: bool = declare(False, "Same-image pairs get margin 0 (needs "
                                                      "mask_same_image false), as the LSEH code.")

        def __post_init__(self):
            if self.zero_margin_same_image and self.mask_same_image:
                raise ValueError("zero_margin_same_image needs mask_same_image=false (with the mask, "
                                 "same-image pairs are no negatives at all)")

    def value(self, batch: Batch) -> torch.Tensor:
        semantic = batch.relevance.masked_fill(batch.same_image, 0.0)
        margins = self.margin + self.lambda_ * semantic
        if self.zero_margin_same_image:
            margins = margins.masked_fill(batch.same_image, 0.0)
        return self.reduce(*_hinge_costs(batch.scores, batch.negatives, margins))


class LadderLoss(VseLoss):
    """``ladder`` (CVSE++) with hard contrastive sampling.

    Level 1 is VSE++'s hardest-negative hinge (margin ``margins[0]``, weight ``betas[0]``).
    Level l >= 2 splits each query's negatives at ``thetas[l-2]`` into "more relevant"
    (relevance >= theta) and "less relevant" and adds ``betas[l-1]`` times
    ``[margins[l-1] - min_more S + max_less S]_+``, both directions; queries with an empty
    side are skipped.  Defaults by ``levels`` (2 or 3) are the paper's.
    ``positive_in_more_relevant=True`` counts the positive pair in every "more relevant" set,
    as the reference code does (its relevance diagonal is 1 >= theta): a query with no more
    relevant negative still gets ``[margins[l-1] - S_qq + max_less S]_+``.
    """

    name = "ladder"

    uses_relevance = True

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        levels: int = declare(2, "L, the levels (2 or 3 have the paper's defaults).", low=2)
        thetas: list | tuple | None = declare(None, "L - 1 relevance thresholds in [-1, 1] (default: the "
                                                    "paper's).")
        margins: list | tuple | None = declare(None, "L margins >= 0 (default: the paper's).")
        betas: list | tuple | None = declare(None, "L weights >= 0 (default: the paper's).")
        positive_in_more_relevant: bool = declare(False, "Count the positive in every more-relevant set, "
                                                         "as the reference code.")

        def __post_init__(self):
            """The paper's thetas, margins and betas of ``levels`` where none are given, as lists."""
            levels, given = self.levels, (self.thetas, self.margins, self.betas)
            defaults = LADDER_DEFAULTS.get(levels)
            if defaults is None and None in given:
                raise ValueError(f"levels={levels} has no defaults: give thetas, margins and betas")
            names, bounds = ("thetas", "margins", "betas"), ((-1, 1), (0, None), (0, None))
            thetas, margins, betas = (
                values.finite_list(default if value is None else value, name, *low_high)
                for name, value, default, low_high in zip(names, given, defaults or given, bounds))
            if (len(thetas), len(margins), len(betas)) != (levels - 1, levels, levels):
                raise ValueError(f"levels={levels} needs {levels - 1} thetas, {levels} margins and "
                                 f"{levels} betas, got {len(thetas)}, {len(margins)}, {len(betas)}")
            for name, value in (("thetas", thetas), ("margins", margins), ("betas", betas)):
                object.__setattr__(self, name, value)

    def value(self, batch: Batch) -> torch.Tensor:
        to_captions, to_images = _hinge_costs(batch.scores, batch.negatives, self.margins[0])
        total = self.betas[0] * (to_captions.amax(dim=1).sum() + to_images.amax(dim=0).sum())
        positives = torch.eye(len(batch.scores), dtype=torch.bool, device=batch.scores.device)
        for theta, margin, beta in zip(self.thetas, self.margins[1:], self.betas[1:]):
            more = batch.negatives & (batch.relevance >= theta)
            if self.positive_in_more_relevant:
                more = more | positives
            less = batch.negatives & (batch.relevance < theta)
            total = total + beta * (_ladder_hinges(batch.scores, more, less, margin, dim=1)
                                    + _ladder_hinges(batch.scores, more, less, margin, dim=0))
        return total


# ---------------------------------------------------------------------------- contrastive family


class CrossModalInfoNCELoss(VseLoss):
    """``csn`` (ConVSE): -log softmax of the positive over each row of S / tau plus the
    same over each column (cross-modal negatives only), each averaged over the batch."""

    name = "csn"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        logits = (batch.scores / self.tau).masked_fill(~with_positives(batch.negatives),
                                                       -math.inf)
        to_captions = -torch.log_softmax(logits, dim=1).diagonal()
        to_images = -torch.log_softmax(logits, dim=0).diagonal()
        return to_captions.mean() + to_images.mean()


class HardestNegativeContrastiveLoss(VseLoss):
    """``cmn`` (ConVSE++): ``[(S_ic* + a - S_ii) / tau]_+ + [(S_i*i + a - S_ii) / tau]_+``
    with the hardest negative caption c* and image i*, averaged over the batch."""

    name = "cmn"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.2, "The margin a.", low=0)
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        scores = batch.scores.masked_fill(~batch.negatives, -math.inf)
        positive = batch.scores.diagonal()
        hardest_caption = scores.amax(dim=1)
        hardest_image = scores.amax(dim=0)
        cost = (torch.relu((hardest_caption + self.margin - positive) / self.tau)
                + torch.relu((hardest_image + self.margin - positive) / self.tau))
        return cost.mean()


class MultiViewNTXentLoss(VseLoss):
    """``mvn``: NT-Xent over the 2B items (B images, B captions).

    Each item's positive is its pair's other modality; its negatives are the other 2B - 2
    items of both modalities (minus same-image items when masked).  The value is the mean
    over the 2B anchors, as ConVSE's reference code (``SimCLR_loss``): half the scale of
    ``csn``, which sums its two directions' means.
    """

    name = "mvn"

    needs_embeddings = True  # image–image and caption–caption terms: no score matrix holds them

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        tau: float = declare(0.1, "The temperature.", above=0)

    def value(self, batch: Batch) -> torch.Tensor:
        size = len(batch.img)
        items = torch.cat([batch.img, batch.cap])
        logits = (items @ items.T) / self.tau
        pair = torch.eye(size, dtype=torch.bool, device=items.device)
        positive = torch.zeros_like(pair).repeat(2, 2)
        positive[:size, size:] = pair
        positive[size:, :size] = pair
        excluded = (~batch.negatives).repeat(2, 2) & ~positive  # self and same-image items
        logits = logits.masked_fill(excluded, -math.inf)
        partner = (torch.arange(2 * size, device=items.device) + size) % (2 * size)  # each row's positive
        # a gather by index, not a boolean mask: no host sync (the same values, in the same order)
        terms = -torch.log_softmax(logits, dim=1).gather(1, partner[:, None])
        return terms.mean()


class CLIPInfoNCELoss(VseLoss):
    """``infonce`` (CLIP; open_clip's ``ClipLoss``): the mean of the two directions' cross-entropy
    of ``exp(t) · S`` with the diagonal as labels. The log-scale ``t`` is learned, starts at
    log(1/0.07) and is clamped to [0, log 100] after every optimiser step (``after_step``), as
    open_clip's training loop does (``max_scale`` >= 1, and 1 <= ``init_scale`` <= ``max_scale``).
    Same-image pairs are left out of the softmax unless
    ``mask_same_image=False`` (open_clip: they are negatives)."""

    name = "infonce"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        init_scale: float = declare(1 / 0.07, "The learned scale's start, in [1, max_scale].")
        max_scale: float = declare(100.0, "The scale is clamped to [1, max_scale] after each step.", low=1)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_log_scale, init_log_scale = _clamped_log_scale(self.init_scale, self.max_scale)
        self.logit_scale = nn.Parameter(torch.tensor(init_log_scale))

    def after_step(self) -> None:
        """After each optimiser step: the scale back into [1, max_scale]."""
        with torch.no_grad():
            self.logit_scale.clamp_(0, self.max_log_scale)

    def value(self, batch: Batch) -> torch.Tensor:
        logits = (self.logit_scale.to(batch.scores.dtype).exp() * batch.scores).masked_fill(
            ~with_positives(batch.negatives), -math.inf)
        to_captions = -torch.log_softmax(logits, dim=1).diagonal()
        to_images = -torch.log_softmax(logits, dim=0).diagonal()
        return (to_captions.mean() + to_images.mean()) / 2


class SigmoidPairLoss(VseLoss):
    """``siglip`` (SigLIP; open_clip's ``SigLipLoss``): ``-Σ_ij log σ(z_ij (exp(t') S_ij + b)) / B``,
    z = +1 on the diagonal and −1 elsewhere. ``t'`` starts at log 10, the bias ``b`` at −10, both
    learned; ``t'`` is clamped to [0, log 100] after every step as ``infonce``'s. Same-image pairs
    other than the diagonal are left out of the sum unless ``mask_same_image=False``."""

    name = "siglip"

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        init_scale: float = declare(10.0, "The learned scale's start, in [1, max_scale].")
        init_bias: float = declare(-10.0, "The learned bias's start.")
        max_scale: float = declare(100.0, "The scale is clamped to [1, max_scale] after each step.", low=1)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_log_scale, init_log_scale = _clamped_log_scale(self.init_scale, self.max_scale)
        self.logit_scale = nn.Parameter(torch.tensor(init_log_scale))
        self.logit_bias = nn.Parameter(torch.tensor(self.init_bias))

    after_step = CLIPInfoNCELoss.after_step

    def value(self, batch: Batch) -> torch.Tensor:
        dtype = batch.scores.dtype
        logits = self.logit_scale.to(dtype).exp() * batch.scores + self.logit_bias.to(dtype)
        positives = torch.eye(len(logits), dtype=torch.bool, device=logits.device)
        signs = torch.where(positives, 1.0, -1.0).to(dtype)
        counted = positives | batch.negatives
        return -torch.nn.functional.logsigmoid(signs * logits).masked_fill(~counted, 0.0).sum() / len(logits)


# ---------------------------------------------------------------------------- helpers


def _hinge_costs(scores, negatives, margin):
    """(to_captions, to_images): ``[margin + S_ij - S_ii]_+`` (query image i, row) and
    ``[margin + S_ij - S_jj]_+`` (query caption j, column), zero where not a negative."""
    positive = scores.diagonal()
    to_captions = (margin + scores - positive[:, None]).clamp(min=0)
    to_images = (margin + scores - positive[None, :]).clamp(min=0)
    return to_captions.masked_fill(~negatives, 0.0), to_images.masked_fill(~negatives, 0.0)


def _random_subset(negatives, size: int):
    """Per row, a uniformly random subset of ``size`` of its negatives (all if fewer)."""
    keys = torch.rand(negatives.shape, device=negatives.device).masked_fill(~negatives, -1.0)
    chosen = keys.topk(min(size, negatives.shape[1]), dim=1).indices
    return torch.zeros_like(negatives).scatter_(1, chosen, True) & negatives


def _ladder_hinges(scores, more, less, margin, dim):
    """Sum over queries along ``dim`` of ``[margin - min_more S + max_less S]_+``."""
    least_relevant_score = scores.masked_fill(~more, math.inf).amin(dim=dim)
    most_confusing_score = scores.masked_fill(~less, -math.inf).amax(dim=dim)
    cost = (margin - least_relevant_score + most_confusing_score).clamp(min=0)
    return torch.where(more.any(dim=dim) & less.any(dim=dim), cost, 0.0).sum()


def with_positives(negatives):
    """The pairs a query's softmax or evidence counts: its negatives and its own positive (the
    diagonal)."""
    return negatives | torch.eye(len(negatives), dtype=torch.bool, device=negatives.device)


def _not_a_scalar(loss: VseLoss, value) -> Exception:
    """What a loss whose ``value`` is not a 0-d tensor raises: a user's subclass, one line naming its
    file (``VseError``); a built-in one, a bug of vse (ValueError, with its traceback)."""
    got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    message = f"loss {loss.name or type(loss).__name__}: value() returned {got}, not a 0-d tensor (a scalar)"
    if type(loss).__module__.split(".")[0] == "pipeline":
        return ValueError(message)
    return VseError(message, class_file(type(loss), type(loss).__name__))


def _clamped_log_scale(init_scale: float, max_scale: float) -> tuple[float, float]:
    """(log max_scale, log init_scale) of a learned logit scale kept in [1, max_scale] (``after_step``;
    max_scale >= 1 is declared): init_scale inside that range (one outside it would be moved after the
    first step)."""
    return math.log(max_scale), math.log(values.within(init_scale, "init_scale", low=1, high=max_scale))


# The old private name of ``values.finite`` (tests/test_hard_edges.py reads it).
_finite = values.finite


LOSS_NAMES = registry.LOSSES.names


def __getattr__(name: str):
    """``LOSSES``: the built-in losses by name, in the registry's order (pipeline.core.registry: the one
    list of names), resolved when first asked for, not at import: the losses in files of their own
    (rcl, decl, ncr) import this module, so resolving here at import would be a cycle."""
    if name == "LOSSES":
        return registry.LOSSES.resolved()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
