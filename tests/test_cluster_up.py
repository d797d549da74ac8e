"""cluster-local.yaml brought up for real on this machine: `ray up`, a tiny sweep through
`ray submit`, `ray down`, and nothing left running.

The "cluster" is this machine reached over SSH, as the launcher reaches any on-premises head: a
private sshd (Debian's openssh-server, installed with apt-get when missing) with its own host
key, config and authorized key, logging in as root. It runs in its own PID, mount and network
namespaces (``unshare``), so that

* `ray stop`, which `ray up` and `ray down` run on the head and which kills every Ray process it
  can see, sees only this cluster's processes, never the other Ray instances on this machine;
* Ray, the dashboard and MLflow keep the ports the file uses (6379, 8265, 5000) without clashing
  with anything else on the machine;
* the check "nothing left running" is exact: the namespace's processes are this cluster's;
* killing the namespace's first process (sshd) ends everything the test started there.

The launcher reaches the namespace's sshd (127.0.0.1:22 inside) through ``ssh_proxy_command``:
``nsenter`` into the network namespace and a few lines of Python relaying the bytes.
Inside the namespace, root's home is a temporary directory (a bind-mounted copy of /etc/passwd),
so what the file writes into ``~`` (shell files, ~/flatlm, ~/mlflow, Ray's bootstrap files) never
touches the real one, and sshd sets ``RAY_TMPDIR`` to a temporary directory, so the head's
sessions and address file (ray_current_cluster) are not the machine's /tmp/ray.

What the test copy of cluster-local.yaml changes, and why (everything else is the file as is:
the file mounts, the login-PATH setup, the MLflow server and its shutdown, the start commands):

* ``cluster_name``: a unique name, so the launcher's lock and state files and SSH control
  sockets are this test's own.
* ``provider``: ``head_ip: 127.0.0.1``, ``worker_ips: []``: this machine is the only node.
* ``auth``: ``ssh_user: root``, the test's fresh key, and ``ssh_proxy_command`` (see above).
* ``file_mounts``: the cluster key mounted from the test's key instead of ~/.ssh/flatlm-cluster,
  and the Ray token from a fresh one instead of ~/.ray/auth_token.
* ``rsync_exclude``: also ``.venv*`` (CI's environment is .venv-ci: gigabytes, not code).
* ``setup_commands``: the three commands that install uv, create ~/venv and pip-install the
  project (minutes, and network access) become one: ``~/venv`` is a symlink to the environment
  running this test, which already has the project and the pinned Ray / MLflow / Optuna.
* ``head_start_ray_commands``: ``--num-cpus=2`` instead of ``--num-cpus=0``: with no GPU
  workers the head must run the trials itself (two at a time).

The sweep is ``sweeps/scaling.py`` (3 tiny CPU trials) submitted with ``--address auto`` and the
head's MLflow server as tracking URI; afterwards the server's store must hold 3 FINISHED runs.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import secrets
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"
RAY = str(Path(sys.executable).parent / "ray")  # the CLI of the environment running the tests
SWEEP_ARGS = ["--set", "train.steps=10", "--set", "train.checkpoint_steps=[10]",
              "--set", "measure.n_eval=32", "--set", "measure.n_downstream=40",
              "--set", "measure.probe.epochs=2", "--kl-threshold", "100"]  # every checkpoint
TABLE_HEADER = "Per run, final checkpoint"  # the closing table (sweeps/summary.py)

RELAY = """\
import os, socket, threading
s = socket.create_connection(("127.0.0.1", 22))
def up():
    try:
        while data := os.read(0, 65536):
            s.sendall(data)
    finally:
        s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"""


# ------------------------------------------------------------------------------ machine setup


def _apt_install(packages: list[str]) -> None:
    """apt-get install, without starting the services it installs (sshd on port 22)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"needs {' '.join(packages)}: install them (apt-get install "
                    f"{' '.join(packages)}) or run the tests as root on Debian/Ubuntu")
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:  # Docker images ship one; elsewhere: no service start during the install
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}{r.stderr}"
    finally:
        if own_policy:
            policy.unlink()


def _ensure_tools() -> None:
    needed = {SSHD: "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
              "rsync": "rsync", "curl": "curl", "ip": "iproute2"}
    missing = sorted({pkg for tool, pkg in needed.items() if not shutil.which(tool)})
    if missing:
        _apt_install(missing)
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (util-linux)")
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--net", "true"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("needs PID, mount and network namespaces (root with CAP_SYS_ADMIN) to keep "
                    f"the cluster apart from this machine's other Ray processes: {r.stderr}")


