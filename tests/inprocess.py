"""A command line's ``main(argv)`` run in this process as the interpreter would run its script: its
exit code (``SystemExit``'s, a message's 1, an uncaught exception's 1 with its traceback on
stderr), its stdout, and its stderr with every warning it raised written as Python writes one.
A subprocess would cost each call about 5 s of importing torch; the script's own start (its
``sys.path`` and ``__main__``) is run by tests/test_readme.py's ``--help`` of every script."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path


def run_main(main: Callable, argv: list, *, cwd: Path | None = None
             ) -> subprocess.CompletedProcess:
    """``main([str(a) for a in argv])`` from ``cwd`` (then back), as a finished process."""
    args = [str(a) for a in argv]
    stdout, stderr = io.StringIO(), io.StringIO()
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            warnings.simplefilter("always")  # what a fresh process shows once is shown here
            code = _exit_code(main, args, stderr)
    finally:
        os.chdir(before)
    for w in caught:
        stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def _exit_code(main: Callable, args: list[str], stderr: io.StringIO) -> int:
    try:
        code = main(args)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=stderr)  # SystemExit("error: ..."): the message, exit 1
        return 1
    except Exception:  # noqa: BLE001 (what the interpreter prints for an uncaught exception)
        stderr.write(traceback.format_exc())
        return 1
    return code or 0
