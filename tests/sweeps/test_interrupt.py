"""SIGTERM takes the sweep's Ctrl-C path with the shell's exit code 143. A real sweep stopped by
Ctrl-C (exit code 130, runs KILLED, the --resume command, no summary) is the first phase of
tests/sweeps/test_resume_trust.py, which goes on to resume it."""

import signal


def test_sigterm_takes_tunes_sigint_path_and_is_remembered():
    from sweeps.signals import Interrupted, sigterm_as_sigint

    seen = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with sigterm_as_sigint() as received:
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, old)
    assert received == [signal.SIGTERM] and seen == [signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is not None  # restored
    assert Interrupted(signal.SIGTERM, 2, []).exit_code == 143
