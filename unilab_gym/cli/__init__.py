"""The ``unilab-gym`` command: one entry point, one subcommand per tool.

    unilab-gym --help
    unilab-gym robustness --model runs/ppo_dr/model.zip --algo ppo --episodes 320
    unilab-gym play runs/ppo_sb3/model.zip --out walk.gif

Each subcommand is a module of this package with a ``main(argv)`` function; its options are
its own (``unilab-gym <subcommand> --help``). A subcommand's module is imported only when it
runs, so ``unilab-gym --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with each option's default, and descriptions kept as written.

    ``argparse.ArgumentDefaultsHelpFormatter`` appends ``(default: X)`` to every option with a help
    text; this one leaves out ``None`` defaults and flags (``store_true``), whose help says what
    happens without them. The subcommands, the examples and the benchmarks use it.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


#: subcommand -> (module with ``main(argv)``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "robustness": (
        "unilab_gym.cli.robustness",
        "evaluate a policy over a grid of physics perturbations, or replay one episode",
    ),
    "play": ("unilab_gym.cli.play", "write a video of a saved SB3 model walking"),
    "export": ("unilab_gym.cli.export", "export a saved SB3 model to ONNX (parity-checked), a student, a C header"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``unilab-gym <subcommand> [options]``; return the process exit code (0 on success)."""
    parser = argparse.ArgumentParser(
        prog="unilab-gym",
        description="unilab-gym command-line tools. Run 'unilab-gym <subcommand> --help' for a subcommand's options.",
    )
    sub = parser.add_subparsers(dest="subcommand", metavar="<subcommand>", required=True)
    for name, (_, summary) in SUBCOMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.subcommand][0])
    module.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
