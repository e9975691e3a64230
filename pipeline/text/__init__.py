"""Caption text: the vocabulary and tokenizer (``vocabulary``), GloVe word vectors (``glove``),
and sentence encoders that turn captions into vectors (``encoders``: MiniLM in ``bert``, mean
GloVe in ``cbow``; the vector definition in ``vectors``).

May import: ``pipeline.core``.
"""

from __future__ import annotations


def __getattr__(name: str):
    """0.1.0's ``pipeline.text`` module (now ``text.vocabulary``): its names, with a note."""
    from pipeline import moved_name

    return moved_name(__name__, name)
