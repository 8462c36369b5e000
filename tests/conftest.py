"""Fixtures for lltm-core's own tests: fake backends installed as real entry points.

``install_fake_backends`` writes a throwaway distribution (a ``*.dist-info``
folder with ``entry_points.txt``) onto ``sys.path``, so discovery goes through
``importlib.metadata`` exactly as it does for a pip-installed backend.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import pytest

import lltm_core

# tests/installed/ checks a wheel install (nox -s wheels sets the variable);
# from a source tree it would test the wrong thing.
collect_ignore = [] if os.environ.get("LLTM_TEST_INSTALLED") else ["installed"]

# Factories the fake distributions point at.  Each builds on lltm-ref's kernels
# so a "working" fake really computes the LLTM.
FAKE_MODULE = textwrap.dedent(
    '''
    import dataclasses
    import torch
    import lltm_ref
    from lltm_core import Backend
    from lltm_core.extension import saved_layout, sequence_saved_layout

    def _ref(**changes):
        return dataclasses.replace(lltm_ref.load_backend(), **changes)

    def fast():         return _ref(name="fast", priority=50, devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32}))
    def alpha():        return _ref(name="alpha", priority=50, devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32}))
    def gpu_only():     return _ref(name="gpu_only", devices=frozenset({"cuda"}))
    def cuda_nogpu():   return _ref(name="cuda_nogpu", priority=500, devices=frozenset({"cuda"}), availability=lambda: "no CUDA device visible")
    def broken():       raise ImportError("libfoo.so: cannot open shared object file")
    def future():       return _ref(name="future", interface_versions=(99,))
    def nogpu():        return _ref(name="nogpu", priority=500, availability=lambda: "no CUDA device visible")
    def misnamed():     return _ref(name="something_else")
    def not_backend():  return object()
    def dup_good():     return _ref(name="dup", priority=1)
    def dup_bad():      raise RuntimeError("this copy is broken")

    def _wrong_backward(grad_h, grad_cell, weights, *saved_and_needs_grad_X):
        grad_X, gw, gb, gc = lltm_ref.backward(grad_h, grad_cell, weights, *saved_and_needs_grad_X)
        return grad_X, gw * 1.01, gb, gc   # a 1% error in grad_weights

    def wrong():        return _ref(name="wrong", backward=_wrong_backward)

    # Malformed: caught when the factory builds the Backend, reported against that backend only.
    def bad_devices():  return _ref(name="bad_devices", devices=None)
    def bad_priority(): return _ref(name="bad_priority", priority="100")
    def exits():        import sys; sys.exit("a plugin that calls sys.exit()")

    # Contract breakers the conformance kit must catch (tests/test_kit.py), each built on lltm-ref.
    def _none_grad_X(*args):
        grad_X, gw, gb, gc = lltm_ref.backward(*args)
        return (None if grad_X.numel() == 0 else grad_X), gw, gb, gc

    def _dense_only_backward(grad_h, grad_cell, *rest):
        # reads its gradients as if they were dense: wrong for the expanded ones a sum() gives
        if not grad_h.is_contiguous():
            grad_h, grad_cell = torch.zeros_like(grad_h), torch.zeros_like(grad_cell)
        return lltm_ref.backward(grad_h, grad_cell, *rest)

    def _mutating_backward(grad_h, grad_cell, *rest):
        out = lltm_ref.backward(grad_h, grad_cell, *rest)
        grad_cell.mul_(1.0)  # same values, but a write
        return out

    def _aliasing_forward(input, weights, bias, old_h, old_cell):
        new_h, new_cell, *saved = lltm_ref.forward(input, weights, bias, old_h, old_cell)
        return (new_h, new_cell, *saved[:-1], old_cell[:])  # "saves" a view of old_cell as tanh_cell

    def _bad_layout(B, I, S):
        return {**saved_layout(B, I, S), "X": (B, S)}

    def none_grad_x():   return _ref(name="none_grad_x", backward=_none_grad_X)
    def dense_only():    return _ref(name="dense_only", backward=_dense_only_backward)
    def mutating():      return _ref(name="mutating", backward=_mutating_backward)
    def aliasing():      return _ref(name="aliasing", forward=_aliasing_forward)
    def bad_layout():    return _ref(name="bad_layout", saved_layout=_bad_layout)
    def float32_only():  return _ref(name="float32_only", dtypes=frozenset({torch.float32}))

    # Version 1: step kernels only, as every backend written before the sequence kernels.
    def v1_only():       return _ref(name="v1_only", interface_versions=(1,), sequence_forward=None,
                                     sequence_backward=None, sequence_saved_layout=None)

    # Sequence-kernel breakers the kit must catch, each built on lltm-ref's sequence.
    def _seq_wrong_backward(*args):
        grad_input, gw, gb, gh, gc = lltm_ref.sequence_backward(*args)
        return grad_input, gw * 1.01, gb, gh, gc

    def _seq_ignoring_lengths(input, weights, bias, h0, c0, lengths, reverse, *needs_backward):
        return lltm_ref.sequence_forward(input, weights, bias, h0, c0, None, reverse, *needs_backward)

    def _seq_aliasing_forward(*args):
        output, h_n, c_n, *saved = lltm_ref.sequence_forward(*args)
        return (output, h_n, output[0], *saved)  # "c_n" a view of the output

    def _seq_hoarding_layout(T, B, I, S):
        return {**sequence_saved_layout(T, B, I, S), "spare": (T, B, 4 * S)}

    def _seq_hoarding_forward(*args):
        output, h_n, c_n, *saved = lltm_ref.sequence_forward(*args)
        return (output, h_n, c_n, *saved, output.new_ones(*output.shape[:2], 4 * output.shape[2]))

    def _seq_hoarding_backward(*args):
        *head, spare, reverse, needs_grad_input = args
        return lltm_ref.sequence_backward(*head, reverse, needs_grad_input)

    def _seq_keeping_forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward):
        return lltm_ref.sequence_forward(input, weights, bias, h0, c0, lengths, reverse, True)  # ignores it

    def _unsteady(call, _answers=iter(range(10**9))):
        return next(_answers) % 2 == 0  # True, then False: not a function of the call

    def seq_wrong():       return _ref(name="seq_wrong", sequence_backward=_seq_wrong_backward)
    def seq_keeping():     return _ref(name="seq_keeping", sequence_forward=_seq_keeping_forward)
    def unsteady():        return _ref(name="unsteady", should_run=_unsteady)
    def answers_none_kit(): return _ref(name="answers_none_kit", can_run=_answers_none)
    def seq_no_lengths():  return _ref(name="seq_no_lengths", sequence_forward=_seq_ignoring_lengths)
    def seq_aliasing():    return _ref(name="seq_aliasing", sequence_forward=_seq_aliasing_forward)
    def seq_hoarding():    return _ref(name="seq_hoarding", sequence_forward=_seq_hoarding_forward,
                                       sequence_backward=_seq_hoarding_backward,
                                       sequence_saved_layout=_seq_hoarding_layout)

    # Version 2: sequence kernels without needs_backward, as written before contract v3.
    _v2_calls = []

    def _v2_sequence_forward(input, weights, bias, h0, c0, lengths, reverse):
        _v2_calls.append(torch.is_grad_enabled())
        return lltm_ref.sequence_forward(input, weights, bias, h0, c0, lengths, reverse)

    def v2_only():       return _ref(name="v2_only", interface_versions=(1, 2), sequence_forward=_v2_sequence_forward)

    # Contract v3's per-call answers (tests/test_call_choice.py).  Each declines large state sizes.
    def _big_state(call):
        return f"state_size {call.state_size} > 64: too big for this backend" if call.state_size > 64 else True

    def _no_cell(call):
        return call.op != "cell" or "no cell kernels worth running"

    def _raises(call):
        raise ZeroDivisionError("a bug in should_run")

    def _answers_none(call):
        return None

    _asked = []

    def _counting(call):
        _asked.append(call)
        return True

    def small_only():    return _ref(name="small_only", priority=80, devices=frozenset({"cpu"}), should_run=_big_state)
    def small_can():     return _ref(name="small_can", priority=80, devices=frozenset({"cpu"}), can_run=_big_state)
    def small_both():    return _ref(name="small_both", priority=90, devices=frozenset({"cpu"}), can_run=_no_cell,
                                     should_run=_big_state)
    def declines_all():  return _ref(name="declines_all", priority=200, devices=frozenset({"cpu"}),
                                     should_run=lambda call: "never a good choice")
    def raising():       return _ref(name="raising", priority=95, devices=frozenset({"cpu"}), should_run=_raises)
    def answers_none():  return _ref(name="answers_none", priority=95, devices=frozenset({"cpu"}), can_run=_answers_none)
    def counting():      return _ref(name="counting", priority=85, devices=frozenset({"cpu"}), should_run=_counting)
    def no_v3():         return _ref(name="no_v3", interface_versions=(1, 2), should_run=_big_state)

    # Passes the reference check, then its kernel starts raising (lltm bench must go on without it).
    _calls = [0]

    def _flaky_forward(*args):
        _calls[0] += 1
        if _calls[0] > 2:
            raise RuntimeError("kernel exploded")
        return lltm_ref.forward(*args)

    def flaky():        return _ref(name="flaky", forward=_flaky_forward)

    # New kernel objects on every call of the factory, as closures or bound methods give.
    def fresh():
        return _ref(name="fresh", priority=60, devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32}),
                    forward=lambda *args: lltm_ref.forward(*args))
    '''
)


def write_distribution(root, dist_name: str, entry_points: dict[str, str]) -> None:
    info = root / f"{dist_name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    lines = "\n".join(f"{name} = {value}" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[lltm.backends]\n{lines}\n")


@pytest.fixture
def fake_backends(tmp_path, monkeypatch):
    """Returns install(dist_name, {entry point name: factory name}); resets the registry after."""
    (tmp_path / "lltm_fake_backends.py").write_text(FAKE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Only lltm-ref and the fakes are visible, whatever else this venv has
    # installed (lltm-cpu would outrank the fakes and change every answer).
    from importlib import metadata

    real_entry_points = metadata.entry_points

    def visible_entry_points(**selection):
        if selection.get("group") != "lltm.backends":  # torch's own entry points, for one
            return real_entry_points(**selection)
        return metadata.EntryPoints(
            ep for ep in real_entry_points(**selection)
            if ep.dist is None or ep.dist.metadata["Name"] == "lltm-ref"
            or ep.dist.metadata["Name"].startswith("lltm-fake")
        )

    monkeypatch.setattr(metadata, "entry_points", visible_entry_points)
    monkeypatch.delenv("LLTM_BACKEND", raising=False)
    monkeypatch.delenv("LLTM_DISABLE_BACKENDS", raising=False)

    def install(dist_name: str, entry_points: dict[str, str]) -> None:
        write_distribution(tmp_path, dist_name, {n: f"lltm_fake_backends:{f}" for n, f in entry_points.items()})
        importlib.invalidate_caches()
        lltm_core.refresh()

    lltm_core.refresh()
    yield install
    sys.modules.pop("lltm_fake_backends", None)
    monkeypatch.undo()
    importlib.invalidate_caches()
    lltm_core.refresh()
