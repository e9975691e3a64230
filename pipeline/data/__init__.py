"""Where the data lives and how it is read: dataset readers (``readers``), the caption index
(``caption_index``), the HDF5 feature cache (``cache``) and `vse extract` that writes it
(``extract``), caption-feature files (``caption_features``), the caption side of training
(``captions``), and where training pairs come from: cached features (``batches``) or images
through the CNN every step (``image_source``, RC mode), and the noise indexes of training on
noisy pairs (``noise``).

May import: ``pipeline.core``, ``pipeline.networks``, ``pipeline.backbones``, ``pipeline.text``.
"""
