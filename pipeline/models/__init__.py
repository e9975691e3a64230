"""Networks and what they are trained with: the joint-embedding model (``vse_model``), set
heads and pools (``heads``, ``set_augment``), shared layers (``layers``), similarity functions
(``similarity``), losses with their contract and plug-ins (``losses``, ``loss_plugins``,
``loss_check``, ``pool_check``), CNN backbones, who runs them and their pixel preprocessing
(``backbones``, ``engines``, ``crops``). Tensors in, tensors out: no dataset files.

May import: ``pipeline.core``.
"""
