"""The declarations of VSE++ and VSE∞ (`--network vse++`, `--network vse-infty`), torch-free: both
are VSE's dual model (``vse_model.VSEModel``, built from a ``ModelConfig``), and differ only by the
pools they set. ``registry.NETWORKS`` names them; ``TrainConfig`` applies and checks them."""

from __future__ import annotations

from pipeline.core.registry import NetworkSpec

MODEL = "pipeline.networks.vse_model:VSEModel"

# VSE++ (Faghri et al. 2018): one vector per image, the GRU's last state per caption; its options
# are TrainConfig's own defaults.
VSE_PLUS_PLUS = NetworkSpec("dual", model=MODEL, vse_heads=True)

# VSE∞ (Chen et al. 2021): sets pooled by GPO on both sides unless --image-pool / --text-pool say
# otherwise.
VSE_INFTY = NetworkSpec("dual", model=MODEL, vse_heads=True,
                        defaults={"image_pool": "gpo", "text_pool": "gpo"})
