"""The names of the house: the one list of every kind of built-in name, torch-free.

Dataset layouts (``READERS``), losses, backbones, set pools, projections, similarities,
relevance methods, FAISS index kinds, size-augmentation rules, Adam kernels and crop modes are
listed here and nowhere else (tests/test_config.py checks that the modules and the CLI take
them from here).

timm's rule: a registry is the single source of names, and factories build the parts. Each
registry maps a name to ``"module:attribute"``, resolved only when the part is built, so
option parsing, ``--help`` and config checks (``pipeline.core.config``) know every name without
importing torch. The modules that hold the parts take their tables from here
(``losses.base.build_loss``, ``backbones.cnns.BUILDERS``, ``networks.heads``' pools), and a test
resolves every entry.

A user's own loss or set pool is an import path instead of a name (``FILE.py:Class`` or
``package.module:Class``; ``pipeline.core.plugin_import``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pipeline.core.plugin_import import check_spec, is_import_path


class Registry(Mapping):
    """``name → "module:attribute"`` of one kind of part, in the order names are shown."""

    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> str:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def get_part(self, name: str):
        """The attribute ``name`` stands for (imports its module)."""
        module, _, attribute = self._entries[name].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def resolved(self) -> dict:
        """Every name with its part (imports the modules)."""
        return {name: self.get_part(name) for name in self._entries}

    def face(self, namespace: dict):
        """A package face's module ``__getattr__`` and ``__dir__`` over these names (``namespace``:
        the package's ``globals()``): each name is imported when first read and then kept there, so
        the face hands on every public name and stays torch-free at import (``pipeline.losses``)."""
        package = namespace["__name__"]

        def __getattr__(name: str):
            if name not in self._entries:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = namespace[name] = self.get_part(name)
            return value

        def __dir__() -> list[str]:
            return sorted({*namespace, *self._entries})

        return __getattr__, __dir__

    def check(self, spec) -> None:
        """VseError unless ``spec`` is a name here or an import path (a user's own part)."""
        check_spec(spec, self.names, self.kind)


# ---------------------------------------------------------------------------- dataset readers
@dataclass(frozen=True)
class Reader:
    """One dataset layout: its reader, whether it has image files, and its own options.

    ``reader``: ``"module:function"``, called as ``function(root, **options) -> Dataset``.
    ``images``: the layout has image files (extract, RC training, evaluation on images); a
    feature-only layout (precomputed features) has none. ``layout``: ``"module:Class"``, the
    reader's own options: a frozen dataclass of ``values.declare`` fields (torch-free, beside the
    reader), whose field names are the command-line flags (``csv_img_key`` ↔ ``--csv-img-key``);
    the reader gets an instance as ``layout=``.
    """

    reader: str
    images: bool = True
    layout: str | None = None


class ReaderRegistry(Registry):
    """``--dataset`` names → ``Reader``. A new layout is one module in ``pipeline/data/readers``
    and one line here."""

    def __init__(self, entries: dict[str, Reader]):
        super().__init__("dataset", {name: entry.reader for name, entry in entries.items()})
        self.entries = dict(entries)

    @property
    def image_kinds(self) -> tuple[str, ...]:
        """The layouts with image files."""
        return tuple(name for name, entry in self.entries.items() if entry.images)

    def layout_class(self, kind: str):
        """The dataclass of ``kind``'s own options, or None (imports its module: keep it light)."""
        spec = self.entries[kind].layout
        if spec is None:
            return None
        module, _, attribute = spec.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def option_names(self) -> tuple[str, ...]:
        """Every reader option of every layout, in registry then field order."""
        names: list[str] = []
        for kind in self.entries:
            cls = self.layout_class(kind)
            names += [f.name for f in dataclasses.fields(cls)] if cls is not None else []
        return tuple(dict.fromkeys(names))

    def reader_options(self, kind: str, **values) -> dict:
        """The reader's keyword options for ``kind`` from option values by name (None = not
        given): ``{"layout": Layout(**given)}`` for a layout with options, else ``{}``. An option
        of another layout is refused in one line naming the layouts it is for; any other unknown
        name, a wrong type or a value out of range by the one check of a part's options
        (``values.declared_options``)."""
        from pipeline.core.errors import VseError
        from pipeline.core.values import declared_options

        self.check_kind(kind)
        given = {name: value for name, value in values.items() if value is not None}
        cls = self.layout_class(kind)
        own = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
        foreign = [name for name in given if name not in own and name in self.option_names()]
        if foreign:
            owners = [k for k in self.entries if (c := self.layout_class(k)) is not None
                      and foreign[0] in {f.name for f in dataclasses.fields(c)}]
            raise VseError(f"{', '.join(map(_flag, foreign))}: only for "
                           f"--dataset {' or '.join(owners)} (the {kind} layout has no such option)")
        layout = declared_options(cls, given, f"--dataset {kind}", error=VseError, spell=_flag)
        return {"layout": layout} if cls is not None else {}

    def check_kind(self, kind) -> None:
        from pipeline.core.errors import VseError

        if kind not in self.entries:
            raise VseError(f"unknown dataset kind {kind!r} (known: {', '.join(self.entries)})")


def _flag(name: str) -> str:
    """A reader option's command-line flag: ``csv_img_key`` → ``--csv-img-key``."""
    return "--" + name.replace("_", "-")


READERS = ReaderRegistry({
    "flickr8k": Reader("pipeline.data.readers.flickr8k:load_flickr8k"),         # official Flickr8k files
    "karpathy": Reader("pipeline.data.readers.karpathy:load_karpathy"),         # dataset_*.json splits
    "coco": Reader("pipeline.data.readers.coco:load_coco"),                     # COCO's captions_*.json
    "csv": Reader("pipeline.data.readers.csv_file:load_csv",                    # open_clip's CSV
                  layout="pipeline.data.readers.csv_layout:CsvLayout"),
    "vsepp-precomp": Reader("pipeline.data.readers.vsepp_precomp:load_vsepp_precomp", images=False),
})
DATASET_KINDS = READERS.names
IMAGE_DATASET_KINDS = READERS.image_kinds


# ---------------------------------------------------------------------------- losses
LOSSES = Registry("loss", {
    "sh": "pipeline.losses.hinge:SumHingeLoss",  # VSE0: sum of hinges
    "mh": "pipeline.losses.hinge:MaxHingeLoss",  # VSE++: max of hinges (hardest negative)
    "order": "pipeline.losses.hinge:OrderLoss",  # order embeddings
    "lseh": "pipeline.losses.lseh:SemanticHardNegativeLoss",  # LSEH
    "ladder": "pipeline.losses.ladder:LadderLoss",  # the ladder loss
    "csn": "pipeline.losses.convse:CrossModalInfoNCELoss",  # ConVSE
    "cmn": "pipeline.losses.convse:HardestNegativeContrastiveLoss",  # ConVSE++
    "mvn": "pipeline.losses.contrastive:MultiViewNTXentLoss",  # multi-view NT-Xent
    "infonce": "pipeline.losses.contrastive:CLIPInfoNCELoss",  # CLIP's loss, learned scale
    "siglip": "pipeline.losses.contrastive:SigmoidPairLoss",  # SigLIP's sigmoid loss, learned scale + bias
    "rcl": "pipeline.losses.noisy.rcl:ComplementaryContrastiveLoss",  # RCL: complementary contrastive
    "decl": "pipeline.losses.noisy.decl:EvidentialLoss",  # DECL: evidential learning, dynamic hinge
    "ncr": "pipeline.losses.noisy.ncr:NoisyCorrespondenceRectifier",  # NCR: two networks co-teaching
    "crcl": "pipeline.losses.noisy.crcl:ActiveComplementaryLoss",  # CRCL: complementary, refined labels
    "bicro": "pipeline.losses.noisy.bicro:BidirectionalConsistency",  # BiCro: NCR co-training, anchor labels
    "pcme": "pipeline.losses.pcme:PCMELoss",  # PCME: probabilistic embeddings, sampled soft contrastive
    "pcmepp": "pipeline.losses.pcme:PCMEppLoss",  # PCME++: closed-form sampled distance
    "poly": "pipeline.losses.poly:PolyLoss",  # PolyLoss: polynomial weights, hardest negative
    "selhn": "pipeline.losses.selhn:SelectiveHardNegativeLoss",  # SelHN: hardest negative, or mean when close
})

# ---------------------------------------------------------------------------- networks
# `vse train --network`: a network declares its kind (``networks.network``): "dual" encodes each side
# to one vector and scores their similarity; "pairwise" encodes local features and scores every
# pair jointly. Each network's declaration (``NetworkSpec``: kind, defaults, options, rules) lives
# next to its code, in a torch-free module; this list only names them.
NETWORK_KINDS = ("dual", "pairwise")


@dataclass(frozen=True)
class NetworkSpec:
    """What a network declares besides its code, torch-free, so that ``TrainConfig`` applies and
    checks it without building anything (a built-in's lives beside its module; a user's
    ``FILE.py:Class`` declares the same as class attributes: ``NetworkSpec.of_class``).

    ``kind``: "dual" or "pairwise". ``model``: ``"module:Class"``, the network's class (imports
    torch). ``defaults``: the options the network sets when they are left at their defaults.
    ``Options``: the frozen dataclass of its own options (``--network-option``), or None.
    ``rules``: ``check(config)`` functions, the network's own rules for a ``TrainConfig``.
    ``vse_heads``: the network is VSE's model (``vse_model.VSEModel``, built from a ``ModelConfig``):
    the head options apply (--image-pool, --text-pool, --rc, ...); any other network is built from
    a ``NetworkConfig`` and encodes cached features itself. ``model_fields``: for VSE's model,
    ``"module:function"`` giving the ``ModelConfig`` fields its options set, as
    ``function(network_options, set_kind, dataset_names)``.
    """

    kind: str
    model: str = ""
    defaults: dict = dataclasses.field(default_factory=dict)
    Options: type | None = None
    rules: tuple = ()
    vse_heads: bool = False
    model_fields: str | None = None

    def __post_init__(self):
        if self.kind not in NETWORK_KINDS:
            raise ValueError(f"kind must be {' or '.join(NETWORK_KINDS)}, got {self.kind!r}")

    @classmethod
    def of_class(cls, network_class: type, spec: str = "") -> NetworkSpec:
        """The declaration of a user's network class: its ``kind`` (a class that declares none is
        dual, as ``networks.network.network_kind`` reads a model), ``defaults``, ``Options`` and
        ``check(config)``, when it has them."""
        from pipeline.core.errors import VseError

        kind = getattr(network_class, "kind", "dual")
        if kind not in NETWORK_KINDS:
            raise VseError(f"network {spec or network_class.__name__} declares kind {kind!r}; expected "
                           f"{' or '.join(NETWORK_KINDS)}")
        check = getattr(network_class, "check", None)
        return cls(kind, model=spec, defaults=dict(getattr(network_class, "defaults", None) or {}),
                   Options=getattr(network_class, "Options", None), rules=(check,) if callable(check) else ())

    def own_fields(self, network_options: dict, set_kind: str | None, dataset_names=()) -> dict:
        """The ``ModelConfig`` fields of VSE's model that this network's options set (``model_fields``;
        imports its module); no pool options otherwise."""
        if self.model_fields is None:
            return {"pool_options": {}}
        module, _, name = self.model_fields.partition(":")
        return getattr(importlib.import_module(module), name)(network_options, set_kind, dataset_names)

    def check(self, config) -> None:
        """The rules of this network's kind, then its own, for ``config`` (a ``TrainConfig``)."""
        from pipeline.core.errors import VseError

        if not self.vse_heads:
            given = [flag for flag, used in (("--image-pool", config.image_pool is not None),
                                             ("--text-pool", config.text_pool != LAST), ("--rc", config.rc))
                     if used]
            if given and self.kind == "pairwise":
                raise VseError(f"{', '.join(given)}: not for --network {config.network}, which scores each "
                               "pair from the members of an image's set and the words of a caption (a cache "
                               "of sets: `vse extract --grid` or imported regions)")
            if given:
                raise VseError(f"{', '.join(given)}: not for --network {config.network}, which encodes "
                               "cached images and captions with its own layers (a feature cache, its own "
                               "pooling)")
        elif config.network_options and self.Options is None:
            raise VseError(f"--network {config.network} has no network options (its options are flags); "
                           f"got {', '.join(sorted(config.network_options))}")
        for rule in self.rules:
            rule(config)


class NetworkRegistry(Registry):
    """``--network`` names → their declarations (``"module:NAME"`` of a ``NetworkSpec``)."""

    def spec(self, name: str) -> NetworkSpec:
        """The declaration of a built-in name or of a user's ``FILE.py:Class`` (which imports it);
        VseError for anything else."""
        self.check(name)
        if name in self:
            return super().get_part(name)
        from pipeline.core.plugin_import import plugin_class

        return NetworkSpec.of_class(plugin_class(name, self.kind), name)

    def get_part(self, name: str):
        """The network's class (imports its module, and torch)."""
        module, _, attribute = self.spec(name).model.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def defaults(self, name) -> dict:
        """What network ``name`` sets when an option is left at its default; none for a name that
        is neither a network nor an import path (``check`` refuses it)."""
        known = isinstance(name, str) and (name in self or is_import_path(name))
        return dict(self.spec(name).defaults) if known else {}

    @property
    def dual_names(self) -> tuple[str, ...]:
        return tuple(name for name in self.names if self.spec(name).kind == "dual")


NETWORKS = NetworkRegistry("network", {
    "vse++": "pipeline.networks.vse_spec:VSE_PLUS_PLUS",  # VSE++: one vector per side, a GRU over words
    "vse-infty": "pipeline.networks.vse_spec:VSE_INFTY",  # VSE∞: sets pooled (GPO unless --image-pool)
    "vsrn": "pipeline.networks.vsrn_spec:VSRN",           # VSRN: GCN reasoning + GRU over the members
    "sgr": "pipeline.networks.sgraf_spec:SGR",            # SGRAF's similarity graph reasoning (pairwise)
    "saf": "pipeline.networks.sgraf_spec:SAF",            # SGRAF's similarity attention filtration (pairwise)
})


# ---------------------------------------------------------------------------- image backbones
BACKBONES = Registry("backbone", {
    "efficientnet-lite0": "pipeline.backbones.cnns:efficientnet_lite0",
    "efficientnet-lite1": "pipeline.backbones.cnns:efficientnet_lite1",
    "efficientnet-lite2": "pipeline.backbones.cnns:efficientnet_lite2",
    "resnet152": "pipeline.backbones.cnns:resnet152",
    "vgg19": "pipeline.backbones.cnns:vgg19",
    "tiny": "pipeline.backbones.cnns:tiny",                 # fixed random weights, for tests
})

# ---------------------------------------------------------------------------- heads
# A vector's projection into the joint space: "linear" (VSE++), "mlp" (ConVSE's two layers).
PROJECTIONS = ("linear", "mlp")

# Set pools: a padded set of vectors → one vector, ``pool(x (B, K, E), lengths (B,))`` →
# (B, E). They pool image members (regions, grid cells) and caption tokens (BiGRU states, or
# cached token vectors) alike; a user's own pool is built as ``Class(dim=E, **options)``
# (``vse check-pool`` runs its contract).
SET_POOLS = Registry("pool", {
    "mean": "pipeline.networks.heads:MeanPool",  # masked mean
    "max": "pipeline.networks.heads:MaxPool",    # masked max per dimension
    "gpo": "pipeline.networks.heads:GPO",        # VSE∞'s Generalized Pooling Operator
    "vsrn": "pipeline.networks.vsrn:VSRNReasoning",  # VSRN: 4 GCN layers, then a GRU's last state
})
IMAGE_POOLS = SET_POOLS.names
# "last": VSE++'s caption encoder (one-way GRU, its state after the last token;
# networks.vse_model.TextEncoder).
# A set pool over word tokens pools the states of a bidirectional GRU (gpo = VSE∞'s BiGRU
# encoder, heads.BiGRUTextEncoder); over cached token vectors it pools their per-token
# projection (heads.TokenSetTextEncoder).
LAST = "last"
TEXT_POOLS = (LAST, *SET_POOLS.names)

# Per-member projection of a set head (heads.SetImageHead): "linear" = fc(x) (VSE∞'s CNN-grid
# head); "linear+mlp" = fc(x) + MLP(x), MLP = Linear → BatchNorm1d → ReLU → Linear with hidden
# size embed/2 (VSE∞'s head over precomputed regions).
SET_PROJECTIONS = ("linear", "linear+mlp")

# Size augmentation of a training set (set_augment.size_augment): "precomp" = VSE∞'s rule for
# precomputed regions, "grid" = its rule for CNN grids.
SIZE_AUGMENT_RULES = ("precomp", "grid")

# ---------------------------------------------------------------------------- scores and files
# Similarities of an image and a caption embedding (core.similarity): the inner product, and the
# order-embedding score squared (the paper) or not (VSE++'s code), and PCME++'s closed-form sampled
# distance of Gaussian embeddings (its negative: higher is closer).
SIMILARITIES = ("cosine", "order", "order-norm", "csd")
# Of them, the scores of probabilistic embeddings: each embedding is [mean, log-variance] (halves),
# a dual network then carries a variance head (PCME, PCME++; networks.vse_model).
PROBABILISTIC_SIMILARITIES = ("csd",)
# Of them, the order-embedding scores: their embeddings are non-negative (absolute values).
ORDER_SIMILARITIES = ("order", "order-norm")
# Caption relevance (`vse relevance --method`): LSEH's TF-IDF + SVD, MiniLM, mean GloVe, and the
# ladder paper's gate of the two.
RELEVANCE_METHODS = ("svd", "bert", "cbow", "cbow+bert")
# FAISS index kinds (`vse index --kind`).
INDEX_KINDS = ("flat", "hnsw", "ivfpq")
# Test-time re-scoring against hubness (`vse evaluate --rescore`, `vse index --rescore`; issue 61).
RESCORERS = Registry("re-scoring method", {
    "isf": "pipeline.evaluation.rescore:InvertedSoftmax",  # inverted softmax (Smith et al., 2017)
    "csls": "pipeline.evaluation.rescore:CSLS",  # CSLS (Conneau et al., 2018)
    "qbnorm": "pipeline.evaluation.rescore:QBNorm",  # Querybank Normalisation (Bogolin et al., 2022)
    "dsl": "pipeline.evaluation.rescore:DualSoftmax",  # CAMoE's dual softmax: transductive
    "nnn": "pipeline.evaluation.rescore:NNN",  # Nearest Neighbor Normalization (Chowdhury et al., 2024)
})

# ---------------------------------------------------------------------------- training
# Noisy correspondence (data.noise): NCR's caption-level noise, DECL's / RCL's image-level noise.
NOISE_MODES = ("caption", "image")
# Adam's kernels: the same update, rounded differently (PROTOCOL.md). "fused" is one pass over
# each parameter; "default" is PyTorch's own choice, which every run before the option used.
ADAM_KERNELS = ("fused", "default")
# RC mode's training crop: resize 256 + random 224 (VSE++), or a random-resized crop; + flip.
CROP_MODES = ("random", "random-resized")


def check_image_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in image pool or an import path."""
    check_spec(spec, IMAGE_POOLS, "pool")


def check_text_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in text pool or an import path (a user's set pool)."""
    check_spec(spec, TEXT_POOLS, "pool")

# ---------------------------------------------------------------------------- report layouts
# `vse report --columns`: the tables of results.csv (their columns: pipeline.reports.report.LAYOUTS)
REPORT_LAYOUTS = ("paper", "recall", "human", "noisy")
