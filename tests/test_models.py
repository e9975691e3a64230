import torch

from pipeline.networks.vse_model import ModelConfig, VSEModel


def _batch(vocab=50, dim=12, b=4):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(b, dim, generator=g)
    lengths = torch.tensor([5, 3, 4, 2])
    tokens = torch.randint(4, vocab, (b, 5), generator=g)
    tokens[torch.arange(5)[None, :] >= lengths[:, None]] = 0
    return feats, tokens, lengths


def test_embeddings_are_unit_norm_and_images_optionally_not():
    feats, tokens, lengths = _batch()
    model = VSEModel(ModelConfig(vocab_size=50, feature_dim=12, embed_dim=8, word_dim=6))
    img, cap = model(feats, tokens, lengths)
    assert img.shape == cap.shape == (4, 8)
    torch.testing.assert_close(img.norm(dim=1), torch.ones(4))
    torch.testing.assert_close(cap.norm(dim=1), torch.ones(4))
    vse0 = VSEModel(ModelConfig(vocab_size=50, feature_dim=12, embed_dim=8, word_dim=6, img_norm=False))
    assert not torch.allclose(vse0.image_encoder(feats).norm(dim=1), torch.ones(4))


def test_caption_embedding_ignores_padding():
    """The last valid hidden state must not depend on what follows the caption."""
    torch.manual_seed(0)
    model = VSEModel(ModelConfig(vocab_size=50, feature_dim=12, embed_dim=8, word_dim=6)).eval()
    tokens = torch.tensor([[1, 7, 9, 2, 0, 0]])
    longer = torch.tensor([[1, 7, 9, 2, 0, 0, 0, 0, 0]])
    a = model.text_encoder(tokens, torch.tensor([4]))
    b = model.text_encoder(longer, torch.tensor([4]))
    alone = model.text_encoder(tokens[:, :4], torch.tensor([4]))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, alone)


def test_order_variant_is_nonnegative():
    feats, tokens, lengths = _batch()
    model = VSEModel(ModelConfig(vocab_size=50, feature_dim=12, embed_dim=8, word_dim=6, similarity="order"))
    img, cap = model(feats, tokens, lengths)
    assert (img >= 0).all() and (cap >= 0).all()


def test_projection_is_xavier_uniform_with_zero_bias():
    torch.manual_seed(0)
    model = VSEModel(ModelConfig(vocab_size=10, feature_dim=2048, embed_dim=1024, word_dim=4))
    w = model.image_encoder.proj.weight
    bound = (6.0 / (2048 + 1024)) ** 0.5
    assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
    assert model.image_encoder.proj.bias.abs().sum() == 0


def test_mlp_heads_for_convse():
    feats, tokens, lengths = _batch()
    cfg = ModelConfig(vocab_size=50, feature_dim=12, embed_dim=8, word_dim=6, projection="mlp", mlp_hidden=16)
    model = VSEModel(cfg)
    img, cap = model(feats, tokens, lengths)
    assert model.image_encoder.proj[0].out_features == 16
    assert model.text_encoder.head is not None
    torch.testing.assert_close(cap.norm(dim=1), torch.ones(4))
