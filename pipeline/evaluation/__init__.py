"""The retrieval protocol: a checkpoint's embeddings of a split (``inference``), the metrics
(``metrics``: R@K, ranks, CS@K; ``metric_table``: the one table ``METRICS``), an evaluation with
its printed table (``evaluate``), `vse evaluate`'s modes (``command``), human judgments
(``judgments``, ``relevance_human``) and statistics (``stats``: rank correlations, seeds,
significance).

May import: ``pipeline.core``, ``networks``, ``losses``, ``backbones``, ``text``, ``data``,
``relevance``.

0.1.0's flat ``pipeline.evaluation`` is this package now: its names are handed on from the module that
took them, with a note, for one version (``pipeline.moved_name``).
"""

from __future__ import annotations


def __getattr__(name: str):
    from pipeline import moved_name

    return moved_name(__name__, name)
