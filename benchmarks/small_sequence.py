"""A small sequence through lltm-cuda's persistent paths, forward and backward, over clusters of 1, 2
and 8 blocks and over the cooperative grid (LLTM_CUDA_SEQUENCE=grid) in float32, and over the grid
in bfloat16 (its products on the tensor cores, the batch in two groups), checked against lltm-ref:
the payload of gpu_check.sh's compute-sanitizer steps (racecheck, synccheck), small so that the
instrumented run takes seconds.

    compute-sanitizer --tool racecheck python benchmarks/small_sequence.py

Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    if not torch.cuda.is_available():
        print("small_sequence.py: no CUDA device: nothing to run")
        return 0
    import lltm_core
    from lltm_core.testing import make_sequence_inputs, max_rel_error, tolerance

    worst = 0.0  # the largest relative error over its dtype's bound
    cases = [("persistent", "1", torch.float32, 3), ("persistent", "2", torch.float32, 3),
             ("persistent", "8", torch.float32, 3), ("grid", "0", torch.float32, 3), ("grid", "0", torch.bfloat16, 20)]
    for path, cluster, dtype, batch in cases:
        os.environ["LLTM_CUDA_SEQUENCE"] = path
        os.environ["LLTM_CUDA_CLUSTER"] = cluster
        inputs = make_sequence_inputs(5, batch, 4, 13, device="cuda", dtype=dtype)
        lengths = torch.randint(1, 6, (batch,), device="cuda")
        for reverse in (False, True):
            got = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="cuda")
            torch.autograd.backward(got, [torch.ones_like(t) for t in got])
            grads = [t.grad.clone() for t in inputs]
            for t in inputs:
                t.grad = None
            wide = [t.detach().float().requires_grad_() for t in inputs]
            want = lltm_core.lltm_sequence(*wide, lengths=lengths, reverse=reverse, backend="ref")
            torch.autograd.backward(want, [torch.ones_like(t) for t in want])
            for g, w in zip([*got, *grads], [*want, *(t.grad for t in wide)]):
                worst = max(worst, max_rel_error(g.detach().float(), w.detach()) / tolerance(dtype))
    print(f"small_sequence.py: clusters 1, 2, 8 and the grid in float32, the grid in bfloat16: worst relative "
          f"error {worst:.2f} of its dtype's bound")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
