"""The benchmark is a subpackage the library never loads, and its modules import without a loop.

Each check that depends on what an import loads runs in a fresh interpreter: in this one, other
tests have imported the benchmark already.
"""

import ast
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fp8_group_quant"
BENCH = PACKAGE / "bench"
LIBRARY_MODULES = sorted(
    f"fp8_group_quant.{info.name}"
    for info in pkgutil.iter_modules([str(PACKAGE)])
    if info.name != "bench"
)
BENCH_MODULES = sorted(
    f"fp8_group_quant.bench.{info.name}" for info in pkgutil.iter_modules([str(BENCH)])
)
OPTIONAL = ("torch",)  # a module that needs one of these is skipped where it is not installed


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-c", code]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_the_library_and_its_cli_never_import_the_benchmark():
    # every module but the benchmark's (those needing a missing optional library skipped), then
    # the main job and `info` through the CLI: none of them loads fp8_group_quant.bench
    done = _python(f"""
import importlib, sys
import fp8_group_quant
for name in {LIBRARY_MODULES!r}:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name not in {OPTIONAL!r}:
            raise
from fp8_group_quant import __main__ as cli
assert cli.main(["--tokens", "4", "--hidden", "256"]) == 0
assert cli.main(["info"]) == 0
loaded = sorted(n for n in sys.modules if n.split(".")[:2] == ["fp8_group_quant", "bench"])
print("bench modules loaded:", loaded)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bench modules loaded: []" in done.stdout


@pytest.mark.parametrize("name", ["fp8_group_quant.bench", *BENCH_MODULES])
def test_each_bench_module_imports_first_in_a_fresh_interpreter(name):
    # a loop between modules fails on the import of whichever of them comes first
    done = _python(f"import importlib; importlib.import_module({name!r})")
    assert done.returncode == 0, done.stderr[-3000:]


def _imports(path: Path, package: str) -> list[tuple[str, bool]]:
    """(absolute module name, imported at module level) of every import in ``path``, functions'
    included; ``from . import x`` names ``package.x`` only (a module's package is imported
    before the module itself, so it is no edge of a loop)."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if node.module:
                found.append((module, id(node) in top))
            found += [(f"{module}.{alias.name}", id(node) in top) for alias in node.names]
    return found


def test_the_bench_modules_import_one_another_without_a_cycle():
    # the graph of imports between the benchmark's modules, lazy ones included, is acyclic
    modules = {f"fp8_group_quant.bench.{p.stem}": p for p in BENCH.glob("*.py")}
    modules["fp8_group_quant.bench"] = modules.pop("fp8_group_quant.bench.__init__")
    edges = {
        name: {m for m, _ in _imports(path, "fp8_group_quant.bench") if m in modules and m != name}
        for name, path in modules.items()
    }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import loop: {' -> '.join((*path, name))}"
        if name not in done:
            for other in sorted(edges[name]):
                visit(other, (*path, name))
            done.add(name)

    for name in sorted(modules):
        visit(name, ())


def test_only_the_cli_entry_imports_the_benchmark_and_only_lazily():
    for path in PACKAGE.glob("*.py"):
        imports = [
            (m, top)
            for m, top in _imports(path, "fp8_group_quant")
            if m.startswith("fp8_group_quant.bench")
        ]
        if path.name == "__main__.py":
            assert imports and not any(top for _, top in imports), imports
        else:
            assert not imports, (path.name, imports)


def test_only_the_hooks_module_reaches_below_the_public_api():
    # _hooks gathers every use of api's private names and of the layers under the entry
    # points, so that a change of those layers is repointed in one file
    below = {
        f"fp8_group_quant.{m}"
        for m in (
            "_run",
            "_device",
            "_host",
            "_request",
            "_outputs",
            "_plan",
            "_launch",
            "_jit",
            "_tuning",
        )
    }
    for path in BENCH.glob("*.py"):
        if path.name == "_hooks.py":
            continue
        imported = {m for m, _ in _imports(path, "fp8_group_quant.bench")}
        assert not imported & below, (path.name, imported & below)
        assert not [m for m in imported if m.startswith("fp8_group_quant.api._")], path.name
        tree = ast.parse(path.read_text())
        private = [
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "api"
            and node.attr.startswith("_")
        ]
        assert not private, (path.name, private)
