"""A trained model put to work: `vse embed` (``embed``), the embeddings file it writes
(``embeddings_file``), the FAISS index built from it (``index_build``: `vse index`) and read back
(``index_reader``; ``faiss_index`` re-exports both under their old names), queries (``searcher``)
and the web service with its page (``serve``, ``page.html``).

May import: every other package.

0.1.0's flat ``pipeline.search`` is this package now: its names are handed on from the module that
took them, with a note, for one version (``pipeline.moved_name``).
"""

from __future__ import annotations


def __getattr__(name: str):
    from pipeline import moved_name

    return moved_name(__name__, name)
