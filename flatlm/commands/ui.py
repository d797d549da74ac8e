"""``flatlm ui``: MLflow's UI on a sweep's runs, opened at its runs table, not the GenAI page.

    flatlm ui                                      # the sweeps' store in this directory
    flatlm ui --workdir runs/ --experiment scaling
    flatlm ui --port 5001 --no-browser             # print the address, open nothing

Starts ``mlflow ui`` on 127.0.0.1 with the store the sweeps write (``WORKDIR/mlflow.db``), waits
until it answers, prints the address of the experiment's runs table in the model-training view
with flatlm's saved view (its columns and charts; ``flatlm.tracking.ui``), opens it in a browser,
and serves until Ctrl-C. A first visit to MLflow's own address lands on an empty GenAI overview
(MLflow 3.17's default view): this address does not. The experiment is ``--experiment``, else the
one with runs most recently updated (not a report's). No MLflow import: the UI is a child process
and the experiment is read through its REST API.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path

from flatlm.commands import add_command
from flatlm.core.flags import number_flag
from flatlm.tracking.tracker import default_tracking_uri
from flatlm.tracking.ui import experiment_url

HOST = "127.0.0.1"  # never another interface: the UI has no authentication
DEFAULT_PORT = 5000
START_TIMEOUT_S = 120.0  # a cold start migrates the sqlite schema first
REPORT_SUFFIX = ".report"  # analysis/report.py logs its files to "<experiment>.report"


def register(subparsers) -> None:
    p = add_command(subparsers, "ui", __doc__)
    p.add_argument("--workdir", type=Path, default=Path("."),
                   help="the directory a sweep ran in (its mlflow.db; default: here)")
    p.add_argument("--experiment", help="the experiment (sweep) name (default: the one with "
                                        "runs most recently updated)")
    p.add_argument("--port", type=number_flag(int, at_least=1, at_most=65535), default=None,
                   help=f"the UI's port on {HOST} (default: {DEFAULT_PORT}, or a free one if it "
                        "is taken)")
    p.add_argument("--no-browser", action="store_true", help="print the address only")
    p.set_defaults(run=run)


def run(args) -> int:
    store = args.workdir.absolute() / "mlflow.db"
    if not store.is_file():
        raise ValueError(f"--workdir {args.workdir}: no mlflow.db there; give the directory a "
                         "sweep ran in (python sweeps/scaling.py --workdir DIR)")
    # Ctrl-C and a plain kill both stop the server, even where the parent left SIGINT ignored
    # (a child inherits an ignored signal: pytest-xdist's workers, nohup)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    port = args.port if args.port is not None else _port_or_free(DEFAULT_PORT)
    ui = f"http://{HOST}:{port}"
    # one worker, not mlflow's 4: one person's browser on a local store (each worker imports
    # mlflow's server, about 2 CPU-s, and holds its memory)
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri",
               default_tracking_uri(args.workdir), "--host", HOST, "--port", str(port),
               "--workers", "1"]
    # its log to a file, not a pipe no one drains; its own process group, stopped as a whole
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        try:
            print(f"starting mlflow ui on {ui} for {store} ...", flush=True)
            _wait_until_up(server, ui, log)
            experiment_id, name = choose_experiment(_experiments(ui), args.experiment)
            address = experiment_url(ui, experiment_id)
            print(f"{name}: {address}\n(Ctrl-C stops the UI)", flush=True)
            if not args.no_browser:
                webbrowser.open(address)
            server.wait()
            return 0
        except KeyboardInterrupt:
            return 0
        finally:
            _stop(server)


def choose_experiment(experiments: list[dict], name: str | None) -> tuple[str, str]:
    """(id, name) of ``name``, else of the experiment most recently updated that is neither
    MLflow's ``Default`` nor a report's; a clear error when there is none.

    >>> choose_experiment([{"experiment_id": "1", "name": "scaling", "last_update_time": 5},
    ...     {"experiment_id": "2", "name": "scaling.report", "last_update_time": 9}], None)
    ('1', 'scaling')
    """
    names = [e["name"] for e in experiments]
    if name is not None:
        match = [e for e in experiments if e["name"] == name]
        if not match:
            raise ValueError(f"--experiment {name!r}: the store has {', '.join(names) or 'none'}")
        return match[0]["experiment_id"], name
    sweeps = [e for e in experiments
              if e["name"] != "Default" and not e["name"].endswith(REPORT_SUFFIX)]
    if not sweeps:
        raise ValueError("the store has no sweep's experiment yet; run a sweep first "
                         "(python sweeps/scaling.py)")
    latest = max(sweeps, key=lambda e: int(e.get("last_update_time") or 0))
    return latest["experiment_id"], latest["name"]


def _experiments(ui: str) -> list[dict]:
    """The store's experiments, through the UI server's REST API."""
    query = json.dumps({"max_results": 1000}).encode()
    request = urllib.request.Request(f"{ui}/api/2.0/mlflow/experiments/search", data=query,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read()).get("experiments", [])


def _wait_until_up(server: subprocess.Popen, ui: str, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            tail = log.read().strip().splitlines()[-5:]
            raise OSError(f"mlflow ui exited ({server.returncode}): " + " / ".join(tail))
        try:
            with urllib.request.urlopen(f"{ui}/health", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise OSError(f"mlflow ui did not answer on {ui} within {START_TIMEOUT_S:.0f} s")


def _port_or_free(port: int) -> int:
    """``port`` when nothing listens on it, else one the system says is free."""
    with socket.socket() as probe:
        if probe.connect_ex((HOST, port)) != 0:
            return port
    with socket.socket() as free:
        free.bind((HOST, 0))
        return free.getsockname()[1]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop(server: subprocess.Popen) -> None:
    """The server and its workers (one process group), SIGTERM then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
