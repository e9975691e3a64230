"""SGRAF scored the authors' way, one caption at a time, in the structure of the authors'
``EncoderSimilarity.forward`` (each caption sliced to its length, repeated over the images,
``SCAN_attention``, one node vector per word, then SGR's steps or SAF's filtration), reading the
weights of a batched ``pipeline.networks.sgraf`` model by name. It is the "bare loop of the same
modules" of bench/sgraf.py. The tests compare SGR and SAF with the authors' file itself
(tests/test_sgraf_golden.py, bundles of Paranioar/SGRAF's model.py), not with this loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def l2norm(x, dim, eps=1e-8):
    norm = torch.pow(x, 2).sum(dim=dim, keepdim=True).sqrt() + eps
    return torch.div(x, norm)


def l1norm(x, dim, eps=1e-8):
    norm = torch.abs(x).sum(dim=dim, keepdim=True) + eps
    return torch.div(x, norm)


def scan_attention(query, context, smooth, eps=1e-8):
    """query (n, L, d), context (n, K, d) → the attended context (n, L, d), L2-normalised."""
    query_t = torch.transpose(query, 1, 2)
    attn = torch.bmm(context, query_t)                      # (n, K, L)
    attn = nn.LeakyReLU(0.1)(attn)
    attn = l2norm(attn, 2)                                  # over the words
    attn = torch.transpose(attn, 1, 2).contiguous()         # (n, L, K)
    attn = F.softmax(attn * smooth, dim=2)                  # over the members
    attn_t = torch.transpose(attn, 1, 2).contiguous()
    context_t = torch.transpose(context, 1, 2)
    weighted = torch.bmm(context_t, attn_t)
    weighted = torch.transpose(weighted, 1, 2)
    return l2norm(weighted, dim=-1)


def visual_sa(m, local, raw_global):
    l_emb = m.embedding_local(local)
    g_emb = m.embedding_global(raw_global)
    g_emb = g_emb.unsqueeze(1).repeat(1, l_emb.size(1), 1)
    weights = m.embedding_common(l_emb.mul(g_emb)).squeeze(2)
    weights = torch.softmax(weights, dim=1)
    return l2norm((weights.unsqueeze(2) * local).sum(dim=1), dim=-1)


def text_sa(m, local, raw_global):
    return visual_sa(m, local, raw_global)  # the same formula, its own layers (no BatchNorm)


def graph_reasoning(m, sim_emb):
    query = m.graph_query_w(sim_emb)
    key = m.graph_key_w(sim_emb)
    edge = torch.softmax(torch.bmm(query, key.permute(0, 2, 1)), dim=-1)
    return torch.relu(m.sim_graph_w(torch.bmm(edge, sim_emb)))


def attention_filtration(m, sim_emb):
    attn = l1norm(torch.sigmoid(m.bn(m.attn_sim_w(sim_emb).permute(0, 2, 1))), dim=-1)
    saf = torch.matmul(attn, sim_emb)
    return l2norm(saf.squeeze(1), dim=-1)


def image_embeddings(model, images):
    return l2norm(model.img_fc(images), dim=-1)


def caption_embeddings(model, captions, lengths):
    """Word ids through embedding → dropout → BiGRU (directions averaged), or token vectors
    through the linear; then each word L2-normalised."""
    if model.config.vocab_size:
        x = model.word_dropout(model.embed(captions))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = model.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        half = out.size(2) // 2
        out = (out[:, :, :half] + out[:, :, half:]) / 2
    else:
        out = model.text_fc(model.word_dropout(captions))
    return l2norm(out, dim=-1)


def scores(model, images, captions, lengths):
    """(n_image, n_caption): ``EncoderSimilarity.forward`` of the batched model's weights."""
    img_emb = image_embeddings(model, images)
    cap_emb = caption_embeddings(model, captions, lengths)
    n_image, n_caption = img_emb.size(0), cap_emb.size(0)
    img_glo = visual_sa(model.v_global_w, img_emb, torch.mean(img_emb, 1))
    sim_all = []
    for i in range(n_caption):
        n_word = int(lengths[i])
        cap_i = cap_emb[i, :n_word, :].unsqueeze(0)
        cap_i_expand = cap_i.repeat(n_image, 1, 1)
        cap_glo_i = text_sa(model.t_global_w, cap_i, torch.mean(cap_i, 1))
        context = scan_attention(cap_i_expand, img_emb, smooth=model.options.smooth)
        sim_loc = l2norm(model.sim_tranloc_w(torch.pow(torch.sub(context, cap_i_expand), 2)), dim=-1)
        sim_glo = l2norm(model.sim_tranglo_w(torch.pow(torch.sub(img_glo, cap_glo_i), 2)), dim=-1)
        sim_emb = torch.cat([sim_glo.unsqueeze(1), sim_loc], 1)
        if hasattr(model, "SGR_module"):
            for module in model.SGR_module:
                sim_emb = graph_reasoning(module, sim_emb)
            sim_vec = sim_emb[:, 0, :]
        else:
            sim_vec = attention_filtration(model.SAF_module, sim_emb)
        sim_all.append(torch.sigmoid(model.sim_eval_w(sim_vec)))
    return torch.cat(sim_all, 1)
