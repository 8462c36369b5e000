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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_layer_package_runs_in_cpp_as_in_eager(runner, tmp_path, dtype):
    """LLTMLayer (2 layers, bidirectional, batch_first) + Linear: one package, two batch sizes, two lengths."""
    export_model = _export_model()
    torch.manual_seed(1)
    model = export_model.SequenceClassifier(backend="cpu").to(dtype)
    example = torch.randn(3, 9, export_model.INPUT_FEATURES, dtype=dtype)
    package = export_model.export(model, example, dynamic_time=True, package=tmp_path / "model.pt2")
    in_python = torch._inductor.aoti_load_package(str(package))
    for batch in (2, 7):
        for steps in (5, 13):
            x = torch.randn(batch, steps, export_model.INPUT_FEATURES, dtype=dtype)
            with torch.no_grad():
                want = model.eval()(x)
            _check(_run_in_cpp(runner, package, x, tmp_path), want, dtype, f"C++, B{batch} T{steps}")
            _check(in_python(x), want, dtype, f"aoti_load_package, B{batch} T{steps}")


def test_cell_stepped_in_python_runs_in_cpp(runner, tmp_path):
    """The cell LLTM looped over the steps inside the model: the loop is unrolled, the batch stays dynamic."""
    export_model = _export_model()
    torch.manual_seed(2)
    model = export_model.SteppedCell(backend="cpu")
    example = torch.randn(3, 6, export_model.INPUT_FEATURES)
    package = export_model.export(model, example, dynamic_time=False, package=tmp_path / "model.pt2")
    for batch in (1, 5):
        x = torch.randn(batch, 6, export_model.INPUT_FEATURES)
        with torch.no_grad():
            want = model.eval()(x)
        _check(_run_in_cpp(runner, package, x, tmp_path), want, torch.float32, f"C++, B{batch}")


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


def test_the_example_script_prints_how_to_run_it(tmp_path):
    if _missing():
        pytest.skip(_missing())
    done = subprocess.run([sys.executable, str(EXAMPLE / "export_model.py"), str(tmp_path), "--model", "cell"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "model.pt2").is_file()
    assert "lltm_deploy_runner " + lltm_core.get_backend("cpu").operator_library in done.stdout, done.stdout


def test_packed_sequences_say_they_stay_in_python():
    from torch.nn.utils.rnn import pack_padded_sequence

    layer = lltm_core.LLTMLayer(3, 4, backend="ref")

    class Packed(torch.nn.Module):
        def forward(self, x, lengths):
            return layer(pack_padded_sequence(x, lengths, enforce_sorted=False))[1][0]

    with pytest.raises(Exception, match="torch.export cannot take a PackedSequence"):
        torch.export.export(Packed(), (torch.randn(5, 2, 3), torch.tensor([5, 3])))
