"""Small float64 batches for the loss tests (tests/test_losses.py, tests/test_loss_authors_code.py):
a score table made exact, and random unit embeddings with shared images and a relevance matrix."""

import torch


def pairs_with_scores(scores):
    """Embeddings whose inner-product table is exactly ``scores`` (images = identity)."""
    scores = torch.tensor(scores, dtype=torch.float64)
    return torch.eye(len(scores), dtype=torch.float64), scores.T.contiguous()


def random_batch(seed, size=7, dim=5, order=False):
    gen = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(size, dim, generator=gen,
                                                    dtype=torch.float64), dim=1)
    cap = torch.nn.functional.normalize(img + 0.8 * torch.randn(size, dim, generator=gen,
                                                                dtype=torch.float64), dim=1)
    if order:
        img, cap = img.abs(), cap.abs()
    ids = torch.tensor([0, 0, 1, 2, 2, 2, 3][:size])  # pairs sharing an image
    rel = torch.rand(size, size, generator=gen, dtype=torch.float64) * 0.5 + 0.4
    rel = (rel + rel.T) / 2  # spans both sides of the ladder threshold 0.63
    rel.fill_diagonal_(1.0)
    return img, cap, ids, rel
