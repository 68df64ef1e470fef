"""Packaging facts a user relies on: one version, the license shipped, no development logs."""

import importlib.metadata
import inspect
import pathlib
import re

import pytest

import fp8_group_quant

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    source = (ROOT / _pyproject()["tool"]["hatch"]["version"]["path"]).read_text()
    assert re.findall(r'^__version__ = "([^"]+)"$', source, re.M) == [fp8_group_quant.__version__]
    try:  # installed (CI installs the checkout): the metadata carries the same version
        installed = importlib.metadata.version("fp8_group_quant")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout (PYTHONPATH=.)
        installed = fp8_group_quant.__version__
    assert installed == fp8_group_quant.__version__


def test_the_license_is_shipped_and_declared():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    # PEP 639: the expression replaces the license classifiers, which may not be repeated
    assert not any(c.startswith("License ::") for c in project["classifiers"])


def test_the_sdist_leaves_out_development_records_and_keeps_the_sources():
    sdist = _pyproject()["tool"]["hatch"]["build"]["targets"]["sdist"]
    assert "docs/*.json" in sdist["exclude"] and "kernels" in sdist["include"]
    assert {"LICENSE", "CHANGELOG.md", "README.md"} <= set(sdist["include"])


def test_every_optional_tool_has_an_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    assert any(d.startswith("hypothesis") for d in extras["test"])


def test_each_cuda_extra_brings_the_driver_bindings_of_its_major_version():
    # a cuda12 install with CUDA 13's bindings (or none) would launch without PDL
    extras = _pyproject()["project"]["optional-dependencies"]
    for extra, major in (("cuda12", 12), ("cuda13", 13)):
        (bindings,) = [d for d in extras[extra] if d.startswith("cuda-bindings")]
        assert bindings == f"cuda-bindings>={major}.{8 if major == 12 else 0},<{major + 1}"
        assert any(d.startswith(f"cupy-cuda{major}x") for d in extras[extra])
    assert not any(d.startswith("cuda-") for d in _pyproject()["project"]["dependencies"])


def test_the_option_types_name_every_registered_option():
    # the Literal types users' type checkers see, against the registries the checks read
    from typing import get_args

    from fp8_group_quant import _layout, _spec

    assert set(get_args(fp8_group_quant.FormatName)) == set(_spec._FORMAT_NAMES)
    assert set(get_args(fp8_group_quant.ScaleName)) == set(_spec.SCALE_FORMATS) | {"e4m3"}
    assert set(get_args(fp8_group_quant.LayoutName)) == set(_layout.LAYOUTS)
    assert get_args(fp8_group_quant.ScaleRuleName) == _spec.SCALE_RULES
    signature = inspect.signature(fp8_group_quant.quantize)  # annotations stay strings
    assert signature.parameters["layout"].annotation == "LayoutName"
    assert signature.parameters["scale"].annotation == "ScaleName"
    assert signature.parameters["scale_rule"].annotation == "ScaleRuleName"
    assert signature.return_annotation == "tuple[Array, ...]"  # NVFP4 may add a global scale


def test_readme_is_a_users_page_whose_commands_ci_runs():
    # issue 43, item 6: about 200 lines, tables that render, the set-up commands CI runs, how
    # long the tests take, every drop-in, links that name their target
    root = pathlib.Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    lines = readme.splitlines()
    assert 120 <= len(lines) <= 240, len(lines)
    ci = (root / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)[0].splitlines()
    assert len(commands) == 2 and all(command in ci for command in commands)
    assert re.search(r"tests take about [\d-]+ minutes", readme)
    for a, b, c in zip(lines, lines[1:], lines[2:]):  # no blank line splits a table
        assert not (a.startswith("|") and not b.strip() and c.startswith("|")), a
    from fp8_group_quant import compat

    for name in compat.__all__:
        assert f"`{name}`" in readme, name
    for text, target in re.findall(r"\[([^\]]+)\]\(([^)]+)\)", readme):
        assert target.startswith("https://") or text == target, (text, target)
    assert "GPU-only" in readme and "prepare" in readme
    assert "external brief" not in (root / "docs" / "spec.md").read_text()
