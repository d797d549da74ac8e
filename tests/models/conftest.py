"""What the model tests share: random padded sentences."""

import torch


def random_sentences(seed: int, n: int, V: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, T], lengths [n]): ``n`` sentences of uniformly random lengths 1..T over ``V``
    words, padded with -1, drawn by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    tokens = torch.randint(0, V, (n, T), generator=g)
    tokens[torch.arange(T)[None, :] >= lengths[:, None]] = -1
    return tokens, lengths
