"""`vse check-network`: the pairwise-network contract passes on the built-ins and the example, and
fails, naming the check, on networks that break it."""

from __future__ import annotations

import pytest
from conftest import vse

from pipeline.networks.network_check import run_network_contract


@pytest.mark.parametrize("spec", ["sgr", "saf", "examples/scan_network.py:SCANt2i"])
@pytest.mark.parametrize("words", [False, True])
def test_the_built_ins_and_the_example_keep_the_contract(spec, words):
    results = run_network_contract(spec, {"sim_dim": 8} if spec in ("sgr", "saf") else None, words=words,
                                   timing=False)
    assert len(results) == 6 and all(r.ok for r in results), [(r.check, r.detail) for r in results]


BROKEN = '''
import torch
from torch import nn
from pipeline.networks.network import PairwiseNetwork


class ReadsPadding(PairwiseNetwork):
    """Mean over every token position, padding included."""

    def __init__(self, config):
        super().__init__(config)
        self.img = nn.Linear(config.feature_dim, config.embed_dim)
        self.txt = nn.Linear(config.text_dim, config.embed_dim)

    def encode_images(self, images):
        return self.img(images).mean(1)

    def encode_captions(self, captions, lengths):
        return self.txt(captions).mean(1)

    def score(self, image_block, caption_block):
        return image_block @ caption_block.T


class BatchCoupled(ReadsPadding):
    """Each image's vector minus the block's mean: a score that depends on the other images."""

    def encode_images(self, images):
        v = self.img(images).mean(1)
        return v - v.mean(0, keepdim=True)

    def encode_captions(self, captions, lengths):
        mask = (torch.arange(captions.shape[1])[None] < lengths[:, None]).to(captions.dtype)
        return self.txt((captions * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))
'''


def test_a_network_that_reads_padding_or_couples_the_batch_fails(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN)
    reads = {r.check: r.ok for r in run_network_contract(f"{path}:ReadsPadding", timing=False)}
    assert reads["padding never read"] is False
    coupled = {r.check: r.ok for r in run_network_contract(f"{path}:BatchCoupled", timing=False)}
    assert coupled["a block's scores = each pair scored alone"] is False and coupled["padding never read"]
    result = vse("check-network", f"{path}:ReadsPadding")
    assert result.exit_code == 1 and "FAIL" in result.output


def test_a_network_that_cannot_be_built_is_one_line(tmp_path):
    result = vse("check-network", "sgr", "--network-option", "sgr_stepz=2")
    assert result.exit_code == 1 and "no option sgr_stepz" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
