"""SCAN's text-to-image stacked cross attention (Lee et al., ECCV 2018; t2i, AVG pooling): an
example of a `vse` pairwise-network plug-in, not a reproduction of the authors' numbers.

    vse check-network examples/scan_network.py:SCANt2i
    vse train --features cache/demo_grid.h5 --text-features cache/demo_minilm_tokens.h5 \\
        --network examples/scan_network.py:SCANt2i --network-option smooth=9.0 --run-dir runs/scan

A pairwise network subclasses ``pipeline.networks.network.PairwiseNetwork`` (or has the same
members). It is built as ``Class(config)`` from a ``NetworkConfig`` (feature_dim, set_size,
embed_dim, vocab_size or text_dim, and ``options``: its own ``Options`` dataclass, checked by
the base class). It encodes a batch of images into an image block and a batch of captions into
a caption block, and ``score(image_block, caption_block)`` gives the (Bi, Bc) score of every
pair. Positions past a caption's length are padding that it must never read.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.networks.network import PairwiseNetwork


@dataclass(frozen=True)
class SCANOptions:
    smooth: float = 9.0   # λ1 of the attention's softmax over regions
    lambda_lse: float = 0.0  # > 0: LogSumExp pooling over words with this λ2; 0: the mean (AVG)


class SCANt2i(PairwiseNetwork):
    """Each word attends over the image's members; the pair's score is the mean over the words of
    cos(word, its attended context)."""

    Options = SCANOptions

    def __init__(self, config):
        super().__init__(config)
        self.img_fc = nn.Linear(config.feature_dim, config.embed_dim)
        if config.vocab_size:
            self.embed = nn.Embedding(config.vocab_size, config.word_dim, padding_idx=0)
            self.text = nn.GRU(config.word_dim, config.embed_dim, batch_first=True, bidirectional=True)
        else:
            self.text = nn.Linear(config.text_dim, config.embed_dim)

    def encode_images(self, images):
        return F.normalize(self.img_fc(images.to(self.img_fc.weight.dtype)), dim=-1)

    def encode_captions(self, captions, lengths):
        width = int(lengths.max())
        mask = torch.arange(width)[None] < lengths[:, None]
        if self.config.vocab_size:
            # packed: the backward direction of a BiGRU would otherwise read the padding first
            packed = nn.utils.rnn.pack_padded_sequence(self.embed(captions[:, :width]), lengths.cpu(),
                                                       batch_first=True, enforce_sorted=False)
            out, _ = nn.utils.rnn.pad_packed_sequence(self.text(packed)[0], batch_first=True,
                                                      total_length=width)
            half = out.shape[-1] // 2
            words = (out[..., :half] + out[..., half:]) / 2
        else:
            words = self.text(captions[:, :width].to(self.text.weight.dtype))
        mask = mask.to(words.device)
        return words.masked_fill(~mask[..., None], 0.0), mask

    def score(self, image_block, caption_block):
        regions, (words, mask) = image_block, caption_block
        # attention of every word of every caption over every region of every image
        attn = F.leaky_relu(torch.einsum("ike,cle->iclk", regions, words), 0.1)
        attn = F.normalize(attn.masked_fill(~mask[None, :, :, None], 0.0), dim=2)
        attn = torch.softmax(self.options.smooth * attn, dim=-1)
        context = torch.einsum("iclk,ike->icle", attn, regions)
        cosine = F.cosine_similarity(context, words[None], dim=-1).masked_fill(~mask[None], 0.0)
        if self.options.lambda_lse > 0:
            lse = torch.exp(self.options.lambda_lse * cosine).masked_fill(~mask[None], 0.0).sum(-1)
            return torch.log(lse) / self.options.lambda_lse
        return cosine.sum(-1) / mask.sum(-1)[None].to(cosine.dtype)
