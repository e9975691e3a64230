"""Losses for training on noisy pairs: ``base`` (``NoisyPairLoss``: what a method may ask of the
trainer, the epoch's phases, the division metrics), ``ncr`` (NCR's co-teaching), ``decl`` (DECL's
evidential loss), ``rcl`` (RCL's complementary contrastive loss). The co-trained networks NCR
asks for (``networks = 2``) are a network: ``pipeline.networks.cotrain``.

May import: ``pipeline.core``.
"""
