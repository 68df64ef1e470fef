"""Do two kernel trees compile to the same code? PTX or machine code of sampled instantiations.

    python tools/same_code.py OTHER_CHECKOUT [--count N] [--arch compute_90 | sm_90] [--match RE]

Compiles N instantiations (the default kernel and a seeded sample of those both trees have) in
this checkout and in OTHER_CHECKOUT (with ``--match``, only names that the regular expression
finds), each in its own process, and compares their PTX with
comments, line marks, the order of global declarations and the per-file hash in internal names
left out. A change
that only moves comments or renames files prints "same"; anything else prints the first diff.
With a real architecture (``sm_90``) it compares the cubins' code sections byte for byte
instead: PTX that differs only in register numbering or the order of independent instructions
often assembles to the same machine code. Needs NVRTC, not a GPU.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import os
import random
import re
import struct
import subprocess
import sys

_CHILD = r"""
import base64, json, random, sys
from fp8_group_quant import _jit
try:
    from fp8_group_quant import _plan as plan
except ImportError:  # trees from before the plan layer
    from fp8_group_quant import _launch as plan
arch, wanted = sys.argv[1], json.loads(sys.stdin.read())
known = set(plan.all_name_expressions())
if wanted is None:  # list this tree's names
    json.dump(sorted(known) + ["DEFAULT:" + plan.DEFAULT_KEY.name_expression], sys.stdout)
    sys.exit()
out = {}
for name in wanted:
    if name in known:
        binary, _, _ = _jit._nvrtc_compile(plan.SOURCE, [name], arch)
        if arch.startswith("sm_"):  # a cubin
            binary = base64.b64encode(binary)
        out[name] = binary.decode() if isinstance(binary, bytes) else binary
json.dump(out, sys.stdout)
"""


def _normalised(ptx: str) -> list[str]:
    ptx = re.sub(r"_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+_\d+", "_INTERNAL_", ptx)
    lines = [line for line in ptx.splitlines() if line.strip()]
    lines = [line for line in lines if not line.lstrip().startswith(("//", ".loc", ".file"))]
    declarations = sorted(line for line in lines if line.startswith(".global"))
    return declarations + [line for line in lines if not line.startswith(".global")]


def _code_sections(cubin_b64: str) -> list[tuple[str, bytes]]:
    """A cubin's code sections (ELF64 ``.text.*``: the kernels' machine code), by name."""
    elf = base64.b64decode(cubin_b64)
    (section_table,) = struct.unpack_from("<Q", elf, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, section_table + i * entry_size)
                for i in range(count)]  # fmt: skip
    names_at = sections[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return elf[start : elf.index(b"\0", start)].decode()

    return sorted((name(s[0]), elf[s[4] : s[4] + s[5]]) for s in sections
                  if name(s[0]).startswith(".text"))  # fmt: skip


def _child(tree: str, arch: str, wanted) -> object:
    env = dict(os.environ, PYTHONPATH=tree, FP8_GROUP_QUANT_COMPILE_ON_IMPORT="0")
    result = subprocess.run([sys.executable, "-c", _CHILD, arch], cwd=tree, env=env,
                            input=json.dumps(wanted), capture_output=True, text=True,
                            check=True)  # fmt: skip
    return json.loads(result.stdout)


def _sample(here: str, other: str, count: int, arch: str, match: str | None) -> list[str]:
    """The default kernel and ``count`` seeded picks among the names both trees know."""
    mine, theirs = _child(here, arch, None), _child(other, arch, None)
    default = next(n for n in mine if n.startswith("DEFAULT:"))[len("DEFAULT:") :]
    both = sorted(set(mine) & set(theirs) - {n for n in mine if n.startswith("DEFAULT:")})
    random.seed(count)
    if match is not None:
        both = [n for n in both if re.search(match, n)]
        return random.sample(both, min(count, len(both)))
    return [default] + random.sample(both, min(count, len(both)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--arch", default="compute_90")
    parser.add_argument("--match", help="sample only the names this regular expression finds")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = _sample(here, args.other, args.count, args.arch, args.match)
    if not names:
        print(f"no instantiation both trees know matches {args.match!r}")
        return 2
    mine, theirs = _child(here, args.arch, names), _child(args.other, args.arch, names)
    if args.arch.startswith("sm_"):
        code = {n: (_code_sections(theirs[n]), _code_sections(mine[n])) for n in mine}
        differ = [n for n, (old, new) in code.items() if old != new]
        for name in differ[:1]:
            sizes = [[len(text) for _, text in sections] for sections in code[name]]
            print(f"{name}: code sections differ (bytes, theirs then mine: {sizes})")
        print(f"{len(mine) - len(differ)} of {len(mine)} instantiations: same machine code")
        return 1 if differ else 0
    differ = [name for name in mine if _normalised(mine[name]) != _normalised(theirs.get(name, ""))]
    for name in differ[:1]:
        diff = difflib.unified_diff(_normalised(theirs.get(name, "")), _normalised(mine[name]),
                                    lineterm="", n=1)  # fmt: skip
        print(name, *list(diff)[:40], sep="\n")
    print(f"{len(mine) - len(differ)} of {len(mine)} instantiations: same code")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
