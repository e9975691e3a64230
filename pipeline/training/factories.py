"""Small factories: each builds one part of a training run from that part's settings
(``training.settings``: never the whole ``TrainConfig``), as timm's ``create_optimizer_v2`` /
``create_scheduler_v2`` do. ``build.build_run`` wires them together; the Trainer keeps the loop.

    create_pair_source   cached features, or images through the CNN (RC mode)
    create_caption_side  the GRU's tokens, or frozen caption vectors (--text-features)
    create_loss          a built-in loss or a user's, and the traits it declares
    create_model         the joint embedding model (SyncBatchNorm under DDP when it trains BN)
    init_from_checkpoint, load_glove   where the weights start
    create_relevance     the B×B relevance of a batch (lseh, ladder)
    create_optimizer     Adam over the head (+ the loss's own parameters) and a fine-tuned CNN
    create_scheduler     StepLR (VSE++: lr × lr_decay every lr_decay_epoch epochs)
    create_scaler        the fp16 loss scaler (enabled only where fp16 autocast needs it)
    wrap_ddp             DistributedDataParallel around the model under torchrun
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from pipeline.core.errors import VseError
from pipeline.core.registry import NETWORKS
from pipeline.core.runtime import needs_grad_scaler
from pipeline.data.batches import CachedFeatures, PairSource
from pipeline.data.captions import CachedCaptionTokens, CaptionEncoder, GRUCaptions, open_caption_features
from pipeline.losses.plugins import loss_traits, make_loss
from pipeline.networks.network import NetworkConfig, build_network, network_class
from pipeline.networks.vse_model import ModelConfig, VSEModel
from pipeline.text.vocabulary import Vocabulary
from pipeline.training.settings import (
    DataSettings,
    LossSettings,
    ModelSettings,
    OptimizerSettings,
    RuntimeSettings,
    loss_settings,
    unreached_phases,
)


def create_pair_source(settings: DataSettings) -> PairSource:
    if not settings.rc:  # with caption features too, both sides of training sit in memory
        return CachedFeatures(settings.features, preload=settings.preload or bool(settings.text_features))
    from pipeline.data.image_source import (
        ImageSource,  # torchvision and the image stack: only RC mode pays their import
    )

    return ImageSource(settings.dataset, settings.root, settings.backbone, weights=settings.backbone_weights,
                       finetune=settings.finetune, freeze_bn=settings.freeze_bn, crop=settings.crop,
                       seed=settings.seed, batch_size=settings.batch_size,
                       dataset_options=settings.dataset_options, grid=settings.grid)


def create_caption_side(settings: DataSettings, source: PairSource, train_captions: np.ndarray,
                        resume_state: dict | None, init_state: dict | None, checkpoint) -> CaptionEncoder:
    """Frozen caption vectors (--text-features) or the GRU's tokens. A resumed run keeps its
    text_features option (the resume rule refuses a change) and the file itself must still hold
    the vectors it was trained on; its vocabulary, or that of --init-from's run, is kept."""
    captions = source.index.captions
    if settings.text_features:
        expected = resume_state.get("text_features") if resume_state is not None else None
        return open_caption_features(settings.text_features, captions, source.location, expected=expected,
                                     checkpoint=checkpoint)
    state = resume_state or init_state
    if state is not None and state["vocab"]:  # (a run on caption features has none)
        vocab = Vocabulary(state["vocab"])
    else:  # the vocabulary of the training captions
        vocab = Vocabulary.build((captions[j] for j in train_captions), settings.min_word_count)
    return GRUCaptions(vocab, captions, settings.max_caption_tokens)


def create_loss(settings: LossSettings, device: torch.device):
    """The loss (on ``device``) and the traits it declares (``loss_plugins.loss_traits``)."""
    loss = make_loss(settings.name, dict(settings.options)).to(device)
    return loss, loss_traits(loss, settings.name)


def schedule_note(config) -> str | None:
    """``settings.unreached_phases`` of a run's ``TrainConfig`` (its loss built to ask it): the line a
    sweep, a tune and a report give a run whose method never starts."""
    settings = loss_settings(config)
    loss = make_loss(settings.name, dict(settings.options))
    return unreached_phases(settings.name, loss_traits(loss, settings.name).starts, config.epochs)


