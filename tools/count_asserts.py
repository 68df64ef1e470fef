"""Count the checks the test suite makes, per file and in total, so that a reorganisation of the
tests can show it dropped none.

Per file under tests/ (helpers and conftest included, since the asserts inside helpers are
checks too):

(a) ``assert`` statements (AST nodes);
(b) ``pytest.raises`` and ``pytest.warns`` uses (calls, with or without ``with``);
(c) call sites of assertion helpers: module-level functions defined in tests/ whose body
    asserts (an ``assert``, ``pytest.raises``/``warns``/``fail``, ``raise AssertionError``, a
    library assertion, or a call of another assertion helper), resolved through the file's own
    definitions and its ``from <tests module> import`` lines; plus library assertions
    (``np.testing.assert_*``, ``numpy.testing.assert_*``, ``torch.testing.assert_close``);
(d) test functions (``def test_*``) and, with ``--collect``, the test cases pytest collects
    (``pytest --collect-only -q``, one file at a time; GPU cases are collected without a GPU).

Usage: python tools/count_asserts.py [--collect] [--json FILE] [--skip-collect FILE ...]
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
LIBRARY_ASSERT_PREFIXES = ("np.testing.assert_", "numpy.testing.assert_", "torch.testing.assert_")


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def is_raises(call: ast.Call) -> bool:
    return dotted(call.func) in ("pytest.raises", "pytest.warns")


def is_library_assert(call: ast.Call) -> bool:
    return dotted(call.func).startswith(LIBRARY_ASSERT_PREFIXES)


class Module:
    """One file under tests/: its module-level functions and the names it imports from other
    files under tests/."""

    def __init__(self, path: Path):
        self.path = path
        self.name = path.stem
        self.tree = ast.parse(path.read_text(), str(path))
        self.functions = {
            node.name: node
            for node in self.tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)

    def resolve(self, name: str, modules: dict[str, Module]) -> tuple[str, str] | None:
        if name in self.functions:
            return self.name, name
        if name in self.imports and self.imports[name][0] in modules:
            module, original = self.imports[name]
            return modules[module].resolve(original, modules)
        return None


def assertion_helpers(modules: dict[str, Module]) -> set[tuple[str, str]]:
    """(module, function) of every module-level non-test function that asserts, directly or
    through another such helper (a fixed point over the call graph)."""
    candidates = {
        (m.name, f): node
        for m in modules.values()
        for f, node in m.functions.items()
        if not f.startswith("test_")
    }

    def direct(node) -> bool:
        for child in ast.walk(node):
            if isinstance(child, ast.Assert):
                return True
            if isinstance(child, ast.Call) and (
                is_raises(child) or is_library_assert(child) or dotted(child.func) == "pytest.fail"
            ):
                return True
            if isinstance(child, ast.Raise) and child.exc is not None:
                target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if dotted(target) == "AssertionError":
                    return True
        return False

    helpers = {key for key, node in candidates.items() if direct(node)}
    changed = True
    while changed:
        changed = False
        for key, node in candidates.items():
            if key in helpers:
                continue
            module = modules[key[0]]
            for child in ast.walk(node):
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                    if module.resolve(child.func.id, modules) in helpers:
                        helpers.add(key)
                        changed = True
                        break
    return helpers


def count_file(module: Module, modules, helpers) -> dict:
    asserts = raises = 0
    calls: dict[str, int] = {}
    tests = 0
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Assert):
            asserts += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            tests += node.name.startswith("test_")
        elif isinstance(node, ast.Call):
            if is_raises(node):
                raises += 1
            elif is_library_assert(node):
                name = dotted(node.func).replace("numpy.", "np.")
                calls[name] = calls.get(name, 0) + 1
            elif isinstance(node.func, ast.Name):
                target = module.resolve(node.func.id, modules)
                if target in helpers:
                    name = f"{target[0]}.{target[1]}"
                    calls[name] = calls.get(name, 0) + 1
    return dict(asserts=asserts, raises=raises, helper_calls=sum(calls.values()), calls=calls,
                tests=tests)  # fmt: skip


def collect(path: Path) -> int:
    """Test cases pytest collects from one file (``--collect-only -q``)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         str(path.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    items = [line for line in done.stdout.splitlines() if "::" in line]
    if done.returncode not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"collecting {path.name} failed:\n{done.stdout[-3000:]}{done.stderr}")
    return len(items)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", action="store_true", help="also count collected cases")
    parser.add_argument("--json", help="write the counts to this file as JSON")
    args = parser.parse_args(argv)

    paths = sorted(TESTS.glob("*.py"))
    modules = {p.stem: Module(p) for p in paths}
    helpers = assertion_helpers(modules)
    rows = {}
    for path in paths:
        row = count_file(modules[path.stem], modules, helpers)
        if args.collect and path.name.startswith("test_"):
            row["cases"] = collect(path)
        rows[path.name] = row

    columns = ["asserts", "raises", "helper_calls", "checks", "tests"] + (
        ["cases"] if args.collect else []
    )
    widths = {"asserts": 9, "raises": 9, "helper_calls": 9, "checks": 6, "tests": 8, "cases": 6}
    titles = {"asserts": "(a)assert", "raises": "(b)raises", "helper_calls": "(c)helper",
              "checks": "a+b+c", "tests": "(d)tests", "cases": "cases"}  # fmt: skip

    def line(name: str, row: dict) -> str:
        return f"{name:32}" + "".join(f" {row.get(c, 0):{widths[c]}}" for c in columns)

    print(f"{'file':32}" + "".join(f" {titles[c]:>{widths[c]}}" for c in columns))
    total = dict.fromkeys(["asserts", "raises", "helper_calls", "tests", "cases"], 0)
    for name, row in rows.items():
        row["checks"] = row["asserts"] + row["raises"] + row["helper_calls"]
        print(line(name, row))
        for key in total:
            total[key] += row.get(key, 0)
    total["checks"] = total["asserts"] + total["raises"] + total["helper_calls"]
    print(line("TOTAL", total))

    print("\n(c) assertion helpers counted (call sites over all files):")
    calls: dict[str, int] = {}
    for row in rows.values():
        for name, n in row["calls"].items():
            calls[name] = calls.get(name, 0) + n
    for name in sorted(calls):
        print(f"  {name:48} {calls[name]:5}")
    unused = sorted(f"{m}.{f}" for m, f in helpers if f"{m}.{f}" not in calls)
    if unused:
        print("  (assertion helpers with no call site: " + ", ".join(unused) + ")")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, total=total, calls=calls), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
