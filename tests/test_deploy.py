"""The deploy path end to end: export an LLTM model, compile it with AOTInductor, run the package from
a C++ program that has no Python in it (examples/deploy/), and compare with Python eager.

Needs a compiled backend (lltm-cpu), cmake and a C++ compiler; without them the tests skip and say
which is missing, unless LLTM_REQUIRE_DEPLOY=1 (the cpu nox session sets it), where that fails.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm_core

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "deploy"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
FEATURES = 32  # export_model.INPUT_FEATURES: what its models take


def _missing() -> str | None:
    if "cpu" not in lltm_core.available_backends():
        return "lltm-cpu is not installed here (its operators are what the package calls)"
    for tool in ("cmake", os.environ.get("CXX", "c++")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (the C++ runner is built with it)"
    return None


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    missing = _missing()
    if missing:
        if os.environ.get("LLTM_REQUIRE_DEPLOY") == "1":
            pytest.fail(f"LLTM_REQUIRE_DEPLOY=1, but {missing}")
        pytest.skip(missing)
    build = tmp_path_factory.mktemp("runner")
    for command in (["cmake", "-S", str(EXAMPLE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"], ["cmake", "--build", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)} (torch {torch.__version__}):\n{done.stdout}{done.stderr}"
    return build / "lltm_deploy_runner"


def _export_model():
    spec = importlib.util.spec_from_file_location("export_model", EXAMPLE / "export_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_in_cpp(runner: Path, package: Path, x: torch.Tensor, tmp: Path, library: str | None = None) -> torch.Tensor:
    torch.save([x], tmp / "inputs.pt")
    library = library or lltm_core.get_backend("cpu").operator_library
    done = subprocess.run([str(runner), library, str(package),
                           str(tmp / "inputs.pt"), str(tmp / "outputs.pt")],
                          capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "libpython mapped: no" in done.stdout, done.stdout
    return torch.load(tmp / "outputs.pt")[0]


def _check(got, want, dtype, what):
    error = ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.3g} above {TOLERANCE[dtype]:g}"


def _export_layer(dtype: torch.dtype, seed: int, folder: Path):
    """(SequenceClassifier on lltm-cpu in ``dtype``, its package: batch and time dynamic)."""
    export_model = _export_model()
    torch.manual_seed(seed)
    model = export_model.SequenceClassifier(backend="cpu").to(dtype)
    example = torch.randn(3, 9, export_model.INPUT_FEATURES, dtype=dtype)
    return model, export_model.export(model, example, dynamic_time=True, package=folder / "model.pt2")


@pytest.fixture(scope="module")
def layer_package(runner, tmp_path_factory):
    """The float32 layer's (model, package), one AOTInductor compile for every test that runs it."""
    return _export_layer(torch.float32, 1, tmp_path_factory.mktemp("package"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_layer_package_runs_in_cpp_as_in_eager(runner, layer_package, tmp_path, dtype):
    """LLTMLayer (2 layers, bidirectional, batch_first) + Linear: one package, two batch sizes, two lengths."""
    model, package = layer_package if dtype == torch.float32 else _export_layer(dtype, 2, tmp_path)
    in_python = torch._inductor.aoti_load_package(str(package))
    for batch in (2, 7):
        for steps in (5, 13):
            x = torch.randn(batch, steps, FEATURES, dtype=dtype)
            with torch.no_grad():
                want = model.eval()(x)
            _check(_run_in_cpp(runner, package, x, tmp_path), want, dtype, f"C++, B{batch} T{steps}")
            _check(in_python(x), want, dtype, f"aoti_load_package, B{batch} T{steps}")


def test_a_model_exported_on_lltm_ref_needs_no_lltm_library(runner, tmp_path):
    """lltm-ref's kernels are ATen operators: export traces through them (static shapes), and the
    package runs in C++ with no operator library loaded."""
    export_model = _export_model()
    torch.manual_seed(3)
    model = export_model.SequenceClassifier(backend="ref").eval()
    x = torch.randn(2, 5, export_model.INPUT_FEATURES)
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        want = model(x)
    assert not [n for n in program.graph.nodes if n.op == "call_function" and "lltm" in str(n.target)]
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "model.pt2"))
    _check(_run_in_cpp(runner, Path(package), x, tmp_path, library="-"), want, torch.float32, "C++, lltm-ref")


