"""A trained model put to work: `vse embed` (``embed``), the FAISS index (``faiss_index``),
queries (``searcher``) and the web service with its page (``serve``, ``page.html``).

May import: every other package.
"""
