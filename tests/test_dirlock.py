"""One writer per run directory: a second process is refused naming the holder; the lock dies
with its holder (even by SIGKILL) and is re-entrant within a process."""

import os
import signal
import subprocess
import sys

import pytest

from flatlm.cli import main as flatlm
from flatlm.storage.dirlock import DirectoryBusyError, writer_lock

HOLD = ("import sys, time\nfrom flatlm.storage.dirlock import writer_lock\n"
        "with writer_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")


def holder(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_frees_it(tmp_path):
    proc = holder(tmp_path)
    try:
        with pytest.raises(DirectoryBusyError, match=f"pid {proc.pid}"), writer_lock(tmp_path):
            pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with writer_lock(tmp_path), writer_lock(tmp_path):  # freed; re-entrant
        pass


def test_flatlm_train_into_a_busy_directory_exits_2_before_any_work(tmp_path, capsys):
    proc = holder(tmp_path)
    try:
        rc = flatlm(["train", "--source", "dyck:4", "--model", "d16-h1-l1-i32", "--steps", "2",
                     "--batch-size", "4", "--out", str(tmp_path), "--no-progress"])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert rc == 2 and "another process" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