def test_the_example_script_prints_how_to_run_it(runner, tmp_path):
    """The cell model looped over its steps in Python (the loop unrolled, the batch dynamic), exported
    by the script as examples/deploy/README.md runs it: its package runs in C++ as the script's eager
    run did, on the script's batch and on one row of it."""
    done = subprocess.run([sys.executable, str(EXAMPLE / "export_model.py"), str(tmp_path), "--model", "cell"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    package = tmp_path / "model.pt2"
    assert package.is_file()
    assert "lltm_deploy_runner " + lltm_core.get_backend("cpu").operator_library in done.stdout, done.stdout
    (x,), (want,) = torch.load(tmp_path / "inputs.pt"), torch.load(tmp_path / "expected.pt")
    assert x.shape[0] > 1, x.shape
    runs = tmp_path / "runs"  # _run_in_cpp writes its own inputs.pt: not over the script's
    runs.mkdir()
    _check(_run_in_cpp(runner, package, x, runs), want, torch.float32, f"C++, B{x.shape[0]}")
    _check(_run_in_cpp(runner, package, x[:1].clone(), runs), want[:1], torch.float32, "C++, B1")


def test_packed_sequences_say_they_stay_in_python():
    from torch.nn.utils.rnn import pack_padded_sequence

    layer = lltm_core.LLTMLayer(3, 4, backend="ref")

    class Packed(torch.nn.Module):
        def forward(self, x, lengths):
            return layer(pack_padded_sequence(x, lengths, enforce_sorted=False))[1][0]

    with pytest.raises(Exception, match="torch.export cannot take a PackedSequence"):
        torch.export.export(Packed(), (torch.randn(5, 2, 3), torch.tensor([5, 3])))


# --- what the runner and the export script refuse -------------------------------------------------


def _run_runner(runner: Path, package: Path, inputs, tmp: Path, *extra, library=None, outputs=None):
    torch.save(inputs, tmp / "inputs.pt")
    library = library or lltm_core.get_backend("cpu").operator_library
    outputs = outputs or tmp / "outputs.pt"
    return subprocess.run([str(runner), library, str(package), str(tmp / "inputs.pt"), str(outputs), *extra],
                          capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})


def _assert_refused(done, *fragments):
    message = done.stdout + done.stderr
    assert done.returncode == 1, f"exit {done.returncode}:\n{message}"  # an error, not a signal or 0
    assert "Exception raised from" not in message and "frame #" not in message, message  # no C++ backtrace
    for fragment in fragments:
        assert fragment in done.stderr, message


@pytest.mark.parametrize("x, fragment", [
    (torch.randn(2, 5, FEATURES - 1), "shape [2, 5, 31]"),
    (torch.randn(2, 5, FEATURES, dtype=torch.float64), "dtype Double"),
    (torch.randn(2, 5, FEATURES, 2), "shape [2, 5, 32, 2]"),
    (torch.randn(2, FEATURES, 5).transpose(1, 2), "(not contiguous)"),
], ids=["features", "dtype", "rank", "strides"])
def test_runner_refuses_inputs_the_package_was_not_exported_for(runner, layer_package, tmp_path, x, fragment):
    done = _run_runner(runner, layer_package[1], [x], tmp_path)
    _assert_refused(done, "the inputs differ from what the package was exported for", fragment)


def test_runner_refuses_an_empty_input(runner, layer_package, tmp_path):
    done = _run_runner(runner, layer_package[1], [torch.randn(2, 0, FEATURES)], tmp_path)  # SIGFPE unchecked
    _assert_refused(done, "input 0 is empty", "shape [2, 0, 32]")


def test_runner_says_what_inputs_pt_must_hold(runner, layer_package, tmp_path):
    done = _run_runner(runner, layer_package[1], {"x": torch.randn(2, 5, FEATURES)}, tmp_path)
    _assert_refused(done, "must hold a tensor, or a list or tuple of tensors")
    assert "INTERNAL ASSERT" not in done.stderr


def test_runner_fails_on_an_output_path_it_cannot_write(runner, layer_package, tmp_path):
    done = _run_runner(runner, layer_package[1], [torch.randn(2, 5, FEATURES)], tmp_path,
                       outputs=tmp_path / "missing" / "outputs.pt")
    _assert_refused(done, "cannot write", "missing/outputs.pt")


def test_runner_refuses_a_bad_repeat_before_running(runner, layer_package, tmp_path):
    done = _run_runner(runner, layer_package[1], [torch.randn(2, 5, FEATURES)], tmp_path, "--repeat", "abc")
    assert done.returncode == 2 and "--repeat takes a whole number of runs >= 1, got 'abc'" in done.stderr, done.stderr
    assert "ran " not in done.stdout and not (tmp_path / "outputs.pt").exists()


def test_runner_without_the_operator_library_says_so_without_a_backtrace(runner, layer_package, tmp_path):
    done = _run_runner(runner, layer_package[1], [torch.randn(2, 5, FEATURES)], tmp_path, library="-")
    _assert_refused(done, "Could not find schema for lltm_cpu::", "python -m lltm_cpu --library")


def test_export_script_refuses_a_folder_others_can_write(tmp_path, monkeypatch):
    private_folder = _export_model().private_folder
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SystemExit, match=r"writable by others \(mode 777\)"):
        private_folder(shared)
    shared.chmod(0o755)
    assert private_folder(shared) == shared
    monkeypatch.setattr(os, "getuid", lambda: shared.stat().st_uid + 1)
    with pytest.raises(SystemExit, match=r"belongs to another user"):
        private_folder(shared)
    created = private_folder(tmp_path / "new" / "out")
    assert created.is_dir() and created.stat().st_mode & 0o077 == 0
