"""How close the conformance kit's layer test comes to its tolerance: the tail over many seeds.

Run from the repository root (the Markdown report goes to --output)::

    python benchmarks/kit_errors.py --backend ref --backend cpu --dtype bfloat16 --seeds 1000

The kit draws fresh random values each run (its seed is in pytest's header), so a
tolerance sized on one run's errors fails now and then on a correct backend.  This
runs ``test_layer_matches_reference``'s comparison (``layer_errors``) on each case
for seeds 0..N-1 and reports, per backend and case, the distribution of the largest
relative error over all its quantities, how many seeds exceed the tolerance, and the
quantity that came closest.
"""

from __future__ import annotations

import argparse
import datetime
import statistics

import torch

import lltm_core
from lltm_core.testing import tolerance
from lltm_core.testing.test_sequence import LAYER_CASES, layer_errors

from pointwise_pass import cpu_name


def survey(backend_name: str, dtype: torch.dtype, seeds: int, cases: list) -> list[str]:
    backend = lltm_core.get_backend(backend_name, device="cpu", dtype=dtype)
    tol = tolerance(dtype)
    rows = []
    for case in cases:
        largest, closest = [], {}
        for seed in range(seeds):
            torch.manual_seed(seed)
            errors = layer_errors(backend, "cpu", dtype, case)
            largest.append(max(errors.values()))
            for name, error in errors.items():
                closest[name] = max(closest.get(name, 0.0), error)
        largest.sort()
        p99 = largest[min(seeds - 1, int(0.99 * seeds))]
        worst = max(closest, key=closest.get)
        rows.append(f"| {backend_name} | {case[0]} | {statistics.median(largest):.4f} | {p99:.4f} | "
                    f"{largest[-1]:.4f} ({worst}) | {sum(e > tol for e in largest)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", help="repeatable; default: every available CPU backend")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--case", action="append", help="a LAYER_CASES name, repeatable; default: all")
    parser.add_argument("--output", help="also write the report here")
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    backends = args.backend or lltm_core.available_backends()
    cases = [c for c in LAYER_CASES if not args.case or c[0] in args.case]
    lines = [
        f"{datetime.date.today()}, {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}: "
        f"`python benchmarks/kit_errors.py {' '.join(f'--backend {b}' for b in backends)} --dtype {args.dtype} "
        f"--seeds {args.seeds}{''.join(f' --case {c}' for c in args.case or [])}`; tolerance {tolerance(dtype):g}.",
        "",
        f"Largest relative error over a case's quantities, over seeds 0..{args.seeds - 1}:",
        "",
        "| backend | case | median | p99 | max (quantity) | seeds over the tolerance |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in backends:
        lines += survey(name, dtype, args.seeds, cases)
    report = "\n".join(lines)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
