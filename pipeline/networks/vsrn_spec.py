"""The declaration of VSRN (`--network vsrn`; Li et al., ICCV 2019), torch-free: VSE's dual model
(``vse_model.VSEModel``) whose image side is the set pool ``vsrn.VSRNReasoning`` and whose
caption-generation branch (``vsrn.CaptionDecoder``) trains with it. Its presets (the authors'),
its own options (``VSRNOptions``) and its rule sit here; the layers in ``vsrn``."""

from __future__ import annotations

import dataclasses

from pipeline.core.errors import VseError
from pipeline.core.registry import LAST, NetworkSpec
from pipeline.core.values import declare

# The two image encoders of their EncoderImagePrecompAttn (model.py:200-280), by their data_name:
# f30k_precomp has no norm after fc and a BatchNorm1d on the image vector; every other name
# (coco_precomp, f8k_precomp, ...) normalises the fc output over the regions and has no BatchNorm.
VARIANTS = {"f30k": {"region_norm": False, "image_bn": True},
            "coco": {"region_norm": True, "image_bn": False}}


@dataclasses.dataclass(frozen=True)
class VSRNOptions:
    """`--network vsrn`'s own options (``--network-option NAME=VALUE``); the defaults are the
    authors' (train.py's and their README's)."""

    variant: str = declare("auto", "f30k or coco: how region features are normalised (auto: f30k for "
                           "imported region sets unless their folder names COCO, coco for CNN grids; "
                           "resolve_variant).", choices=("auto", *VARIANTS))
    caption_max_len: int = declare(60, "Captions cut to this many tokens in the caption branch (--max_len).",
                                   low=2)
    caption_dropout: float = declare(0.2, "Dropout after the caption encoder's input map and on the "
                                     "decoder's inputs at every step (--input_dropout_p).", low=0, below=1)
    caption_hidden: int = declare(512, "The caption encoder's and decoder's GRU size (--dim_hidden).", low=1)
    caption_word_dim: int = declare(300, "The decoder's word embedding size (--dim_word).", low=1)
    caption_params_twice: bool = declare(True, "Adam's parameter list holds the caption model twice, as "
                                         "the authors' does (model.py:456-460).")


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