def run_schedule_note(run_dir) -> str | None:
    """``schedule_note`` of a trained run, from the config.json in its folder (`vse report` marks
    such rows, `vse compare` names such runs); None when the folder holds no readable config."""
    from pipeline.core.config import TrainConfig, with_old_defaults
    from pipeline.training.run_folder import read_config

    try:
        saved = read_config(run_dir)
        return schedule_note(TrainConfig.from_dict(with_old_defaults(saved))) if saved else None
    except VseError:
        return None


def tell_loss_the_scores(settings: LossSettings, loss: torch.nn.Module, model: torch.nn.Module) -> None:
    """A network whose scores are σ(raw) (``score_activation = "sigmoid"``: SGR, SAF) tells a loss
    that reads the raw score (``score_is_sigmoid``: decl, whose authors take tanh and the evidence of
    SGRAF's raw score) so, unless the run's loss options say otherwise."""
    networks = getattr(model, "members", None) or [model]
    sigmoid = all(getattr(n, "score_activation", None) == "sigmoid" for n in networks)
    if sigmoid and hasattr(loss, "score_is_sigmoid") and "score_is_sigmoid" not in settings.loss_options:
        loss.score_is_sigmoid = True


def create_model(settings: ModelSettings, source: PairSource, captions: CaptionEncoder, traits, device,
                 distributed: bool) -> torch.nn.Module:
    """The network of ``settings.network`` (dual or pairwise, as it declares); k copies of it
    trained together (``networks.cotrain``) when the loss declares ``networks = k`` (NCR)."""
    if traits.networks > 1:
        if settings.rc:
            raise VseError(f"loss {settings.loss} trains {traits.networks} networks together; that runs over "
                           "cached features, not in RC mode (drop --rc)")
        from pipeline.networks.cotrain import CoTrained

        return CoTrained([_create_network(settings, source, captions, traits, device, distributed)
                          for _ in range(traits.networks)]).to(device)
    return _create_network(settings, source, captions, traits, device, distributed)


def _create_network(settings: ModelSettings, source: PairSource, captions: CaptionEncoder, traits, device,
                    distributed: bool) -> torch.nn.Module:
    """The network as its declaration says (``registry.NetworkSpec``): VSE's model from the head
    options (vse++, vse-infty, vsrn), any other network from a ``NetworkConfig``, by its kind."""
    declared = NETWORKS.spec(settings.network)
    if not declared.vse_heads:
        build = create_pairwise_network if declared.kind == "pairwise" else create_dual_network
        return build(settings, source, captions, traits).to(device)
    own = network_fields(settings, source, declared)
    model_config = ModelConfig(  # the loss declares the similarity its scores use
        feature_dim=source.feature_dim, embed_dim=settings.embed_dim, img_norm=settings.img_norm,
        similarity=traits.similarity, projection=settings.projection, **image_fields(settings, source),
        text_pool=settings.text_pool, **captions.model_fields(settings),
        caption_loss_weight=settings.caption_loss_weight or 0.0,
        **{**own, "pool_options": {**own["pool_options"], **settings.pool_options}})
    if not settings.img_norm and traits.similarity != "cosine":
        raise VseError(f"--no-img-norm: loss {settings.loss!r} scores by {traits.similarity}, which needs "
                       "normalised images; drop --no-img-norm")
    model = VSEModel(model_config, source.backbone).to(device)
    if distributed and settings.finetune and not settings.freeze_bn and device.type == "cuda":
        # BatchNorm statistics of the global batch, as one process with N×B would compute
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def create_pairwise_network(settings: ModelSettings, source: PairSource, captions: CaptionEncoder, traits):
    """A network that scores pairs jointly (``networks.network``), over a cache of sets and word
    ids or cached token vectors; refused in one line where it cannot train."""
    if not traits.takes_scores:
        raise VseError(f"loss {settings.loss} reads the embeddings themselves, but --network "
                       f"{settings.network} gives only the batch's score matrix: pick a loss on scores "
                       "(mh, sh, lseh, ladder, csn, cmn)")
    if source.set_kind is None:
        raise VseError(f"--network {settings.network} attends over the members of each image's set, but this "
                       "cache holds one vector per image: extract one with --grid (or import regions)",
                       source.location)
    text = network_text_fields(settings, captions)
    return build_network(NetworkConfig(network=settings.network, feature_dim=source.feature_dim,
                                       set_size=int(source.index.set_size), embed_dim=settings.embed_dim,
                                       options=dict(settings.network_options), **text))


