"""Caption text: the vocabulary and tokenizer (``vocabulary``), GloVe word vectors (``glove``),
and sentence encoders that turn captions into vectors (``encoders``: MiniLM in ``bert``, mean
GloVe in ``cbow``; the vector definition in ``vectors``).

May import: ``pipeline.core``.
"""
