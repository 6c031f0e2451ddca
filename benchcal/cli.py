"""The ``benchcal`` command line: parses arguments, calls predictor / harness / calibration, prints.

Every subcommand lives in ``benchcal.commands.<module>`` and registers itself with
``register(subparsers)``; its handler returns an exit code. Bad input raises ``BenchcalError``,
which becomes one line on stderr and exit code 2; nothing recorded is touched.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from predictor.errors import BenchcalError

COMMAND_MODULES = ("predict", "finetune", "cost", "bench", "calibrate")

DESCRIPTION = """\
benchcal: benchmark-calibrated memory and throughput predictions for LLM inference.

Predict whether a model fits a GPU and how fast it runs (predict, leaderboard, matrix, recommend) and
what fine-tuning and serving it cost (finetune, cost), measure it for real with llama.cpp or vLLM
(bench, runs), fit the predictor to the measurements (calibrate, report, check, import).
"""

EPILOG = """\
examples:
  benchcal predict --model qwen2.5-72b --gpu l4 --quant Q4_K_M --ctx 8192
  benchcal leaderboard --model qwen2.5-72b --quant Q4_K_M --ctx 32768
  benchcal finetune --model llama-3.1-8b --gpu rtx-4090
  benchcal bench --gpu cpu --model smollm2-135m --quant Q8_0
  benchcal calibrate && benchcal report --format html > report.html
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"benchcal: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="benchcal", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"benchcal {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"benchcal.commands.{name}") is None:
            continue
        importlib.import_module(f"benchcal.commands.{name}").register(sub)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("benchcal")
    except Exception:  # noqa: BLE001 - not installed: running from a checkout
        return "0.1.0+checkout"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BenchcalError as exc:
        print(f"benchcal: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("benchcal: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - never a traceback for the user; BENCHCAL_DEBUG=1 shows it
        if os.environ.get("BENCHCAL_DEBUG"):
            raise
        print(f"benchcal: internal error: {type(exc).__name__}: {exc} (set BENCHCAL_DEBUG=1 for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
