"""Export an LLTM model and compile it with AOTInductor into a package that runs without Python.

    python examples/deploy/export_model.py OUT_DIR [--backend cpu] [--dtype float32] [--model layer|cell]

writes OUT_DIR/model.pt2 (dynamic batch and time), OUT_DIR/inputs.pt (an input to try it on) and
OUT_DIR/expected.pt (what Python eager gives for it), then prints the commands that run the package
from Python and from C++ (examples/deploy/runner.cpp).

OUT_DIR is created (private to you) if missing; an existing one must be yours and writable by no one
else: the package carries a shared object that the runner loads, so whoever can replace model.pt2
runs code as you.  ``OUT_DIR="$(mktemp -d)"`` makes a fitting one.

The models:
* ``layer``: LLTMLayer, 2 layers, bidirectional, batch_first, then a Linear head;
* ``cell``: the cell ``LLTM`` stepped in a Python loop over the sequence, then a Linear head.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import torch

import lltm_core

INPUT_FEATURES, STATE_SIZE, CLASSES = 32, 64, 10


class SequenceClassifier(torch.nn.Module):
    """LLTMLayer (2 layers, bidirectional, batch_first) and a Linear head on every step."""

    def __init__(self, backend: str | None = None):
        super().__init__()
        self.lltm = lltm_core.LLTMLayer(INPUT_FEATURES, STATE_SIZE, num_layers=2, batch_first=True,
                                        bidirectional=True, backend=backend)
        self.head = torch.nn.Linear(2 * STATE_SIZE, CLASSES)

    def forward(self, x):  # x: (batch, time, features)
        output, _ = self.lltm(x)
        return self.head(output)


class SteppedCell(torch.nn.Module):
    """The cell stepped in Python over the time steps (export unrolls the loop: static time)."""

    def __init__(self, backend: str | None = None):
        super().__init__()
        self.cell = lltm_core.LLTM(INPUT_FEATURES, STATE_SIZE, backend=backend)
        self.head = torch.nn.Linear(STATE_SIZE, CLASSES)

    def forward(self, x):  # x: (batch, time, features)
        h = c = x.new_zeros(x.shape[0], STATE_SIZE)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


def export(model: torch.nn.Module, example: torch.Tensor, dynamic_time: bool, package: Path) -> Path:
    """torch.export (under no_grad: an inference graph, which saves nothing for a backward), then AOTInductor.

    The batch size is dynamic; so is the time, unless the model loops over the steps in Python.
    """
    dims = {0: torch.export.Dim("batch", min=1, max=4096)}
    if dynamic_time:
        dims[1] = torch.export.Dim("time", min=2, max=65536)
    with torch.no_grad():
        program = torch.export.export(model.eval(), (example,), dynamic_shapes=(dims,))
    # The package checks its inputs' sizes against these ranges when run with AOTI_RUNTIME_CHECK_INPUTS=1
    # (the runner sets it), but by default as if each started at 2 (export's 0/1 specialisation): a
    # batch of one would be refused.  The runner refuses an empty dimension itself.
    configs = {"aot_inductor.check_lowerbound": False} if hasattr(
        torch._inductor.config.aot_inductor, "check_lowerbound") else {}
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(package),
                                                         inductor_configs=configs))


def private_folder(path: Path) -> Path:
    """``path``, created readable and writable by its owner alone if missing.  An existing folder
    (or a link to one) must belong to this user and be writable by no one else, or SystemExit says why."""
    try:
        path.mkdir(mode=0o700, parents=True)
        return path
    except FileExistsError:
        pass
    for what, info in (("the link", path.lstat()), ("the folder", path.stat())):
        if what == "the link" and not stat.S_ISLNK(info.st_mode):
            continue
        if what == "the folder" and not stat.S_ISDIR(info.st_mode):
            raise SystemExit(f"{path} exists and is not a folder")
        if info.st_uid != os.getuid():
            raise SystemExit(f"{path}: {what} belongs to another user (uid {info.st_uid}), who could replace the "
                             f"package (a shared object the runner loads); export into a folder of your own, e.g. "
                             f'OUT_DIR="$(mktemp -d)"')
        if what == "the folder" and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SystemExit(f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}), who could replace "
                             f"the package (a shared object the runner loads); chmod go-w it, or export into a "
                             f'folder of your own, e.g. OUT_DIR="$(mktemp -d)"')
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--backend", default="cpu", help="the backend whose operators the package calls (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--model", default="layer", choices=["layer", "cell"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    model = (SequenceClassifier if args.model == "layer" else SteppedCell)(args.backend).to(dtype)
    example = torch.randn(3, 9, INPUT_FEATURES, dtype=dtype)
    private_folder(args.out_dir)
    package = export(model, example, dynamic_time=args.model == "layer", package=args.out_dir / "model.pt2")

    inputs = torch.randn(5, 17 if args.model == "layer" else 9, INPUT_FEATURES, dtype=dtype)
    with torch.no_grad():
        expected = model(inputs)
    torch.save([inputs], args.out_dir / "inputs.pt")
    torch.save([expected], args.out_dir / "expected.pt")

    library = lltm_core.get_backend(args.backend).operator_library
    print(f"wrote {package}")
    print("run it from Python:")
    print(f"  python -c \"import torch, lltm_core; lltm_core.get_backend({args.backend!r}); "
          f"m = torch._inductor.aoti_load_package({str(package)!r}); "
          f"print(m(*torch.load({str(args.out_dir / 'inputs.pt')!r})).shape)\"")
    if library is None:
        print(f"backend {args.backend!r} has no operator library: the package runs only where Python does")
    else:
        print("run it from C++ (examples/deploy/README.md builds the runner):")
        print(f"  lltm_deploy_runner {library} {package} {args.out_dir / 'inputs.pt'} {args.out_dir / 'outputs.pt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
