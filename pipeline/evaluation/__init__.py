"""The retrieval protocol: a checkpoint's embeddings of a split (``inference``), the metrics
(``metrics``: R@K, ranks, CS@K, the one table ``METRICS``), an evaluation with its printed table
(``evaluate``), human judgments (``judgments``, ``relevance_human``) and seed statistics
(``stats``).

May import: ``pipeline.core``, ``models``, ``text``, ``data``, ``relevance``.
"""
