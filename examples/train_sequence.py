#!/usr/bin/env python3
"""Train a small sequence model on lltm_core.LLTMLayer: next-step prediction of noisy sine waves.

    python examples/train_sequence.py [--steps 150] [--backend NAME] [--device cuda] [--layers 2]
                                      [--bidirectional] [--save ckpt.pt [--save-every K]] [--resume ckpt.pt]
    torchrun --nproc-per-node 2 examples/train_sequence.py [the same options]

Each sequence is a sine wave with a random frequency and phase plus noise; the
model reads it and predicts the next clean value at every step.  The LLTM
backend is whatever lltm-core chooses for the device (or --backend).

Under torchrun (found through its environment variables) every process trains
the same model with DistributedDataParallel: gloo on CPU, NCCL on CUDA (each
process on cuda:LOCAL_RANK).  Every process draws the same global batch from
the same generator and takes its own slice of it, so a run is deterministic
and computes what one process would on the whole batch (up to rounding, with
--dropout 0).  Rank 0 prints the loss averaged over all processes and writes
the checkpoints; every rank reads them.

A checkpoint holds the model, the optimiser, the step, the losses so far and
the random states (the data generator's, and each rank's torch CPU and, on a
GPU, CUDA states, which drive dropout), so a run resumed from it prints the
same losses as one never interrupted.  --steps is the step to stop after,
counted from the start of training, not from the checkpoint.  (Python's
``random`` and numpy are not used, so they are not saved.)  --bidirectional
lets the model read the future, so it learns faster than a forecaster could:
it is there to exercise the layer, not the task.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import lltm_core

CHECKPOINT_FORMAT = 1
# What fixes the shapes of the model and the data: a checkpoint is resumed only with the same values.
MODEL_CONFIG = ("state_size", "layers", "bidirectional", "dtype")


class SinePredictor(torch.nn.Module):
    def __init__(self, state_size: int = 32, layers: int = 2, *, bidirectional: bool = False, dropout: float = 0.0,
                 backend: str | None = None, device=None, dtype=None):
        super().__init__()
        self.lltm = lltm_core.LLTMLayer(1, state_size, layers, batch_first=True, dropout=dropout,
                                        bidirectional=bidirectional, backend=backend, device=device, dtype=dtype)
        directions = 2 if bidirectional else 1
        self.head = torch.nn.Linear(directions * state_size, 1, device=device, dtype=dtype)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        """sequence (batch, time) -> predictions of the next value at each step, (batch, time)."""
        output, _ = self.lltm(sequence.unsqueeze(-1))
        return self.head(output).squeeze(-1)


def make_batch(batch: int, steps: int, generator: torch.Generator, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of noisy sine waves and their next clean values, drawn on the CPU from ``generator``."""
    freq = 0.1 + 0.3 * torch.rand(batch, 1, generator=generator, dtype=dtype)
    phase = 2 * math.pi * torch.rand(batch, 1, generator=generator, dtype=dtype)
    t = torch.arange(steps + 1, dtype=dtype)
    clean = torch.sin(freq * t + phase)
    noisy = clean + 0.05 * torch.randn(clean.shape, generator=generator, dtype=dtype)
    return noisy[:, :-1], clean[:, 1:]


