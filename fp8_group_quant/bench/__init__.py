"""The benchmark, ``python -m fp8_group_quant bench`` (``--help`` lists its options), and the
harnesses that time SGLang's and vLLM's kernels beside ours (``bench --peers``).

Modules: ``cli`` (options and dispatch), ``shapes`` (default shapes, the bytes-moved model),
``timing`` (graph replay over rotating buffers, eager timing), ``plain`` (the table,
``--matrix``, ``--cold-start``), ``host`` (``--profile-host``), ``sweep`` (``--sweep``),
``chain`` (``--chain``), ``fused`` (``--fused``), ``nvfp4`` (``--nvfp4``), ``peers``,
``peers_fused`` and ``peers_vllm`` (``--peers``), and ``_hooks``, the one module that reaches
below the library's public API. Importing this package imports none of them; the library itself
never imports it.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The benchmark with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .cli import main as run

    return run(argv)