def create_dual_network(settings: ModelSettings, source: PairSource, captions: CaptionEncoder, traits):
    """A dual network built from a ``NetworkConfig`` (a user's ``FILE.py:Class``, a ``DualNetwork``)
    over cached features: one vector per image or sets, as its class declares (``takes_sets``),
    and word ids or cached token vectors; refused in one line where it cannot train."""
    if traits.similarity != "cosine":
        raise VseError(f"loss {settings.loss} scores by {traits.similarity}; --network {settings.network} "
                       "gives embeddings scored by cosine (as evaluation scores them): pick a cosine loss")
    takes_sets = bool(getattr(network_class(settings.network), "takes_sets", False))
    if takes_sets != (source.set_kind is not None):
        held = "one vector per image" if source.set_kind is None else f"sets ({source.set_kind})"
        wants = "sets of members (extract one with --grid, or import regions)" if takes_sets else \
            "one vector per image"
        raise VseError(f"--network {settings.network} reads {wants}, but this cache holds {held}",
                       source.location)
    return build_network(NetworkConfig(network=settings.network, feature_dim=source.feature_dim,
                                       set_size=int(source.index.set_size) if takes_sets else 0,
                                       embed_dim=settings.embed_dim, options=dict(settings.network_options),
                                       **network_text_fields(settings, captions)))


def network_text_fields(settings: ModelSettings, captions: CaptionEncoder) -> dict:
    """A ``NetworkConfig``'s caption fields: word ids (its own word encoder) or cached token vectors;
    a file of one vector per caption is refused."""
    if isinstance(captions, GRUCaptions):
        return {"vocab_size": len(captions.vocab), "word_dim": 50 if settings.glove else settings.word_dim}
    if isinstance(captions, CachedCaptionTokens):
        return {"text_dim": captions.file.dim}
    raise VseError(f"--network {settings.network} attends over the words of each caption, but this file "
                   "holds one vector per caption: make token vectors with `vse encode-text --tokens`",
                   settings.text_features)


def network_fields(settings: ModelSettings, source: PairSource, declared) -> dict:
    """The ``ModelConfig`` fields that the options of VSE's model's network set (its declaration's
    ``model_fields``: `--network vsrn`'s pool options, its image encoder variant chosen from the data
    when ``auto`` (networks.vsrn.resolve_variant), and its own options, checked); none otherwise."""
    attrs = getattr(getattr(source, "index", None), "attrs", {})
    names = [attrs.get("dataset", ""), str(attrs.get("dataset_root", "")).rstrip("/").rsplit("/", 1)[-1]]
    return declared.own_fields(settings.network_options, source.set_kind, names)


def image_fields(settings: ModelSettings, source: PairSource) -> dict:
    """The image side's ``ModelConfig`` fields: a set head when the source gives sets (and
    --image-pool pools them), VSE++'s projection when it gives vectors; a mismatch is refused."""
    if source.set_kind is None:
        if settings.image_pool is not None:
            raise VseError(f"--image-pool {settings.image_pool} pools sets of vectors, but this cache holds "
                           "one vector per image: extract one with --grid (or import precomputed regions)",
                           source.location)
        return {}
    if settings.image_pool is None:
        raise VseError(f"the images are sets ({source.set_kind}) of {source.feature_dim}-d vectors: pool "
                       "them with --image-pool (mean, max, gpo or your own)", source.location)
    augment = {"auto": "grid" if source.set_kind == "grid" else "precomp", "none": None}.get(
        settings.size_augment, settings.size_augment)
    return {"image_pool": settings.image_pool, "set_projection": settings.set_projection,
            "size_augment": augment}


def init_from_checkpoint(model: VSEModel, state: dict, settings: ModelSettings, echo) -> None:
    """The head (projection + text encoder) of any run, cached or RC; the CNN too when the
    checkpoint is an RC run of the same backbone."""
    own = model.head_state_dict()
    weights = {k: v for k, v in state["model"].items() if k in own and own[k].shape == v.shape}
    skipped = sorted(set(own) - set(weights))
    model.load_state_dict(weights, strict=False)
    message = f"initialised {len(weights)} tensors from {settings.init_from}"
    backbone, saved = model.backbone, state.get("backbone")
    if backbone is not None:
        trained_on = saved["name"] if saved else state.get("feature_source", {}).get("backbone")
        if saved and saved["name"] == settings.backbone:
            backbone.cnn.load_state_dict(saved["state"])
            message += " and its CNN"
        elif trained_on != settings.backbone:
            echo(f"warning: {settings.init_from} was trained on features of {trained_on!r}, "
                 f"not of backbone {settings.backbone!r}")
    echo(message + (f"; kept fresh: {', '.join(skipped)}" if skipped else ""))


