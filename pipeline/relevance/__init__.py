"""Caption–caption relevance: per-caption vectors whose dot product is the relevance.

Methods: ``svd`` (LSEH: TF-IDF + truncated SVD fitted on the training captions), ``bert``
(all-MiniLM-L6-v2 sentence embeddings), ``cbow`` (mean GloVe), ``cbow+bert`` (the ladder
paper's coarse-to-fine gate). No n × n table is ever built: losses get the B × B relevance
of each batch from ``BatchRelevance``.

Modules: ``svd`` (the LSEH vectoriser; ``cbow`` and ``bert`` are caption encoders of
``pipeline.text``, and so is ``text.vectors``, the definition), ``neighbours`` (blockwise
top-n), ``store`` (the HDF5 file), ``batch`` (the batch object), ``stage`` (cache → file).
Relevance scored against human judgments is evaluation: ``evaluation.relevance_human``.

May import: ``pipeline.core``, ``networks``, ``losses``, ``backbones``, ``text``, ``data``.
"""

from pipeline.relevance.batch import BatchRelevance, RelevanceFn
from pipeline.relevance.stage import METHODS, RelevanceSummary, build_relevance, compute_relevance_vectors
from pipeline.relevance.store import RelevanceFile, read_relevance
from pipeline.relevance.svd import SvdModel, project_captions, svd_terms
from pipeline.text.vectors import RelevanceVectors, relevance_matrix

__all__ = ["BatchRelevance", "RelevanceFn", "METHODS", "RelevanceSummary", "build_relevance",
           "compute_relevance_vectors", "RelevanceFile", "read_relevance", "SvdModel",
           "project_captions", "svd_terms", "RelevanceVectors", "relevance_matrix"]
