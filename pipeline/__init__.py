"""vse: visual-semantic embedding research toolkit (library layer).

Packages by concern, each importing only the ones listed before it, and networks, losses and
backbones, side by side, only core (docs/ARCHITECTURE.md):

    core        errors, atomic files, file formats, device and precision, processes, options
                (TrainConfig) and the registry of names, checkpoints, plug-in imports
    networks    the networks, each family one file beside its declaration: the seam, VSE++/VSE∞
                with their heads and pools, VSRN, SGR/SAF, co-training; their checks
    losses      the losses, one family per file over one base class; noisy-pair methods; the
                loss contract and plug-ins
    backbones   CNN backbones with their engines and pixel preprocessing (extraction, RC)
    text        caption text: vocabulary, GloVe, sentence encoders (MiniLM, CBOW)
    data        dataset readers, the caption index, feature caches, caption features, the
                caption side of training, where training pairs come from, `vse extract`
    relevance   caption–caption relevance: vectors, the relevance file, a batch's relevance
    evaluation  the retrieval protocol: a checkpoint's split embeddings, metrics, CS@K,
                human judgments, statistics
    training    the Trainer, the factories that build its parts, run folders, curves, sweeps
    reports     results over many runs: evaluate --runs, tables, compare, plots, gallery
    search      a trained model put to work: embed, FAISS index, search, the web service
    api         the Python API (docs/api.md): a checkpoint loaded, images and captions embedded
                and scored, a split evaluated, a run trained from a dict; its names are handed
                on here when first read (``pipeline.load_model``), so ``import pipeline`` stays light
"""

__version__ = "0.1.0"

# The packages in the order above: each may import only those before it (tests/test_layers.py).
LAYERS = ("core", "networks", "losses", "backbones", "text", "data", "relevance", "evaluation", "training",
          "reports", "search", "api")
# Packages of one floor: each imports core and none of the others (tests/test_layers.py).
SIDE_BY_SIDE = ("networks", "losses", "backbones")

# Where each module of the flat layout (version 0.1.0 before the split by concern) went. A user's
# plug-in (FILE.py:Class) that imports an old module path, e.g. ``import pipeline.loss_plugins``,
# still works for one version, with a note (a FutureWarning naming the new path). The old modules
# that are packages now keep their names at the package's face: ``losses`` and ``backbones`` hand
# them on as their public names (``from pipeline.losses import MaxHingeLoss``); ``evaluation`` and
# ``search`` hand on the names of the module that took them (below: "evaluation", "search") with a
# note, for one version (``moved_name``). ``pipeline.text``'s face hands on nothing: ``from
# pipeline.text import Vocabulary`` fails; it is ``pipeline.text.vocabulary`` (below: "text"). The
# modules of ``pipeline.models`` (0.1.0's second layout) have their own table: ``pipeline.models``.
MOVED = {
    "errors": "core.errors", "fsutil": "core.fsutil", "runtime": "core.runtime",
    "distributed": "core.distributed", "runlock": "core.runlock", "plugin_import": "core.plugin_import",
    "registry": "core.registry", "config": "core.config", "checkpoint": "core.checkpoint",
    "layers": "networks.layers", "heads": "networks.heads", "set_augment": "networks.set_augment",
    "loss_plugins": "losses.plugins", "loss_check": "losses.check", "pool_check": "networks.pool_check",
    "engines": "backbones.engines", "crops": "backbones.crops", "text": "text.vocabulary",
    "glove": "text.glove",
    "relevance.encoders": "text.encoders", "relevance.bert": "text.bert", "relevance.cbow": "text.cbow",
    "relevance.vectors": "text.vectors", "datasets": "data.readers", "index": "data.caption_index",
    "cache": "data.cache", "caption_features": "data.caption_features", "captions": "data.captions",
    "batches": "data.batches", "rc": "data.image_source", "extract": "data.extract",
    "evaluation": "evaluation.evaluate", "metrics": "evaluation.metrics", "inference": "evaluation.inference",
    "judgments": "evaluation.judgments", "relevance.human": "evaluation.relevance_human",
    "stats": "evaluation.stats", "train": "training.trainer", "factories": "training.factories",
    "runs": "training.run_folder", "curves": "training.curves", "sweep": "training.sweep",
    "batch_eval": "reports.batch_eval", "compare": "reports.compare", "report": "reports.report",
    "plots": "reports.plots", "gallery": "reports.gallery", "embed": "search.embed",
    "search_index": "search.faiss_index", "search": "search.searcher", "serve": "search.serve",
}


class _MovedModules:
    """``import pipeline.<old>`` gives the module it moved to, with a note (a FutureWarning)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        import importlib.util

        old = fullname.removeprefix(__name__ + ".")
        if not fullname.startswith(__name__ + ".") or old not in MOVED or old in LAYERS:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModules)

    @staticmethod
    def create_module(spec):
        import importlib
        import warnings

        new = f"{__name__}.{MOVED[spec.name.removeprefix(__name__ + '.')]}"
        warnings.warn(f"{spec.name} is now {new}; the old path goes in the next version", FutureWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    @staticmethod
    def exec_module(module):
        pass


def _install_moved_modules() -> None:
    import sys

    if not any(isinstance(f, type) and f is _MovedModules for f in sys.meta_path):
        sys.meta_path.append(_MovedModules)


_install_moved_modules()


def moved_name(package: str, name: str):
    """``package.name`` (e.g. ``pipeline.evaluation.format_table``) where ``package`` was a flat
    module of 0.1.0 and is a package now: the name of the module that took the old module's names
    (``MOVED``), with a FutureWarning naming its new path, for one version. A package's module
    ``__getattr__`` calls it; any other name (a submodule not imported yet included: the import
    system asks for it first) is an AttributeError."""
    import importlib
    import importlib.util
    import warnings

    old = package.removeprefix(__name__ + ".")
    missing = AttributeError(f"module {package!r} has no attribute {name!r}")
    if name.startswith("_") or old not in MOVED or importlib.util.find_spec(f"{package}.{name}") is not None:
        raise missing
    home = importlib.import_module(f"{__name__}.{MOVED[old]}")
    value = vars(home).get(name)
    if value is None or not (name.isupper() or getattr(value, "__module__", None) == home.__name__):
        raise missing  # only what the module defines: not what it imported
    warnings.warn(f"{package}.{name} is now {home.__name__}.{name}; the old path goes in the next version",
                  FutureWarning, stacklevel=3)
    return value


# The Python API (``pipeline.api``), handed on from here when first read.
API = ("load_model", "Model", "evaluate", "train")


def __getattr__(name: str):
    if name not in API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.api"), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