def _rank_rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rank_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def train(steps: int = 150, *, batch: int = 32, length: int = 30, state_size: int = 32, layers: int = 2,
          bidirectional: bool = False, dropout: float = 0.1, lr: float = 2e-2, backend: str | None = None,
          device="cpu", dtype=torch.float32, seed: int = 0, save: str | None = None, save_every: int = 0,
          resume: str | None = None, log_every: int = 25, quiet: bool = False) -> list[float]:
    """Train for steps 1..``steps``; returns the loss of each of them (those before a resume included).

    In an initialised ``torch.distributed`` process group (as ``main`` makes
    under torchrun) the model is wrapped in DistributedDataParallel and each
    rank trains on its slice of every batch; the losses returned, on every
    rank, are the means over all ranks.  Outside one it is a plain
    single-process loop.
    """
    device = torch.device(device)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if batch % world:
        raise ValueError(f"--batch {batch} must be a multiple of the number of processes ({world}): "
                         f"each takes an equal slice, so that the mean of their means is the batch's mean")
    shard = slice(rank * (batch // world), (rank + 1) * (batch // world))
    config = {"state_size": state_size, "layers": layers, "bidirectional": bidirectional, "dtype": str(dtype),
              "dropout": dropout, "batch": batch, "length": length, "lr": lr, "seed": seed, "world_size": world}

    # The same initial weights on every rank (DDP would broadcast rank 0's anyway) ...
    torch.manual_seed(seed)
    model = SinePredictor(state_size, layers, bidirectional=bidirectional, dropout=dropout, backend=backend,
                          device=device, dtype=dtype)
    # ... but each rank its own dropout stream: the same masks on every shard would be one mask, repeated.
    torch.manual_seed(seed + 1 + rank)
    # Every rank draws the same global batches from this generator and keeps its own slice.
    generator = torch.Generator().manual_seed(seed)
    chosen = lltm_core.get_backend(backend, device=device, dtype=dtype).name
    net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if distributed else model
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)

    losses: list[float] = []
    if resume is not None:
        # weights_only=True (torch.load's default) suffices: tensors, the optimiser's state, plain Python values.
        checkpoint = torch.load(resume, map_location="cpu", weights_only=True)
        if checkpoint.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{resume}: not a checkpoint of this example (format {checkpoint.get('format')!r})")
        differs = {k: (checkpoint["config"][k], config[k]) for k in MODEL_CONFIG if checkpoint["config"][k] != config[k]}
        if differs:
            raise ValueError(f"{resume} was written by a different model: "
                             + ", ".join(f"{k} {old!r} there, {new!r} here" for k, (old, new) in differs.items()))
        if checkpoint["step"] >= steps:
            raise ValueError(f"{resume} is at step {checkpoint['step']}; --steps {steps} leaves nothing to train "
                             f"(--steps counts from the start of training)")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        generator.set_state(checkpoint["data_rng"])
        losses = list(checkpoint["losses"])
        if len(checkpoint["rank_rng"]) == world:
            _set_rank_rng_state(checkpoint["rank_rng"][rank], device)
        else:
            # The data stream does not depend on the number of processes; the dropout streams do.
            torch.manual_seed(seed + 1 + rank + 1_000_003 * checkpoint["step"])
            if rank == 0 and not quiet:
                print(f"note: {resume} was written by {len(checkpoint['rank_rng'])} processes, this run has {world}: "
                      f"the data continues exactly, the dropout masks do not")

    def save_checkpoint(step: int) -> None:
        # Every rank's random state goes in (a collective, so every rank calls this); rank 0 writes.
        rng = [None] * world
        if distributed:
            dist.all_gather_object(rng, _rank_rng_state(device))
        else:
            rng = [_rank_rng_state(device)]
        if rank == 0:
            checkpoint = {"format": CHECKPOINT_FORMAT, "step": step, "config": config, "losses": losses,
                          "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "data_rng": generator.get_state(), "rank_rng": rng}
            partial = f"{save}.partial"
            torch.save(checkpoint, partial)
            os.replace(partial, save)  # a run killed mid-write leaves the previous checkpoint whole

    start_step = len(losses)
    if rank == 0 and not quiet:
        how = f"{world} processes ({dist.get_backend()})" if distributed else "1 process"
        where = f"resuming from {resume} at step {start_step}" if resume else "from scratch"
        print(f"training on {device.type}, {how}, with lltm backend {chosen!r}, {where} "
              f"({steps} steps, batch {batch}, length {length}, {layers} layer{'s' * (layers != 1)}"
              f"{', bidirectional' if bidirectional else ''}, dropout {dropout})", flush=True)
    began = time.perf_counter()
    for step in range(start_step + 1, steps + 1):
        inputs, targets = make_batch(batch, length, generator, dtype)
        inputs, targets = inputs[shard].to(device), targets[shard].to(device)
        # A mean over this rank's slice: DDP averages the gradients over the ranks, and the mean of the
        # slices' means over equal slices is the mean over the global batch.
        loss = torch.nn.functional.mse_loss(net(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reported = loss.detach()
        if distributed:
            reported = reported.clone()
            dist.all_reduce(reported)  # a sum: gloo has no AVG
            reported /= world
        losses.append(reported.item())
        if save is not None and (step == steps or (save_every and step % save_every == 0)):
            save_checkpoint(step)
        if rank == 0 and not quiet and (step % log_every == 0 or step == start_step + 1):
            print(f"step {step:4d}  loss {losses[-1]:.6f}  ({time.perf_counter() - began:.1f} s)", flush=True)
    return losses


def _torchrun_env() -> dict | None:
    """RANK, LOCAL_RANK and WORLD_SIZE when started by torchrun (or another launcher that sets them), else None."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    return {name: int(os.environ[name]) for name in names} if all(n in os.environ for n in names) else None


def _check_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Exit with argparse's usage and one line for a value that would otherwise fail mid-run, or at the end."""
    for name in ("steps", "batch", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.save_every < 0:
        parser.error(f"--save-every must be 0 (only at the end) or more, got {args.save_every}")
    if args.save is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        parser.error(f"--save {args.save}: its folder does not exist (the checkpoint is written after training)")
    if args.resume is not None and not os.path.isfile(args.resume):
        parser.error(f"--resume {args.resume}: no such file")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device takes cpu or cuda, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch sees no CUDA device"
                     + ("" if torch.version.cuda else " (it is a CPU-only build)"))
    try:  # the backend asked for, on the tensors it would get: its error, without a traceback
        lltm_core.get_backend(args.backend, device=device) if args.backend is not None else None
    except lltm_core.BackendError as exc:
        parser.error(f"--backend {args.backend}: {exc}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="train up to this step (default 150)")
    p.add_argument("--backend", default=None, help="lltm backend name (default: the best available)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun, each process on cuda:LOCAL_RANK)")
    p.add_argument("--layers", type=int, default=2, help="stacked LLTM layers (default 2)")
    p.add_argument("--bidirectional", action="store_true",
                   help="a reverse direction too (it reads the future: exercises the layer, not the task)")
    p.add_argument("--dropout", type=float, default=0.1, help="between layers (default 0.1)")
    p.add_argument("--batch", type=int, default=32, help="global batch, split over the processes (default 32)")
    p.add_argument("--seed", type=int, default=0, help="of the initial weights, the data and dropout")
    p.add_argument("--save", metavar="PATH", help="write a checkpoint here at the end (and every --save-every steps)")
    p.add_argument("--save-every", type=int, default=0, metavar="K", help="also every K steps")
    p.add_argument("--resume", metavar="PATH", help="continue from this checkpoint")
    p.add_argument("--log-every", type=int, default=25, metavar="K", help="print the loss every K steps")
    args = p.parse_args()
    _check_arguments(p, args)

    env = _torchrun_env()
    device = torch.device(args.device)
    if env is not None:
        if device.type == "cuda":
            device = torch.device("cuda", env["LOCAL_RANK"])
            torch.cuda.set_device(device)
        # Before the group exists: DDP imports torch._dynamo, which imports torch.distributed.nn.functional,
        # whose functions default to `group=group.WORLD`. Imported later, they hold the group past
        # destroy_process_group, so gloo's threads outlive it and now and then abort the interpreter's
        # exit ("terminate called without an active exception", pytorch#190489).
        importlib.import_module("torch._dynamo")
        # MASTER_ADDR / MASTER_PORT come from torchrun's rendezvous; the timeout turns a lost peer into an error.
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=5),
                                device_id=device if device.type == "cuda" else None)
    try:
        losses = train(args.steps, batch=args.batch, layers=args.layers, bidirectional=args.bidirectional,
                       dropout=args.dropout, backend=args.backend, device=device, seed=args.seed, save=args.save,
                       save_every=args.save_every, resume=args.resume, log_every=args.log_every)
        if env is None or env["RANK"] == 0:
            window = min(10, len(losses))
            first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
            print(f"mean loss of the first {window} steps {first:.4f}, of the last {window} steps {last:.4f}")
    finally:
        if env is not None:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
