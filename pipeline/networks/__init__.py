"""Networks: what turns a batch of image features and captions into scores, each family one file
beside its torch-free declaration (``*_spec``, which ``core.registry.NETWORKS`` names).

- the base and the seam (``network``: ``DualNetwork``, ``PairwiseNetwork``, ``NetworkConfig``,
  ``build_network``, a network's kind and options);
- the dual networks: VSE++ and VSE∞ (``vse_model`` + ``vse_spec``: ``VSEModel``, the GRU caption
  encoder), their set heads and pools (``heads``), size augmentation (``set_augment``) and shared
  layers (``layers``); VSRN (``vsrn`` + ``vsrn_spec``);
- the pairwise ones: SGR and SAF (``sgraf`` + ``sgraf_spec``, their similarity nodes in
  ``sgraf_ops``); k copies of a network trained together (``cotrain``, NCR's co-teaching);
- the checks: ``network_check`` (`vse check-network`), ``pool_check`` (`vse check-pool`).

Pure torch, tensors in and tensors out: no dataset files, no loss.

May import: ``pipeline.core``.
"""
