"""The package's layers import only downward, and no function grows past a screen.

A call moves down one staircase: the entry points, the run layer (bridging, dispatch, the
backends), the request (describe and validate once), the plan (kernel, grid, Params), the
launch, the JIT. Facts that every layer reads (formats, layouts, the kernel ABI, settings,
tuning, the NumPy arithmetic) sit beside the staircase and import nothing above them.
docs/architecture.md draws the same picture.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fp8_group_quant"

# rank: a module may import modules of its own rank or higher (further down); None: any module
LAYERS = {
    0: ["__init__", "__main__", "api", "compat", "torch_ops", "bench"],  # entry points
    1: ["_run", "_host", "_device", "_dequantize"],  # bridging, dispatch, the two backends
    2: ["_request", "_outputs"],  # describe and validate once
    3: ["_plan"],  # kernel key, grid, Params
    4: ["_launch"],  # carry a plan out
    5: ["_jit", "_arrays"],  # find, compile, cache and load kernels; read arrays' memory
    6: ["_abi", "_settings", "_tuning", "_spec", "_layout", "_sample", "reference",
        "activation", "spec_model"],  # facts every layer reads
}  # fmt: skip
RANK = {name: rank for rank, names in LAYERS.items() for name in names}


def _module(path: Path) -> str:
    """The layer name of a package file: its module, or its top-level subpackage."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _imports(path: Path, text: str | None = None) -> set[str]:
    """Package modules ``path`` imports, anywhere in the file (lazy imports included)."""
    found = set()
    depth = len(path.relative_to(PACKAGE).parts) - 1
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "fp8_group_quant":
                    continue
                names = parts[1:2] or [alias.name for alias in node.names]
            elif node.level - 1 == depth:  # relative to the package root
                names = (node.module or "").split(".")[:1] if node.module else []
                names = names or [alias.name for alias in node.names]
            else:
                continue  # inside a subpackage: its own modules
            # a name that is no module of the package is the package root's (__init__)
            found.update(name if name in RANK else "__init__" for name in names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "fp8_group_quant":
                    found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def test_every_module_has_a_layer():
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    assert modules == set(RANK), (modules - set(RANK), set(RANK) - modules)


def _documented_modules() -> dict[str, int | None]:
    """docs/architecture.md's module table: each module named there, with the line count the
    table gives (None where it gives none)."""
    table = {}
    for row in (PACKAGE.parent / "docs" / "architecture.md").read_text().splitlines():
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if len(cells) != 4 or not cells[0][:1].isdigit():
            continue
        names = re.findall(r"`(\w+)(?:\.py|/)`", cells[1])
        counts = [int(c) for c in re.findall(r"\d+", cells[2])] or [None] * len(names)
        table.update(zip(names, counts, strict=True))
    return table


def test_the_architecture_document_lists_every_module_and_its_size():
    # the picture a new engineer reads first: every module in it, at its layer, and each
    # size it quotes within 15% of the file's (the sizes are what show where the weight is)
    table = _documented_modules()
    assert set(table) == set(RANK), set(RANK) ^ set(table)
    for name, count in table.items():
        if count is not None:
            lines = len((PACKAGE / f"{name}.py").read_text().splitlines())
            assert abs(lines - count) <= 0.15 * lines, (name, count, lines)


def test_layers_import_only_downward():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        importer = _module(path)
        for imported in _imports(path):
            if imported in RANK and RANK[imported] < RANK[importer]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {imported}")
    assert not upward, upward


def test_the_check_sees_upward_imports():
    # the test above can fail: the launch layer importing the request, at the top or inside
    # a function, absolutely or relatively, is seen
    launch = PACKAGE / "_launch.py"
    for line in (
        "from ._request import Request",
        "import fp8_group_quant._request",
        "def f():\n    from . import _request",
        "from fp8_group_quant import _request",
    ):
        assert "_request" in _imports(launch, launch.read_text() + "\n" + line + "\n"), line
    # the package root is the entry layer: reaching it from below climbs too
    for line in ("from . import quantize", "import fp8_group_quant", "from fp8_group_quant "
                 "import quantize_packed"):  # fmt: skip
        assert "__init__" in _imports(launch, launch.read_text() + "\n" + line + "\n"), line
    bench = PACKAGE / "bench" / "cli.py"
    assert "_run" in _imports(bench, "from .._run import Call\n")


# the public entry points whose docstrings are the API's reference: their code is held to the
# 60 lines, their docstrings are not
REFERENCE_DOCSTRINGS = {"api.py": {"quantize", "quantize_weight"}}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_function_is_longer_than_a_screen(path):
    # 60 lines from the def to the last line, docstring included
    long = []
    exempt = REFERENCE_DOCSTRINGS.get(str(path.relative_to(PACKAGE)), set())
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first, body = node.lineno, node.body
            if node.name in exempt and isinstance(body[0], ast.Expr):
                first = body[1].lineno
            if node.end_lineno - first + 1 > 60:
                long.append(f"{node.name}: {node.end_lineno - first + 1} lines")
    assert not long, long