def load_glove(model: VSEModel, vocab: Vocabulary, echo) -> None:
    from pipeline.text.glove import vectors_for

    vectors, found = vectors_for(vocab.words)
    n = model.text_encoder.load_word_vectors(torch.from_numpy(vectors), torch.from_numpy(found))
    echo(f"GloVe initialised {n} of {len(vocab)} words")


def create_relevance(settings: LossSettings, traits, source: PairSource):
    """The batch relevance a loss that declares ``uses_relevance`` needs; None otherwise."""
    if not traits.uses_relevance:
        return None
    if not settings.relevance:
        raise VseError(f"loss {settings.name!r} needs --relevance FILE (made by `vse relevance`)")
    from pipeline.relevance import BatchRelevance

    return BatchRelevance(settings.relevance, num_captions=len(source.index.captions),
                          caption_fingerprint=source.index.caption_fingerprint,
                          captions_from=source.location)


def trainable_parameters(model: VSEModel, loss: torch.nn.Module) -> tuple[list, list]:
    """(everything the optimizer updates, the loss's own parameters among them): a loss's own
    parameters (e.g. a learnable temperature) train with the head."""
    loss_parameters = [q for q in loss.parameters() if q.requires_grad]
    twice = [q for q in getattr(model, "listed_twice", list)() if q.requires_grad]  # VSRN's Adam list
    return [q for q in model.parameters() if q.requires_grad] + twice + loss_parameters, loss_parameters


def param_groups(settings: OptimizerSettings, model: VSEModel, trainable: list) -> list[dict]:
    """The head at lr; a fine-tuned CNN in its own group at lr × backbone_lr_factor."""
    cnn = {id(q) for q in model.backbone.parameters()} if model.backbone is not None else set()
    groups = [{"params": [q for q in trainable if id(q) not in cnn], "lr": settings.lr}]
    cnn_params = [q for q in trainable if id(q) in cnn]
    if cnn_params:
        groups.append({"params": cnn_params, "lr": settings.lr * settings.backbone_lr_factor})
    return groups


def create_optimizer(settings: OptimizerSettings, model: VSEModel, trainable: list) -> torch.optim.Optimizer:
    """Adam (VSE++), with the kernel of ``adam_kernel`` (registry.ADAM_KERNELS); parameters that
    ``trainable`` lists twice (VSRN's caption branch, as the authors' list) take two steps."""
    from pipeline.networks.vsrn import AdamListingTwice, listed_twice

    unique, twice = listed_twice(trainable)
    kwargs = {"lr": settings.lr, "fused": settings.adam_kernel == "fused" or None}
    if twice:
        return AdamListingTwice(param_groups(settings, model, unique), twice, **kwargs)
    return torch.optim.Adam(param_groups(settings, model, trainable), **kwargs)


def create_scheduler(settings: OptimizerSettings, optimizer: torch.optim.Optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, settings.lr_decay_epoch),
                                           gamma=settings.lr_decay)


def create_scaler(settings: RuntimeSettings, device: torch.device) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(device.type, enabled=needs_grad_scaler(device, settings.amp))


def wrap_ddp(model: VSEModel, settings: ModelSettings, distributed: bool):
    """The model the step runs: DDP under torchrun, else the model itself. No device_ids: DDP
    would move every input to the GPU, the caption lengths too, which pack_padded_sequence then
    copies back (a host sync); the batch is on its device already. Buffers change only in
    BatchNorm layers that train their statistics. Co-trained networks may train one at a time
    (NCR's phases, ``CoTrained.train_member``): DDP then looks for the parameters a step did not
    use, and leaves their gradients None, so the fixed network does not move."""
    if not distributed:
        return model
    sync = settings.finetune and not settings.freeze_bn
    return DistributedDataParallel(model, device_ids=None, **{_BUFFER_SYNC: sync},
                                   find_unused_parameters=hasattr(model, "train_member"))


# torch 2.14 renamed DDP's broadcast_buffers (now deprecated) to forward_sync_buffers; older torch
# (2.11 on a lent H200) refuses the new name with a TypeError at the first torchrun step
_BUFFER_SYNC = ("forward_sync_buffers"
                if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                else "broadcast_buffers")
