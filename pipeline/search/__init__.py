"""A trained model put to work: `vse embed` (``embed``), the embeddings file it writes
(``embeddings_file``), the FAISS index built from it (``index_build``: `vse index`) and read back
(``index_reader``; ``faiss_index`` re-exports both under their old names), queries (``searcher``)
and the web service with its page (``serve``, ``page.html``).

May import: every other package.
"""
