#!/usr/bin/env python3
"""Train a small sequence model built on lltm_core.LLTM: next-step prediction of noisy sine waves.

    python examples/train_sequence.py [--steps 150] [--backend NAME] [--device cuda]

Each sequence is a sine wave with a random frequency and phase plus noise; the
model reads it one step at a time and predicts the next clean value.  The
LLTM backend is whatever lltm-core chooses for the device (or --backend).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import lltm_core


class SinePredictor(torch.nn.Module):
    def __init__(self, state_size: int = 32, backend: str | None = None, device=None):
        super().__init__()
        self.cell = lltm_core.LLTM(1, state_size, backend=backend, device=device)
        self.head = torch.nn.Linear(state_size, 1, device=device)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        """sequence (batch, time) -> predictions of the next value at each step, (batch, time)."""
        batch, steps = sequence.shape
        h = sequence.new_zeros(batch, self.cell.state_size)
        c = sequence.new_zeros(batch, self.cell.state_size)
        outputs = []
        for t in range(steps):
            h, c = self.cell(sequence[:, t : t + 1], (h, c))
            outputs.append(self.head(h))
        return torch.cat(outputs, dim=1)


def make_batch(batch: int, steps: int, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    freq = 0.1 + 0.3 * torch.rand(batch, 1, generator=generator)
    phase = 2 * math.pi * torch.rand(batch, 1, generator=generator)
    t = torch.arange(steps + 1, dtype=torch.float32)
    clean = torch.sin(freq * t + phase)
    noisy = clean + 0.05 * torch.randn(clean.shape, generator=generator)
    return noisy[:, :-1].to(device), clean[:, 1:].to(device)


def train(steps: int = 150, *, batch: int = 32, length: int = 30, backend: str | None = None,
          device: str = "cpu", seed: int = 0, log_every: int = 25, quiet: bool = False) -> list[float]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = SinePredictor(backend=backend, device=device)
    chosen = lltm_core.get_backend(backend, device=device, dtype=torch.float32).name
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if not quiet:
        print(f"training on {device} with lltm backend {chosen!r} ({steps} steps, batch {batch}, length {length})")
    losses = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        inputs, targets = make_batch(batch, length, generator, device)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if not quiet and (step % log_every == 0 or step == 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  ({time.perf_counter() - start:.1f} s)")
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--backend", default=None, help="lltm backend name (default: the best available)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    losses = train(args.steps, backend=args.backend, device=args.device)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    print(f"mean loss of the first 10 steps {first:.4f}, of the last 10 steps {last:.4f}")


if __name__ == "__main__":
    main()
