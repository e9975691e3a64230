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

The package hands on its public names (``from pipeline.networks import SGR, GPO, build_network``):
every built-in network class (named by the declarations of ``core.registry.NETWORKS``) and set
pool (``core.registry.SET_POOLS``), and the seam's names below, each imported when first read,
so ``import pipeline.networks`` stays torch-free.

May import: ``pipeline.core``.
"""

from __future__ import annotations

from pipeline.core.registry import NETWORKS, SET_POOLS, Registry

# name → "module:attribute" of every public name: the registries' classes, then the seam's.
PUBLIC = Registry("name", {
    **{spec.rpartition(":")[2]: spec for spec in (NETWORKS.spec(name).model for name in NETWORKS)},
    **{spec.rpartition(":")[2]: spec for spec in SET_POOLS.values()},
    **{name: f"pipeline.networks.network:{name}" for name in (
        "DualNetwork", "PairwiseNetwork", "NetworkConfig", "build_network", "network_kind")},
    **{name: f"pipeline.networks.vse_model:{name}" for name in ("ModelConfig", "model_of_checkpoint")},
    "CoTrained": "pipeline.networks.cotrain:CoTrained",
    **{name: f"pipeline.networks.heads:{name}" for name in ("build_pool", "pool_class", "SetImageHead",
                                                           "BiGRUTextEncoder", "TokenSetTextEncoder")},
    "run_network_contract": "pipeline.networks.network_check:run_network_contract",
    "run_pool_contract": "pipeline.networks.pool_check:run_pool_contract",
})
__all__ = list(PUBLIC)

__getattr__, __dir__ = PUBLIC.face(globals())
