"""The ``tileflash`` command line (also ``python -m tileflash``).

Each subcommand lives in its own module, which provides two functions:

* ``add_arguments(parser)``: add the subcommand's options to its ``argparse`` parser;
* ``run(args) -> int``: do the work and return the exit status.

and is registered in :data:`SUBCOMMANDS` below. To add a subcommand (for example
``tileflash bench``), write such a module (e.g. ``tileflash/bench/bench.py``) and add
one ``(name, module, help)`` line to :data:`SUBCOMMANDS`; nothing else here changes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# (name, module providing add_arguments/run, one-line help), in the order shown by --help.
SUBCOMMANDS = [
    (
        "demo",
        "tileflash.bench.demo",
        "eager attention vs tileflash for growing sequence lengths: error, time, peak memory",
    ),
    (
        "bench",
        "tileflash.bench.bench",
        "benchmark providers (tileflash, eager, SDPA backends, FlexAttention, flash-attn): time, TFLOP/s, memory",
    ),
    ("plot", "tileflash.bench.plot", "redraw the PNG plots of a `tileflash bench --out DIR` run from DIR/results.json"),
    ("io", "tileflash.bench.io_model", "HBM traffic model: standard attention vs FlashAttention (FlashAttention's IO-complexity argument)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tileflash",
        description="tileflash: exact FlashAttention in Triton for PyTorch.",
    )
    from tileflash import __version__

    parser.add_argument("--version", action="version", version=f"tileflash {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_ in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        doc = (module.__doc__ or help_).strip()
        sub = subparsers.add_parser(
            name, help=help_, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``tileflash`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
