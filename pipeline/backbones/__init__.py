"""Image backbones and how they run, for extraction and RC training: the CNNs with their
preprocessing (``cnns``: ``load_backbone``, ``Backbone``, ``Preprocessing``; the names in
``core.registry.BACKBONES``), the engines that run them (``engines``: torch, ONNX Runtime),
crops of an image (``crops``: ``CropPlan``) and pixels to features inside training
(``pixels``: ``PixelBackbone`` and the one normalisation of pixels).

May import: ``pipeline.core``.
"""
