"""Settings shared by the whole suite."""

import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Under pytest-xdist (pyproject's addopts: two workers on a 2-core machine) the processes a test
# starts (the CLI, bench scripts, Ray's driver) use one OpenMP thread too, as the test processes
# themselves do: two workers each with two threads would oversubscribe the cores. A variable the
# caller set wins. The worker itself is set here too, not only in each test (``one_thread``):
# torch read the cores before this file set the variable, and a module- or session-scoped
# fixture runs before any test's ``one_thread`` (the CPU replication's trials took 120 s in a
# worker with two threads, 22 s alone).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Nothing in the tests may need the internet: the Hugging Face libraries read their local files
# and caches only (as .ci/run sets them), here and in every process a test starts; without it
# a tokenizer or dataset loaded by path waits on the Hub's timeouts where no network is.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")


# Each test process, and every process it starts, keeps its caches in a directory of its own,
# removed at its exit: flatlm's record of a sweep's state digests (sweeps/trust.py) is keyed by
# the sweep's path, and pytest's temporary paths come back when /tmp is cleared but the home
# directory is not, so a record left by an earlier run refused a later run's resume (CI, at
# tests/sweeps/test_resume_trust.py: "was not written by flatlm's driver here").
_CACHE = tempfile.mkdtemp(prefix="flatlm-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


_WORKER_OPTIONS = ("-n", "--numprocesses", "--maxprocesses", "--dist", "-d", "--tx")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A run naming test files or tests (no folder), or with ``--pdb``, runs in one process
    unless the command line asks for workers (``-n``): starting two workers, each importing
    torch, costs more than the few tests gain. The whole suite keeps pyproject's two workers."""
    if not hasattr(config.option, "numprocesses"):  # pytest-xdist not installed or disabled
        return
    asked = [a for a in config.invocation_params.args
             if isinstance(a, str) and a.startswith(_WORKER_OPTIONS)]
    if asked:
        return
    named = config.args_source == pytest.Config.ArgsSource.ARGS and not any(
        (config.invocation_params.dir / arg.split("::")[0]).is_dir() for arg in config.args)
    if named or config.getoption("usepdb", False):
        config.option.numprocesses = 0
        config.option.dist = "no"


def pytest_collection_modifyitems(config, items):
    """On xdist workers, the modules holding slow tests first (each module's tests in order):
    the workers take modules in this order (``--dist loadscope``), and the long ones started
    first end before the short ones run out, instead of one worker finishing alone."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_modules)  # stable


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and OpenMP threads competing with other
    processes on a 2-core machine make them up to 50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The assets are modules tests import (a toy source, measurement, ...), not tests: collecting
# them for doctests would import them, and so register them, before a test asks to.
collect_ignore = ["assets"]
