"""`lltm info` and `lltm bench`, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import lltm_core
from lltm_core.cli import main


def _lltm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lltm_core", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_info_lists_backends_and_explains_the_choice():
    out = _lltm("info")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lltm-core" in text and "torch" in text
    ref_row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["ref"])
    assert ref_row[1:4] == ["lltm-ref", lltm_core.__version__, "available"], ref_row
    assert "Selection" in text
    pinned = _lltm("info", env={"LLTM_BACKEND": "ref"}).stdout
    assert "Environment: LLTM_BACKEND=ref" in pinned
    assert "asked for by LLTM_BACKEND=ref" in pinned


def test_info_json_reports_unavailable_backends_with_reasons(fake_backends, capsys):
    fake_backends("lltm-fake", {"nogpu": "nogpu"})
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {b["name"]: b for b in data["backends"]}
    assert rows["nogpu"]["status"] == "unavailable" and rows["nogpu"]["reason"] == "no CUDA device visible"
    assert rows["ref"]["status"] == "available"
    row = next(s for s in data["selection"] if (s["device"], s["dtype"]) == ("cpu", "float64"))
    assert row["backend"] == "ref", row  # the fake distribution hides every other backend


def test_info_says_which_backends_run_their_own_sequence_kernels(fake_backends, capsys):
    fake_backends("lltm-fake", {"v1_only": "v1_only"})
    assert main(["info"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] in (["ref"], ["v1_only"])}
    assert rows["ref"][7] == "own" and rows["v1_only"][7] == "looped", rows


def test_info_explain_traces_the_choice_for_one_call(fake_backends, capsys):
    fake_backends("lltm-fake", {"small_only": "small_only", "gpu_only": "gpu_only"})
    assert main(["info", "--explain", "sequence", "--shape", "64,16,32,128"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Call: sequence T64 B16 I32 S128, cpu float32, with backward"
    assert lines[1].split() == ["verdict", "backend", "why"]
    body = [" ".join(line.split()) for line in lines[3:-1]]
    assert body == [
        "declined small_only priority 80; should_run: state_size 128 > 64: too big for this backend",
        "chosen ref priority 0, the highest that accepts the call",
        "not for this device/dtype gpu_only it runs on cuda, not cpu",
    ], lines
    assert lines[-1] == "-> ref"
    assert main(["info", "--explain", "cell", "--shape", "16,32,64", "--inference"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Call: cell B16 I32 S64, cpu float32, inference" and out.endswith("-> small_only\n")
    assert main(["info", "--explain", "sequence", "--shape", "16,32,64"]) == 2
    assert "--explain sequence needs --shape T,B,I,S" in capsys.readouterr().err
    assert main(["info", "--explain", "cell", "--shape", "1,2,3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["trace"][0] == {"name": "small_only", "verdict": "chosen",
                                "reason": "priority 80, the highest that accepts the call"}


@pytest.mark.parametrize("options", [["--shape", "1,2,3"], ["--dtype", "float16"], ["--device", "cuda"],
                                     ["--inference"], ["--dtype", "float32", "--inference"]])
def test_info_refuses_the_options_of_explain_without_it(options, capsys):
    # `lltm info --dtype float16` printed the whole report, every dtype in it, as if asked nothing.
    assert main(["info", *options]) == 2
    captured = capsys.readouterr()
    given = ", ".join(o for o in options if o.startswith("--"))
    assert captured.out == "" and f"lltm info: {given} go" in captured.err and "with --explain" in captured.err


def test_info_explain_on_meta_says_no_backend_is_asked(capsys):
    # It printed every backend as "not for this device/dtype" and "-> no backend can run this call" (exit 1),
    # while LLTM, LLTMLayer, lltm() and lltm_sequence() run on meta tensors without one.
    assert main(["info", "--explain", "sequence", "--shape", "4,3,5,7", "--device", "meta"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("-> no backend: on meta tensors lltm-core gives the outputs' shapes")
    layer = lltm_core.LLTMLayer(5, 7, device="meta")
    assert layer(torch.empty(4, 3, 5, device="meta"))[0].shape == (4, 3, 7)


@pytest.mark.parametrize("cuda, device, said", [
    (None, "cuda", "this torch is a CPU-only build \\(torch .*\\): install a CUDA build of torch"),
    ("13.0", "cuda", "has CUDA 13.0, but no GPU is visible: check the driver"),
    ("13.0", "cuda:3", "torch sees 2 CUDA device\\(s\\), cuda:0 to cuda:1; there is no cuda:3"),
])
def test_info_explain_on_a_device_torch_cannot_reach_says_so(cuda, device, said, monkeypatch, capsys):
    # On a CPU-only torch it traced the choice as if there were CUDA tensors ("-> ref", exit 0).
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device != "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["info", "--explain", "sequence", "--shape", "4,3,5,7", "--device", device]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Call: sequence T4 B3 I5 S7, cuda float32, with backward"
    assert re.fullmatch(rf"-> no backend is asked: this torch cannot make {device} tensors: .*{said}.*", lines[1]), lines
    assert main(["info", "--explain", "cell", "--shape", "3,5,7", "--device", device, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["trace"] == [] and re.search(said, data["unusable_device"]), data
    if device == "cuda":  # explain() takes a device type, without an index
        with pytest.raises(lltm_core.BackendError, match=rf"explain\(\): this torch cannot make cuda tensors, so no "
                                                         rf"backend is asked: .*{said}"):
            lltm_core.explain(lltm_core.Call("sequence", "cuda", torch.float32, 3, 5, 7, 4))


def test_bench_json_times_each_backend_beside_the_peers():
    out = _lltm("bench", "--json", "--iterations", "20", "--size", "3,4,5")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    rows = {r["candidate"]: r for r in data["results"]}
    assert {"eager (seed module)", "torch.compile (seed module)"} <= rows.keys()
    for name in lltm_core.available_backends():
        r = rows[name]
        assert r["status"] == "ok" and r["calls"] >= 20
        assert r["forward_us"]["median"] > 0 and r["backward_us"]["median"] > 0
        assert r["speedup_vs_eager"]["forward"] > 0 and r["speedup_vs_compile"]["backward"] > 0


def test_bench_reports_a_wrong_backend_as_failing_and_does_not_time_it(fake_backends, capsys):
    fake_backends("lltm-fake", {"wrong": "wrong"})
    code = main(["bench", "--backend", "wrong", "--backend", "ref", "--iterations", "10", "--no-compile", "--size", "3,4,5"])
    out = capsys.readouterr().out
    assert code == 1
    wrong_line = next(line for line in out.splitlines() if line.strip().startswith("wrong"))
    assert "FAILED" in wrong_line and "grad_weights rel. error" in wrong_line
    ref_line = next(line for line in out.splitlines() if line.strip().startswith("ref"))
    assert "x /" in ref_line  # timed, with speed-ups


def test_bench_names_an_unusable_backend(capsys):
    code = main(["bench", "--backend", "nosuch", "--iterations", "10", "--no-compile", "--size", "2,2,2"])
    assert code == 1
    assert "'nosuch'" in capsys.readouterr().out


def test_bench_rejects_a_bad_size():
    with pytest.raises(SystemExit, match="--size takes B,I,S"):
        main(["bench", "--size", "16,32"])


@pytest.mark.parametrize("args, message", [
    (["--seconds", "nan"], "--seconds takes a number of seconds > 0, got nan"),
    (["--seconds", "inf"], "--seconds takes a number of seconds > 0, got inf"),
    (["--seconds", "0"], "--seconds takes a number of seconds > 0, got 0.0"),
    (["--iterations", "0"], "--iterations takes a count >= 1, got 0"),
    (["--device", "tpu"], "--device takes cpu, cuda or cuda:N, got 'tpu'"),
    (["--plot", "/no/such/folder/bench.png"], "--plot /no/such/folder/bench.png: no such folder /no/such/folder"),
    (["--plot", "bench.xyz"], "matplotlib cannot write .xyz"),
])
def test_bench_rejects_bad_options_before_measuring(args, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["bench", *args])


def test_bench_plot_writes_a_png(tmp_path):
    out = _lltm("bench", "--iterations", "10", "--no-compile", "--backend", "ref", "--size", "2,2,2",
                "--plot", str(tmp_path / "bench.png"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_bench_says_why_cuda_cannot_be_benchmarked():
    with pytest.raises(SystemExit, match=r"--device cuda: .*(CPU-only build|no GPU is visible)"):
        main(["bench", "--device", "cuda"])


def test_bench_runs_exactly_the_iterations_asked_for():
    out = _lltm("bench", "--json", "--iterations", "15", "--no-compile", "--backend", "ref", "--size", "3,4,5",
                "--seq-len", "4")
    assert out.returncode == 0, out.stderr
    calls = {(r["table"], r["candidate"]): r["calls"] for r in json.loads(out.stdout)["results"]}
    best = lltm_core.get_backend().name  # the per-step loop runs the cell where lltm would
    assert calls == {("cell", "eager (seed module)"): 15, ("cell", "ref"): 15, ("sequence", "nn.LSTM"): 15,
                     ("sequence", f"LLTM per-step loop ({best})"): 15, ("sequence", "LLTMLayer (ref)"): 15}


def test_bench_times_the_sequence_against_nn_lstm():
    out = _lltm("bench", "--json", "--iterations", "10", "--table", "sequence", "--size", "3,4,5", "--seq-len", "6")
    assert out.returncode == 0, out.stderr
    rows = {r["candidate"]: r for r in json.loads(out.stdout)["results"]}
    assert all(r["table"] == "sequence" and r["size"] == "T6 B3 I4 S5" for r in rows.values())
    for name in lltm_core.available_backends():
        r = rows[f"LLTMLayer ({name})"]
        assert r["status"] == "ok" and r["calls"] == 10
        assert r["forward_us"]["median"] > 0 and r["forward_backward_us"]["median"] > 0
        assert r["speedup_vs_lstm"]["forward"] > 0 and r["speedup_vs_lstm"]["forward_backward"] > 0
    assert rows["nn.LSTM"]["status"] == "ok" and not rows["nn.LSTM"]["speedup_vs_lstm"]


def test_bench_reports_a_layer_that_disagrees_as_failing(fake_backends, capsys):
    fake_backends("lltm-fake", {"seq_wrong": "seq_wrong"})
    code = main(["bench", "--backend", "seq_wrong", "--iterations", "5", "--table", "sequence", "--size", "3,4,5",
                 "--seq-len", "4"])
    out = capsys.readouterr().out
    assert code == 1
    line = next(line for line in out.splitlines() if line.strip().startswith("LLTMLayer (seq_wrong)"))
    assert "FAILED" in line and "grad_weights_l0 rel. error" in line, line
    assert "nn.LSTM" in out


def test_bench_goes_on_when_a_backend_raises_mid_run(fake_backends, capsys):
    fake_backends("lltm-fake", {"flaky": "flaky"})
    code = main(["bench", "--iterations", "20", "--no-compile", "--size", "3,4,5"])
    out = capsys.readouterr().out
    assert code == 1
    flaky = next(line for line in out.splitlines() if line.strip().startswith("flaky"))
    assert "FAILED" in flaky and "raised RuntimeError: kernel exploded" in flaky
    assert "x /" in next(line for line in out.splitlines() if line.strip().startswith("ref"))


def test_bench_goes_on_when_torch_compile_fails(monkeypatch, capsys):
    def compile_that_fails(module):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        return run

    monkeypatch.setattr(torch, "compile", compile_that_fails)
    code = main(["bench", "--iterations", "10", "--backend", "ref", "--size", "3,4,5"])
    out = capsys.readouterr().out
    assert code == 1
    compiled = next(line for line in out.splitlines() if line.strip().startswith("torch.compile"))
    assert "FAILED" in compiled and "InvalidCxxCompiler" in compiled and "--no-compile" in compiled
    assert "x /" in next(line for line in out.splitlines() if line.strip().startswith("ref"))


def test_bench_a_size_that_cannot_be_set_up_fails_alone(capsys):
    code = main(["bench", "--iterations", "10", "--no-compile", "--backend", "ref",
                 "--size", "3,4,5", "--size", "100000,100000,100000"])
    out = capsys.readouterr().out
    assert code == 1
    assert "x /" in next(line for line in out.splitlines() if line.strip().startswith("ref"))
    huge = next(line for line in out.splitlines() if "B100000" in line)
    assert "FAILED" in huge and "could not set up this size" in huge


def test_bench_shows_why_a_backend_was_left_out(fake_backends, capsys):
    fake_backends("lltm-fake", {"fast": "fast"})  # float32 only
    code = main(["bench", "--iterations", "10", "--no-compile", "--dtype", "float64", "--size", "3,4,5"])
    out = capsys.readouterr().out
    assert code == 0
    fast = next(line for line in out.splitlines() if line.strip().startswith("fast"))
    assert "SKIPPED" in fast and "takes float32, not float64" in fast


def test_bench_plot_without_matplotlib_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        main(["bench", "--iterations", "10", "--no-compile", "--size", "2,2,2", "--plot", str(tmp_path / "x.png")])


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal and SIGINT")
def test_bench_ctrl_c_prints_what_was_measured():
    import pty
    import select
    import signal
    import time

    # With stderr on a terminal, bench draws its progress bar there: "measuring <group>" says
    # the group has started, so Ctrl-C is sent once it is measuring, however slow the imports.
    # Ctrl-C at a terminal: SIGINT as a shell's foreground job has it, even where this test runs in
    # the background (a shell without job control starts those with SIGINT ignored, and children
    # inherit that, so bench would rightly ignore it).
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "lltm_core", "bench", "--seconds", "60", "--no-compile",
                             "--backend", "ref"], stdout=subprocess.PIPE, stderr=terminal, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(terminal)
    progress, deadline = b"", time.monotonic() + 120
    try:
        while b"measuring" not in progress:
            assert time.monotonic() < deadline and proc.poll() is None, progress.decode(errors="replace")
            if select.select([controller], [], [], 1.0)[0]:
                progress += os.read(controller, 4096)
        time.sleep(3)  # reference check and three warm-up calls take milliseconds: then it times calls
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(controller)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    ref_row = next(line for line in out.splitlines() if line.strip().startswith("ref "))
    assert "x /" in ref_row, out  # timed, with its speed-up against the eager module


@pytest.mark.parametrize(
    "cuda, hip, visible, expected",
    [
        (None, None, False, "this torch is a CPU-only build"),
        ("13.0", None, False, "has CUDA 13.0, but no GPU is visible"),
        (None, "6.2", False, "has ROCm 6.2, but no GPU is visible"),  # a ROCm build is not CPU-only
        (None, "6.2", True, None),
        ("13.0", None, True, None),
    ],
)
def test_why_cuda_is_unavailable(monkeypatch, cuda, hip, visible, expected):
    from lltm_core._device import cuda_unavailable_reason

    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible)
    reason = cuda_unavailable_reason()
    assert reason == expected if expected is None else expected in reason


def test_info_notes_names_in_disable_backends_that_hide_nothing(fake_backends, monkeypatch, capsys):
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "REF,nosuch")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "note: LLTM_DISABLE_BACKENDS names 'REF', 'nosuch', which no installed backend is called (installed: ref)" in out
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "ref")
    assert main(["info"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"lltm-core {lltm_core.__version__} (torch {torch.__version__})"
