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
"""

__version__ = "0.1.0"

# The packages in the order above: each may import only those before it (tests/test_layers.py).
LAYERS = ("core", "networks", "losses", "backbones", "text", "data", "relevance", "evaluation", "training",
          "reports", "search")
# Packages of one floor: each imports core and none of the others (tests/test_layers.py).
SIDE_BY_SIDE = ("networks", "losses", "backbones")

# Where each module of the flat layout (version 0.1.0 before the split by concern) went. A user's
# plug-in (FILE.py:Class) that imports an old path, e.g. ``from pipeline.losses import
# MaxHingeLoss``, still works for one version, with a note; the old names that are packages now
# (losses, backbones, text, evaluation, search) cannot be kept. The modules of ``pipeline.models``
# (0.1.0's second layout) have their own table: ``pipeline.models``.
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
