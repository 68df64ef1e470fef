"""The examples that need no GPU run, and the notebook executes top to bottom."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _env():
    root = str(EXAMPLES.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))


def test_numpy_example_runs():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "numpy_cpu.py")], env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "relative error after a round trip" in done.stdout


def test_notebook_executes(tmp_path):
    path = EXAMPLES / "quickstart.ipynb"
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:  # no Jupyter here: run the code cells in order, as a kernel would
        cells = json.loads(path.read_text())["cells"]
        namespace, printed = {}, io.StringIO()
        with contextlib.redirect_stdout(printed):
            for cell in cells:
                if cell["cell_type"] == "code":
                    source = compile("".join(cell["source"]), str(path), "exec")
                    exec(source, namespace)  # noqa: S102
        assert "error / group max" in printed.getvalue()
        return
    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("PYTHONPATH", str(EXAMPLES.parent))
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("error / group max" in o.get("text", "") for o in outputs)


def test_fp8_linear_example_runs_its_numpy_part():
    # without a GPU the example quantizes on the NumPy backend and multiplies the dequantized
    # operands: FP8 e4m3 with 1x128 / 128x128 scales errs by a few percent, not more
    env = dict(_env(), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "fp8_linear.py")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    errors = [float(line.split()[-1]) for line in done.stdout.splitlines() if "against" in line]
    assert len(errors) == 3 and all(0 < e < 0.06 for e in errors), done.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("script", ["cupy_gpu.py", "torch_deepgemm.py", "fp8_linear.py"])
def test_gpu_examples_run(script):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_main_job_runs():
    # README command 1 ends with the main job; a small shape keeps the NumPy backend quick here
    done = subprocess.run(
        [sys.executable, "-m", "fp8_group_quant", "--tokens", "64"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "groups recomputed with the spec's scalar model" in done.stdout, done.stdout
    assert "MISMATCH" not in done.stdout
    # on a GPU, every code and scale of the kernel is also compared with the NumPy backend
    on_gpu = "CUDA kernel" in done.stdout
    assert not on_gpu or "bit-exact against the NumPy backend" in done.stdout