def _namespace_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _processes() -> list[tuple[int, str, str]]:
    """(pid, name, command line) of every process on the machine (/proc; no psutil)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                name = (d / "comm").read_text().strip()
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:  # gone meanwhile
                continue
            out.append((int(d.name), name, cmdline or name))
    return out


class Head:
    """The head "machine": sshd as the first process of fresh PID, mount and network namespaces."""

    def __init__(self, base: Path):
        self.base = base
        self.cluster_name = f"flatlm-test-{uuid.uuid4().hex[:8]}"
        ssh = base / "ssh"
        ssh.mkdir()
        self.home = base / "home"
        self.home.mkdir(mode=0o700)
        (base / "tmp").mkdir()  # the head's RAY_TMPDIR
        self.key = ssh / "cluster_key"
        for key in (ssh / "host_key", self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "flatlm-test",
                            "-f", str(key)], check=True)
        (ssh / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        passwd = [f"root:x:0:0:root:{self.home}:/bin/bash" if line.startswith("root:") else line
                  for line in Path("/etc/passwd").read_text().splitlines()]
        (base / "passwd").write_text("\n".join(passwd) + "\n")
        config = ssh / "sshd_config"
        config.write_text(f"""\
ListenAddress 127.0.0.1
Port 22
HostKey {ssh / 'host_key'}
PidFile {ssh / 'sshd.pid'}
AuthorizedKeysFile {ssh / 'authorized_keys'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxSessions 100
MaxStartups 100
SetEnv RAY_TMPDIR={base / 'tmp'}
""")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        subprocess.run([SSHD, "-t", "-f", str(config)], check=True)
        self.log = ssh / "sshd.log"
        inside = (f"ip link set lo up && mount --bind {base / 'passwd'} /etc/passwd && "
                  f"exec {SSHD} -D -e -f {config}")
        with open(self.log, "w") as log:
            self.unshare = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--kill-child", "--",
                 "/bin/sh", "-c", inside], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self._wait_listening()
        self.namespace = _namespace_of(self.pid)
        (ssh / "relay.py").write_text(RELAY)
        self.proxy = ssh / "proxy"  # one word: Ray passes it through rsync's --rsh as well
        self.proxy.write_text(f"#!/bin/sh\nexec nsenter --net=/proc/{self.pid}/ns/net "
                              f"{sys.executable} -I {ssh / 'relay.py'}\n")
        self.proxy.chmod(0o755)

    def _wait_listening(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.unshare.poll() is not None:
                break
            if "Server listening" in self.log.read_text():
                children = Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children")
                (child,) = children.read_text().split()
                return int(child)
            time.sleep(0.1)
        raise AssertionError(f"sshd did not start:\n{self.log.read_text()}")

    def ssh(self, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-o", f"ProxyCommand={self.proxy}", "-o",
             "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
             "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
            capture_output=True, text=True, timeout=60)

    def left_running(self) -> list[str]:
        """What runs on the head besides sshd and the sessions of its clients."""
        return [f"{pid} {cmdline}" for pid, name, cmdline in _processes()
                if name != "sshd" and _namespace_of(pid) == self.namespace]

    def stop(self) -> None:
        """SIGKILL to the namespace's first process: the kernel kills all the others."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            self.unshare.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.unshare.kill()
            self.unshare.wait(timeout=30)


def _local_leftovers(base: Path) -> list[int]:
    """Processes outside the namespace that carry the test's paths (ssh masters, proxies)."""
    return [pid for pid, _, cmdline in _processes() if str(base) in cmdline and pid != os.getpid()]


# ------------------------------------------------------------------------------- the config


def make_config(head: Head) -> dict:
    """cluster-local.yaml with the changes listed in the module docstring, and nothing else."""
    cfg = yaml.safe_load((REPO / "cluster-local.yaml").read_text())
    cfg["cluster_name"] = head.cluster_name
    cfg["provider"].update(head_ip="127.0.0.1", worker_ips=[])
    cfg["auth"].update(ssh_user="root", ssh_private_key=str(head.key),
                       ssh_proxy_command=str(head.proxy))
    mounts = cfg["file_mounts"]
    (key_mount,) = [remote for remote, local in mounts.items() if "flatlm-cluster" in local]
    mounts[key_mount] = str(head.key)
    (token_mount,) = [remote for remote, local in mounts.items() if "auth_token" in local]
    token = head.base / "auth_token"  # the cluster's Ray token, made here as a user would
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    mounts[token_mount] = str(token)
    cfg["rsync_exclude"] = [*cfg["rsync_exclude"], ".venv*"]
    installs = [c for c in cfg["setup_commands"] if "uv" in c.split("#")[0]]
    assert len(installs) == 3, installs  # uv itself, the venv, the pip install
    first = cfg["setup_commands"].index(installs[0])
    setup = [c for c in cfg["setup_commands"] if c not in installs]
    setup.insert(first, f"ln -sfn {shlex.quote(sys.prefix)} ~/venv")
    cfg["setup_commands"] = setup
    start = cfg["head_start_ray_commands"]
    (i,) = [i for i, c in enumerate(start) if "ray start --head" in c]
    assert "--num-cpus=0" in start[i]
    start[i] = start[i].replace("--num-cpus=0", "--num-cpus=2")
    return cfg


# ------------------------------------------------------------------------------------ test


@pytest.fixture
def head():
    _ensure_tools()
    base = Path(tempfile.mkdtemp(prefix="flatlm-up-"))  # short: Ray's socket paths live under it
    h = None
    try:
        h = Head(base)
        r = h.ssh("echo $HOME $RAY_TMPDIR")
        assert r.returncode == 0 and r.stdout.split() == [str(h.home), str(base / "tmp")], r
        yield h
    finally:
        if h is not None:
            h.stop()
        for pid in _local_leftovers(base):  # ssh control masters and proxies of this test
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
        if h is not None:  # the launcher's SSH control directory for this cluster name
            shutil.rmtree(_ssh_control_dir(h.cluster_name), ignore_errors=True)


def _ssh_control_dir(cluster_name: str) -> Path:
    """Where Ray's SSHCommandRunner keeps its ControlMaster sockets for a cluster."""
    user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
    return Path(f"/tmp/ray_ssh_{user}") / hashlib.sha256(cluster_name.encode()).hexdigest()[:10]


def _ray(*args: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    r = subprocess.run([RAY, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    print(f"ray {args[0]}: exit {r.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    return r


def _wait_for(condition, timeout: float, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if not value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_up_submit_down_on_this_machine(head: Head):
    config = head.base / "cluster.yaml"
    config.write_text(yaml.safe_dump(make_config(head), sort_keys=False))
    local_tmp = head.base / "local"  # the launcher's own Ray temp dir (lock and state files)
    local_tmp.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(local_tmp), "RAY_USAGE_STATS_ENABLED": "0"}
    workdir = head.base / "sweep"
    try:
        up = _ray("up", "-y", "--no-config-cache", str(config), env=env, timeout=300)
        assert up.returncode == 0, f"ray up failed:\n{up.stdout[-6000:]}\n{up.stderr[-6000:]}"
        running = " ".join(head.left_running())
        assert "raylet" in running and "mlflow" in running, running

        args = ["--address", "auto", "--workdir", str(workdir),
                "--tracking-uri", "http://127.0.0.1:5000", *SWEEP_ARGS]
        sub = _ray("submit", str(config), "sweeps/scaling.py", "--",
                   *(shlex.quote(a) for a in args), env=env, timeout=420)  # a remote shell
        out = sub.stdout + sub.stderr
        assert sub.returncode == 0, f"ray submit failed:\n{out[-8000:]}"
        assert TABLE_HEADER in out and "| majority class " in out, out[-8000:]
    finally:
        down = _ray("down", "-y", str(config), env=env, timeout=180)
    assert down.returncode == 0, f"ray down failed:\n{down.stdout[-4000:]}\n{down.stderr}"
    # MLflow ends a few seconds after Ray (it polls Ray's address file).
    left = _wait_for(head.left_running, timeout=30)
    assert not left, "still running on the head after `ray down`:\n" + "\n".join(left)

    store = head.home / "mlflow" / "mlflow.db"  # the head's MLflow server store (sqlite)
    with sqlite3.connect(store) as db:
        runs = db.execute(
            "SELECT r.status, r.name FROM runs r JOIN experiments e "
            "ON r.experiment_id = e.experiment_id WHERE e.name = 'scaling' "
            "AND r.lifecycle_stage = 'active'").fetchall()
        probed = db.execute(
            "SELECT COUNT(DISTINCT run_uuid) FROM latest_metrics "
            "WHERE key = 'probe/B/acc_mean'").fetchone()[0]
    assert sorted(status for status, _ in runs) == ["FINISHED"] * 3, runs
    assert probed == 3
