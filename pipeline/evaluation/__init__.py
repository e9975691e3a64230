"""The retrieval protocol: a checkpoint's embeddings of a split (``inference``), the metrics
(``metrics``: R@K, ranks, CS@K; ``metric_table``: the one table ``METRICS``), an evaluation with
its printed table (``evaluate``), `vse evaluate`'s modes (``command``), human judgments
(``judgments``, ``relevance_human``) and statistics (``stats``: rank correlations, seeds,
significance).

May import: ``pipeline.core``, ``networks``, ``losses``, ``backbones``, ``text``, ``data``,
``relevance``.
"""
