"""The ``flatlm`` command line: one subcommand group per module under ``flatlm.commands``.

Each command module (``flatlm.commands.COMMANDS``) defines ``register(subparsers)``, adding its
parser(s) with ``set_defaults(run=callable)``; ``run(args)`` returns an exit code. Only the
command being run is imported and registered (``build_parser``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterable

from flatlm.commands import COMMANDS, DIVERGED_EXIT, WORKER_DIED_EXIT, WRITE_FAILED_EXIT
from flatlm.core.registry import PLUGIN_HELP, load_command_plugins
from flatlm.core.workers import WorkerDied
from flatlm.train.errors import CheckpointWriteError, Diverged

# how to resume after a failed write; a command whose resume is a flag sets its own
RESUME_HINT = "run the same command again (it resumes from the newest checkpoint)"


def build_parser(commands: Iterable[str] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The command line, with the options of ``commands`` (default: every command). The others
    are listed by name and help line alone (``flatlm.commands.COMMANDS``), their modules not
    imported: ``main`` builds only the command it runs, so a command that needs no torch, and
    ``flatlm --help``, start without importing torch and transformers."""
    parser = argparse.ArgumentParser(prog="flatlm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_line in COMMANDS.items():
        if name in commands:
            importlib.import_module(f"flatlm.commands.{name}").register(sub)
        else:
            sub.add_parser(name, help=help_line)
    _add_plugin_option(parser)
    return parser


def _named_command(argv: list[str]) -> tuple[str, ...]:
    """The command ``argv`` runs, as ``build_parser`` takes it (none: ``flatlm --help``, or a word
    that names no command). The top-level parser's only option is ``-h``, which takes no value,
    so the first word that is not an option is the command (or an error listing them all).

    >>> _named_command(["trial", "--out", "t"]), _named_command(["-h"]), _named_command(["x"])
    (('trial',), (), ())
    """
    word = next((a for a in argv if not a.startswith("-")), None)
    return (word,) if word in COMMANDS else ()


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
    args = build_parser(_named_command(argv)).parse_args(argv)
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
