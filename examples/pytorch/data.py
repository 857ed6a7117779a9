"""An MNIST-shaped synthetic dataset, so the example runs offline.

Each of the 10 classes has a fixed random 28x28 "glyph"; a record is its
class's glyph, shifted by up to 2 pixels and with Gaussian noise. Records are
generated from their index, so the dataset is the same on every rank and on
every run (what Determined's resumable data loading expects).
"""

from __future__ import annotations

import torch

NUM_CLASSES = 10


class SyntheticDigits(torch.utils.data.Dataset):
    def __init__(self, size: int, seed: int = 0, noise: float = 0.6) -> None:
        self.size = size
        self.seed = seed
        self.noise = noise
        glyphs = torch.Generator().manual_seed(1234)
        # Smooth, blob-like class templates (not plain noise), normalized to [0, 1].
        raw = torch.rand(NUM_CLASSES, 1, 7, 7, generator=glyphs)
        self.templates = torch.nn.functional.interpolate(raw, size=(28, 28), mode="bilinear")

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(NUM_CLASSES, (1,), generator=g))
        dx, dy = (int(v) for v in torch.randint(-2, 3, (2,), generator=g))
        image = torch.roll(self.templates[label], shifts=(dx, dy), dims=(1, 2))
        image = image + self.noise * torch.randn(image.shape, generator=g)
        return (image - 0.5) / 0.5, label
