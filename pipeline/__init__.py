"""vse: visual-semantic embedding research toolkit (library layer).

Packages by concern, each importing only the ones listed before it (docs/ARCHITECTURE.md):

    core        errors, atomic files, file formats, device and precision, processes, options
                (TrainConfig) and the registry of names, checkpoints, plug-in imports
    models      networks, heads, pools, layers, similarities, losses and their contracts,
                CNN backbones with their engines and pixel preprocessing (pure torch, no files)
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
LAYERS = ("core", "models", "text", "data", "relevance", "evaluation", "training", "reports", "search")
