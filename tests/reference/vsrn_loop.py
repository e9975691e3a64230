"""VSRN's image encoder (their coco_precomp one) in the structure of their
``EncoderImagePrecompAttn.forward`` and ``GCN_lib/Rs_GCN.py`` (1 × 1 Conv1d on (B, E, K)
tensors, their no-eps ``l2norm`` over dim 1), for bench/vsrn.py's timing of the authors' form.
It is NOT the authors' file: tests/test_vsrn_golden.py compares ``pipeline.networks.vsrn`` with
their code itself (tests/golden/vsrn_*.npz).
It reads the weights of a ``SetImageHead`` whose pool is ``VSRNReasoning``.
"""

from __future__ import annotations

import torch
from torch import nn


def l2norm(x):
    """Their l2norm: over dim 1, no eps."""
    norm = torch.pow(x, 2).sum(dim=1, keepdim=True).sqrt()
    return torch.div(x, norm)


def conv(linear: nn.Linear) -> nn.Conv1d:
    layer = nn.Conv1d(linear.in_features, linear.out_features, kernel_size=1).to(linear.weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(linear.weight[..., None])
        layer.bias.copy_(linear.bias)
    return layer


class RsGCN(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.inter_channels = layer.g.out_features
        self.g, self.theta, self.phi = conv(layer.g), conv(layer.theta), conv(layer.phi)
        self.W = nn.Sequential(conv(layer.W), layer.bn)  # the BatchNorm module itself: its statistics

    def forward(self, v):
        batch_size = v.size(0)
        g_v = self.g(v).view(batch_size, self.inter_channels, -1).permute(0, 2, 1)
        theta_v = self.theta(v).view(batch_size, self.inter_channels, -1).permute(0, 2, 1)
        phi_v = self.phi(v).view(batch_size, self.inter_channels, -1)
        R = torch.matmul(theta_v, phi_v)
        R_div_C = R / R.size(-1)
        y = torch.matmul(R_div_C, g_v).permute(0, 2, 1).contiguous()
        y = y.view(batch_size, self.inter_channels, *v.size()[2:])
        return self.W(y) + v


def image_embeddings(head, images):
    """``EncoderImagePrecompAttn.forward`` (not f30k_precomp) with ``head``'s weights."""
    pool = head.pool
    fc_img_emd = l2norm(head.fc(images))
    gcn = fc_img_emd.permute(0, 2, 1)
    for layer in pool.gcn:
        gcn = RsGCN(layer)(gcn)
    gcn = l2norm(gcn.permute(0, 2, 1))
    _, hidden_state = pool.rnn(gcn)
    return l2norm(hidden_state[0])

