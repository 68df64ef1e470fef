"""Do two kernel trees compile to the same code? PTX of sampled instantiations, compared.

    python tools/same_code.py OTHER_CHECKOUT [--count N] [--arch compute_90]

Compiles N instantiations (the default kernel and a seeded sample of those both trees have) in
this checkout and in OTHER_CHECKOUT, each in its own process, and compares their PTX with
comments, line marks, the order of global declarations and the per-file hash in internal names
left out. A change
that only moves comments or renames files prints "same"; anything else prints the first diff.
Needs NVRTC, not a GPU.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import subprocess
import sys

_CHILD = r"""
import json, random, sys
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
        out[name] = binary.decode() if isinstance(binary, bytes) else binary
json.dump(out, sys.stdout)
"""


def _normalised(ptx: str) -> list[str]:
    ptx = re.sub(r"_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+_\d+", "_INTERNAL_", ptx)
    lines = [line for line in ptx.splitlines() if line.strip()]
    lines = [line for line in lines if not line.lstrip().startswith(("//", ".loc", ".file"))]
    declarations = sorted(line for line in lines if line.startswith(".global"))
    return declarations + [line for line in lines if not line.startswith(".global")]


def _child(tree: str, arch: str, wanted) -> object:
    env = dict(os.environ, PYTHONPATH=tree, FP8_GROUP_QUANT_COMPILE_ON_IMPORT="0")
    result = subprocess.run([sys.executable, "-c", _CHILD, arch], cwd=tree, env=env,
                            input=json.dumps(wanted), capture_output=True, text=True,
                            check=True)  # fmt: skip
    return json.loads(result.stdout)


def _sample(here: str, other: str, count: int, arch: str) -> list[str]:
    """The default kernel and ``count`` seeded picks among the names both trees know."""
    mine, theirs = _child(here, arch, None), _child(other, arch, None)
    default = next(n for n in mine if n.startswith("DEFAULT:"))[len("DEFAULT:") :]
    both = sorted(set(mine) & set(theirs) - {n for n in mine if n.startswith("DEFAULT:")})
    random.seed(count)
    return [default] + random.sample(both, min(count, len(both)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--arch", default="compute_90")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = _sample(here, args.other, args.count, args.arch)
    mine, theirs = _child(here, args.arch, names), _child(args.other, args.arch, names)
    differ = [name for name in mine if _normalised(mine[name]) != _normalised(theirs.get(name, ""))]
    for name in differ[:1]:
        diff = difflib.unified_diff(_normalised(theirs.get(name, "")), _normalised(mine[name]),
                                    lineterm="", n=1)  # fmt: skip
        print(name, *list(diff)[:40], sep="\n")
    print(f"{len(mine) - len(differ)} of {len(mine)} instantiations: same code")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
