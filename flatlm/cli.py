"""The ``flatlm`` command line: one subcommand group per module under ``flatlm.commands``.

Each command module defines ``register(subparsers)``, adding its parser(s) with
``set_defaults(run=callable)``; ``run(args)`` returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Command modules, in the order their commands are listed by --help.
from flatlm.commands import DIVERGED_EXIT, WORKER_DIED_EXIT, WRITE_FAILED_EXIT
from flatlm.core.registry import PLUGIN_HELP, load_command_plugins
from flatlm.core.workers import WorkerDied

COMMAND_MODULES = ("data", "train", "trial", "config", "measure", "grow", "replicate", "ui")


# how to resume after a failed write; a command whose resume is a flag sets its own
RESUME_HINT = "run the same command again (it resumes from the newest checkpoint)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flatlm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"flatlm.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"flatlm.commands.{name}":
                raise
            continue  # not built yet
        module.register(sub)
    _add_plugin_option(parser)
    return parser


def _add_plugin_option(parser: argparse.ArgumentParser) -> None:
    """``--plugin MODULE`` on every command and subcommand (``main`` has read and loaded them
    before building the parser: this keeps them legal where they are and shows them in help)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):  # aliases: once
                command.add_argument("--plugin", dest="plugins", action="append", default=[],
                                     metavar="MODULE", help=PLUGIN_HELP)
                _add_plugin_option(command)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # before the parser: a plug-in's scale or experiment is one of its choices
        load_command_plugins(argv, os.environ)
    except ValueError as e:
        print(f"flatlm: error: {e}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    from flatlm.train.run import CheckpointWriteError, Diverged

    try:
        return int(args.run(args) or 0)
    except Diverged as e:  # every command that trains: one exit status, no traceback
        print(f"flatlm {args.command}: {e}", file=sys.stderr)
        return DIVERGED_EXIT
    except CheckpointWriteError as e:  # before OSError, which it is
        print(f"flatlm {args.command}: error: {e}: {getattr(args, 'resume_hint', RESUME_HINT)}",
              file=sys.stderr)
        return WRITE_FAILED_EXIT
    except WorkerDied as e:  # a process beside the work (a batch worker, the measurer)
        print(f"flatlm {args.command}: error: {e}; the checkpoints written before are intact: "
              f"{getattr(args, 'resume_hint', RESUME_HINT)}", file=sys.stderr)
        return WORKER_DIED_EXIT
    except ValueError as e:  # bad input: a clear message, not a traceback
        print(f"flatlm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written: say which and why
        where = f" {e.filename}" if e.filename else ""
        print(f"flatlm {args.command}: error:{where}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
