"""What LLTMLayer's path costs around lltm-cpu's sequence operators, in one process.

Times, interleaved round by round, calls over T64 B16 I32 S128 in float32 (the size where the
layer's training ratio to nn.LSTM misses its bar while the operators alone meet it).  Forward:

* op: torch.ops.lltm_cpu.sequence_forward called directly (needs_backward=True);
* layer, autograd: lltm_core.LLTMLayer(I, S, backend="cpu")(x) with x requiring grad;
* layer, no_grad: the same call under torch.no_grad() (the operator then skips what backward needs).

Forward and backward, as bench_cpu_sequence.py times them:

* ops: sequence_forward then sequence_backward called directly;
* layer: layer(x)[0].sum().backward(), the gradients reset to None first;
* layer, stubbed: the same call on a copy of the backend whose sequence kernels return outputs
  computed beforehand: what the module, lltm-core and autograd cost without any kernel.

Prints the median of each round's calls, in ms, per round.  No tuning variable is read or set.
"""

import argparse
import dataclasses
import statistics
import time

import torch

import lltm_core

from pointwise_pass import cpu_name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--calls", type=int, default=20, help="calls per candidate per round (default 20)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    steps, batch, features, state = 64, 16, 32, 128
    x = torch.randn(steps, batch, features, requires_grad=True)
    layer = lltm_core.LLTMLayer(features, state, backend="cpu")
    layer(x)  # loads lltm-cpu's library and tunes its routes
    weights, bias, zeros, xd = layer.weights_l0.detach(), layer.bias_l0.detach(), torch.zeros(batch, state), x.detach()

    ops = torch.ops.lltm_cpu
    computed = ops.sequence_forward(xd, weights, bias, zeros, zeros, None, False, True)
    grads = ops.sequence_backward(torch.ones_like(computed[0]), zeros, zeros, weights, xd, zeros, computed[0], None,
                                  computed[3], computed[4], False, True)
    stub = dataclasses.replace(
        lltm_core.get_backend("cpu"),
        sequence_forward=lambda *args: list(computed) if args[-1] else list(computed[:3]),
        sequence_backward=lambda *args: list(grads))
    stubbed = lltm_core.LLTMLayer(features, state, backend=stub)
    stubbed.load_state_dict(layer.state_dict())

    def layer_no_grad():
        with torch.no_grad():
            layer(x)

    def ops_train():
        out = ops.sequence_forward(xd, weights, bias, zeros, zeros, None, False, True)
        ops.sequence_backward(torch.ones_like(out[0]), zeros, zeros, weights, xd, zeros, out[0], None, out[3],
                              out[4], False, True)

    def train(module):
        def run():
            for p in (x, *module.parameters()):
                p.grad = None
            module(x)[0].sum().backward()
        return run

    candidates = {
        "op": lambda: ops.sequence_forward(xd, weights, bias, zeros, zeros, None, False, True),
        "layer, autograd": lambda: layer(x),
        "layer, no_grad": layer_no_grad,
        "ops fwd+bwd": ops_train,
        "layer fwd+bwd": train(layer),
        "layer, stubbed": train(stubbed),
    }
    for run in candidates.values():
        run()
    times = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, run in candidates.items():
            samples = []
            for _ in range(args.calls):
                start = time.perf_counter()
                run()
                samples.append(time.perf_counter() - start)
            times[name].append(statistics.median(samples) * 1e3)
    print(f"{cpu_name()}; {torch.get_num_threads()} threads; torch {torch.__version__}")
    print(f"T{steps} B{batch} I{features} S{state} float32, ms (median of {args.calls} calls, per round; then the "
          f"median over rounds):")
    for name, per_round in times.items():
        print(f"  {name:16} " + " ".join(f"{t:.3f}" for t in per_round) + f"   {statistics.median(per_round):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
