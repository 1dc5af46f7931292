"""The course's models, shared by chapters 02, 04, 05 and 06 and the scripts they launch."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """The source's MLP (section 4.2), made whole: it flattens the image first."""

    def __init__(self, in_dim: int = 784, hidden_dim: int = 256, out_dim: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x.flatten(1))))


class SmallCNN(nn.Module):
    """Two conv blocks (conv, BatchNorm, ReLU, max-pool) and a linear head: 28x28 -> 10 classes."""

    def __init__(self, channels: int = 16, out_dim: int = 10, dropout: float = 0.25) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
            return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

        c = channels
        self.features = nn.Sequential(block(1, c), block(c, 2 * c))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * c * 7 * 7, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


#: The models of chapter 05's training script, by the name its ``--model`` flag takes.
MODELS: dict[str, type[nn.Module]] = {"cnn": SmallCNN, "mlp": MLP}
