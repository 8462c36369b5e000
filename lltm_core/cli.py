"""The ``lltm`` command: ``lltm info`` and ``lltm bench``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings

import torch

from . import _discovery, _registry
from ._notices import BackendUnavailableWarning
from ._version import __version__
from .backend import INTERFACE_VERSION
from ._device import cuda_unavailable_reason, device_unavailable_reason
from ._discovery import BackendError
from ._explain import explain
from ._format import table

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _devices() -> list[tuple[str, str | None]]:
    """(device type, None if usable else why not) for the devices lltm knows about."""
    return [("cpu", None), ("cuda", cuda_unavailable_reason())]


def info_data() -> dict:
    devices = _devices()
    selection = []
    for device, unusable in devices:
        if unusable:
            continue
        for dtype in _DTYPES:
            chosen, why = _choice_for_device(device, dtype)
            selection.append({"device": device, "dtype": str(dtype)[6:], "backend": chosen, "why": why})
    backends = _discovery.backend_report()
    return {
        "lltm_core": __version__,
        "interface_version": INTERFACE_VERSION,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "devices": [
            {"device": d, "available": why is None, "reason": why or "",
             "name": torch.cuda.get_device_name(0) if d == "cuda" and why is None else ""}
            for d, why in devices
        ],
        "backends": backends,
        "selection": selection,
        "environment": {v: os.environ.get(v) for v in (_discovery.ENV_BACKEND, _discovery.ENV_DISABLE)},
        "environment_notes": _environment_notes(backends),
        "torch_note": _torch_too_old_note(torch.__version__),
    }


def _choice_for_device(device_type: str, dtype: torch.dtype) -> tuple[str | None, str]:
    """(chosen backend name or None, why) for the selection table: no particular call."""
    try:
        with warnings.catch_warnings():  # lltm info lists the unavailable backends with their reasons
            warnings.simplefilter("ignore", BackendUnavailableWarning)
            b = _registry.select(device_type, dtype)
    except BackendError as exc:
        return None, str(exc)
    why = _registry.why_chosen(b)
    entry = _registry.device_entry(device_type, dtype, None)
    if isinstance(entry, _registry.Ranking):
        declining = [c.name for c in entry.backends if c.declines_calls]
        why += (f"; {', '.join(declining)} may decline a call by its shape, and the next one runs it "
                f"(lltm info --explain sequence --shape T,B,I,S)")
    return b.name, why


#: The oldest torch the lltm wheels take (their Requires-Dist; the compiled backends' stable ABI).
OLDEST_TORCH = (2, 10)


def _torch_too_old_note(version: str) -> str:
    """What to do with a torch older than the wheels need, or "" for one new enough."""
    try:
        release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return ""
    if release >= OLDEST_TORCH:
        return ""
    wanted = ".".join(map(str, OLDEST_TORCH))
    return (f"torch {version} is older than {wanted}, which lltm's packages need (lltm-cpu and lltm-cuda "
            f"cannot load on it). Upgrade torch yourself first, from the index of the build you want, e.g. "
            f"pip install 'torch>={wanted}' --index-url https://download.pytorch.org/whl/cpu (CPU only): "
            f"left to pip, installing an lltm package replaces it with the newest torch on PyPI, on Linux "
            f"a CUDA build with several GB of CUDA libraries")


def _environment_notes(backends: list[dict]) -> list[str]:
    """Names in LLTM_DISABLE_BACKENDS that hide nothing: a typo there is otherwise silent."""
    known = sorted({b["name"] for b in backends})
    unknown = sorted(_discovery.disabled_names() - set(known))
    if not unknown:
        return []
    return [f"{_discovery.ENV_DISABLE} names {', '.join(map(repr, unknown))}, which no installed backend is called "
            f"(installed: {', '.join(known) or 'none'}); it hides nothing there"]


# How LLTMLayer runs each backend: its own sequence kernels, or its step kernels looped by lltm-core.
_SEQUENCE_KERNELS = {True: "own", False: "looped", None: ""}


def print_info(data: dict) -> None:
    print(f"lltm-core {data['lltm_core']} (backend interface {data['interface_version']})")
    print(f"torch {data['torch']} (CUDA {data['torch_cuda'] or 'none'}), Python {data['python']}, "
          f"CPU capability {data['cpu_capability']}")
    if data["torch_note"]:
        print(f"  note: {data['torch_note']}")
    print("\nDevices:")
    for d in data["devices"]:
        state = f"available {d['name']}".rstrip() if d["available"] else f"unavailable: {d['reason']}"
        print(f"  {d['device']:<5} {state}")
    print(f"\nBackends (entry-point group {_discovery.ENTRY_POINT_GROUP!r}):")
    if not data["backends"]:
        print(f"  none installed: {_discovery.INSTALL_HINTS['ref']}")
    else:
        rows = [
            [b["name"], b["distribution"], b["version"], b["status"],
             "" if b["priority"] is None else b["priority"],
             ",".join(b["devices"] or []), ",".join(b["dtypes"] or []), _SEQUENCE_KERNELS[b["sequence_kernels"]],
             b["reason"] or b["description"]]
            for b in data["backends"]
        ]
        print(table(rows, ["name", "distribution", "version", "status", "priority", "devices", "dtypes", "sequence",
                           "reason / description"]))
        print("  (sequence: how LLTMLayer runs it; own = the backend's sequence kernels run the time loop, "
              "looped = lltm-core loops its step kernels)")
    print("\nSelection (what lltm_core.lltm() uses when no backend is named):")
    rows = [[s["device"], s["dtype"], s["backend"] or "-", s["why"].replace("\n", " ")] for s in data["selection"]]
    print(table(rows, ["device", "dtype", "backend", "why"]))
    env = data["environment"]
    print("\nEnvironment: " + ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in env.items()))
    for note in data["environment_notes"]:
        print(f"  note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lltm", description="The LLTM cell with pluggable backends.")
    parser.add_argument("--version", action="version", version=f"lltm-core {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="what is installed, what is usable, and which backend each device/dtype gets")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--explain", choices=("cell", "sequence"), metavar="OP",
                      help="instead, trace the choice of backend for one call: 'cell' or 'sequence' (needs --shape)")
    info.add_argument("--shape", metavar="SIZES", help="with --explain: T,B,I,S for a sequence, B,I,S for the cell")
    info.add_argument("--device", help="with --explain: the tensors' device (default: cpu)")
    info.add_argument("--dtype", choices=[str(d)[6:] for d in _DTYPES],
                      help="with --explain: the tensors' dtype (default: float32)")
    info.add_argument("--inference", action="store_true",
                      help="with --explain: a call that needs no backward (torch.no_grad())")
    from . import bench

    bench.add_arguments(sub.add_parser("bench", help=bench.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:  # `lltm info | head`: the reader left; say nothing more, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args) -> int:
    from . import bench

    if args.command == "info" and not args.explain:
        # Each of these describes the one call --explain traces; without it, they would be ignored unseen.
        given = [f"--{name}" for name in ("shape", "device", "dtype", "inference") if getattr(args, name)]
        if given:
            print(f"lltm info: {', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --explain cell|sequence "
                  f"(the call whose choice to trace), e.g. lltm info --explain sequence --shape 64,16,32,128 "
                  f"--dtype bfloat16; `lltm info` alone lists the choice for every device and dtype", file=sys.stderr)
            return 2
    if args.command == "info" and args.explain:
        return _explain(args)
    if args.command == "info":
        data = info_data()
        if args.json:
            json.dump(data, sys.stdout, indent=2)
            print()
        else:
            print_info(data)
        return 0
    return bench.run(args)


def _explain(args) -> int:
    """``lltm info --explain``: every backend's verdict on one call, best first, as select() reaches it."""
    from .backend import Call

    want = 4 if args.explain == "sequence" else 3
    sizes = (args.shape or "").split(",")
    if len(sizes) != want or not all(v.strip().isdigit() for v in sizes):
        form = "T,B,I,S" if args.explain == "sequence" else "B,I,S"
        print(f"lltm info: --explain {args.explain} needs --shape {form} "
              f"(non-negative integers), got --shape {args.shape!r}", file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device or "cpu")
    except RuntimeError:
        print(f"lltm info: --device {args.device!r} is not a device torch knows; give a device type such as "
              f"cpu or cuda (the devices lltm knows: {', '.join(d for d, _ in _devices())})", file=sys.stderr)
        return 2
    sizes = [int(v) for v in sizes]
    steps, (batch, features, state) = (sizes[0], sizes[1:]) if want == 4 else (None, sizes)
    call = Call(args.explain, device.type, getattr(torch, args.dtype or "float32"), batch, features, state,
                steps, not args.inference)
    unusable = device_unavailable_reason(device)
    if unusable:  # as `lltm bench --device`: no tensors there, so no backend's answer would mean anything
        _print_without_trace(args, call, "unusable_device", unusable,
                             f"no backend is asked: this torch cannot make {device} tensors: {unusable}")
        return 1
    rejected = _argument_error(call)
    if rejected:  # lltm_core refuses such a call before asking any backend
        _print_without_trace(args, call, "rejected", rejected, f"rejected before any backend is asked: {rejected}")
        return 1
    if call.device_type == "meta":  # what lltm_core does on meta tensors, before any backend (docs/usage.md)
        shapes_only = ("no backend: on meta tensors lltm-core gives the outputs' shapes and dtype itself and "
                       "computes nothing (shape inference)")
        _print_without_trace(args, call, "meta", shapes_only, shapes_only)
        return 0
    trace = explain(call)
    if args.json:
        json.dump({"call": call.describe(), "trace": [t._asdict() for t in trace]}, sys.stdout, indent=2)
        print()
        return 0
    print(f"Call: {call.describe()}")
    print(table([[t.verdict, t.name, t.reason] for t in trace], ["verdict", "backend", "why"]))
    chosen = [t.name for t in trace if t.verdict == "chosen"]
    print(f"-> {chosen[0]}" if chosen else "-> no backend can run this call")
    return 0 if chosen else 1


def _print_without_trace(args, call, key: str, text: str, line: str) -> None:
    """A call whose choice no backend takes part in: ``{"call", key: text, "trace": []}`` with --json, else ``line``."""
    if args.json:
        json.dump({"call": call.describe(), key: text, "trace": []}, sys.stdout, indent=2)
        print()
    else:
        print(f"Call: {call.describe()}\n-> {line}")


def _argument_error(call) -> str | None:
    """The argument checks' message for ``call`` (run on meta tensors of its sizes), or None if it passes them."""
    from ._checks import check_lltm_args, check_sequence_args

    def empty(*shape):
        return torch.empty(shape, dtype=call.dtype, device="meta")

    B, I, S = call.batch, call.input_features, call.state_size
    weights, bias, state = empty(3 * S, S + I), empty(3 * S), empty(B, S)
    try:
        if call.op == "sequence":
            check_sequence_args(empty(call.steps, B, I), weights, bias, state, state, None, False)
        else:
            check_lltm_args(empty(B, I), weights, bias, state, state)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
