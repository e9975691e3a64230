"""The declaration of VSRN (`--network vsrn`; Li et al., ICCV 2019), torch-free: VSE's dual model
(``vse_model.VSEModel``) whose image side is the set pool ``vsrn.VSRNReasoning`` and whose
caption-generation branch (``vsrn.CaptionDecoder``) trains with it. Its presets (the authors'),
its own options (``VSRNOptions``) and its rule sit here; the layers in ``vsrn``."""

from __future__ import annotations

import dataclasses

from pipeline.core.errors import VseError
from pipeline.core.registry import LAST, NetworkSpec

# The two image encoders of their EncoderImagePrecompAttn (model.py:200-280), by their data_name:
# f30k_precomp has no norm after fc and a BatchNorm1d on the image vector; every other name
# (coco_precomp, f8k_precomp, ...) normalises the fc output over the regions and has no BatchNorm.
VARIANTS = {"f30k": {"region_norm": False, "image_bn": True},
            "coco": {"region_norm": True, "image_bn": False}}


@dataclasses.dataclass(frozen=True)
class VSRNOptions:
    """`--network vsrn`'s own options (``--network-option NAME=VALUE``); the defaults are the
    authors' (train.py's and their README's)."""

    variant: str = "auto"              # f30k | coco | auto (f30k for imported region sets, unless
                                       # their folder names COCO; coco for CNN grids: ``resolve_variant``)
    caption_max_len: int = 60          # --max_len: captions cut to this many tokens in the caption branch
    caption_dropout: float = 0.2       # --input_dropout_p: after the caption encoder's input map, and on
                                       # the decoder's inputs at every step
    caption_hidden: int = 512          # --dim_hidden: the caption encoder's and decoder's GRUs
    caption_word_dim: int = 300        # --dim_word: the decoder's word embeddings
    caption_params_twice: bool = True  # their Adam list holds the caption model twice (model.py:456-460)

    def __post_init__(self):
        if self.variant not in ("auto", *VARIANTS):
            raise ValueError(f"variant must be auto, {' or '.join(VARIANTS)}, got {self.variant!r}")
        if self.caption_max_len < 2 or self.caption_hidden < 1 or self.caption_word_dim < 1:
            raise ValueError("caption_max_len must be >= 2, caption_hidden and caption_word_dim >= 1")
        if not 0 <= self.caption_dropout < 1:
            raise ValueError(f"caption_dropout must be in [0, 1), got {self.caption_dropout}")


def check_pools(config) -> None:
    """VSRN reasons over the members with its own pool and reads captions with VSE++'s GRU."""
    if config.image_pool != "vsrn" or config.text_pool != LAST:
        raise VseError("--network vsrn reasons over the members with its own pool and reads captions "
                       "with VSE++'s GRU: drop --image-pool and --text-pool")


VSRN = NetworkSpec(
    "dual", model="pipeline.networks.vse_model:VSEModel", vse_heads=True, Options=VSRNOptions,
    rules=(check_pools,), model_fields="pipeline.networks.vsrn:model_fields",
    defaults={"image_pool": "vsrn", "size_augment": "none",    # VSRN does not drop regions,
              "caption_loss_weight": 1.0, "embed_dim": 2048})  # writes captions from them; train.py's size
