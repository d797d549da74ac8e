"""cluster.yaml (AWS) and cluster-local.yaml (on-premises): Ray's own validation plus ours.

Ray's checks are private APIs (``prepare_config`` merges the provider defaults, ``validate_config``
runs the JSON schema and cross-field checks); they do not look inside ``provider`` or
``node_config``, so the project's own rules are checked here too. Nothing is launched.
"""

import copy
import re
from importlib.metadata import version

import pytest

from tests.cluster_files import FILES, REPO, load  # before Ray: skips without it, sets its env

# isort: split
from ray.autoscaler._private.util import prepare_config, validate_config


def commands(cfg: dict, *fields: str) -> list[str]:
    return [c for f in fields for c in cfg.get(f) or []]


@pytest.mark.parametrize("name", FILES)
def test_ray_validates_the_config(name):
    validate_config(prepare_config(load(name)))


def test_ray_validation_is_live():
    bad = load("cluster.yaml")
    bad["max_worker"] = bad.pop("max_workers")  # misspelled top-level key
    with pytest.raises(Exception, match="max_worker"):
        validate_config(prepare_config(bad))
    bad = copy.deepcopy(load("cluster.yaml"))
    bad["head_node_type"] = "nope"
    with pytest.raises(Exception):  # noqa: B017 - Ray raises a ValueError or a schema error
        validate_config(prepare_config(bad))


def test_head_runs_no_trials():
    cfg = load("cluster.yaml")
    assert cfg["available_node_types"][cfg["head_node_type"]]["resources"] == {"CPU": 0}
    workers = [t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]]
    assert all(t["resources"].get("GPU", 0) >= 1 and t["min_workers"] == 0 for t in workers)
    assert all(t["max_workers"] > 0 for t in workers)  # an autoscaling GPU worker type
    local = load("cluster-local.yaml")
    (start,) = [c for c in local["head_start_ray_commands"] if "ray start --head" in c]
    assert "--num-cpus=0" in start and "--num-gpus=0" in start


@pytest.mark.parametrize("name", FILES)
def test_versions_pinned_to_the_installed_ones(name):
    setup = " ".join(commands(load(name), "setup_commands"))
    assert re.findall(r'"ray\[[a-z,]+\]==([^"]+)"', setup) == [version("ray")]
    assert re.findall(r'"mlflow==([^"]+)"', setup) == [version("mlflow")]
    assert re.search(r'-e "\$HOME/flatlm\[sweep\]"', setup)


@pytest.mark.parametrize("name", FILES)
def test_python_and_ray_on_the_login_path(name):
    """`ray submit` / `ray down` run `python` and `ray` in an SSH login shell."""
    setup = commands(load(name), "setup_commands")
    venv = re.search(r"--python (\S+)/bin/python", " ".join(setup)).group(1)  # installed into
    assert venv == "~/venv"
    login_files = ("/etc/profile.d/", "~/.profile", "~/.bash_profile")
    writes = [c for c in setup if 'export PATH="$HOME/venv/bin' in c]
    assert any(f in c for c in writes for f in login_files), "venv not on the login PATH"


@pytest.mark.parametrize("name", FILES)
def test_mlflow_server_on_head_loopback_and_tunnels_from_workers(name):
    cfg = load(name)
    (server,) = [c for c in cfg["head_start_ray_commands"] if "mlflow server" in c]
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in server
    assert "--host 127.0.0.1 --port 5000 --workers 1" in server
    assert re.search(r"--backend-store-uri sqlite:///(/|\$HOME/)", server)  # absolute path
    assert "--artifacts-destination" in server and "--default-artifact-root" not in server
    assert "setsid" in server
    ray_start = [i for i, c in enumerate(cfg["head_start_ray_commands"]) if "ray start" in c]
    server_at = cfg["head_start_ray_commands"].index(server)
    assert server_at < ray_start[0]  # MLflow is up before any trial can start

    (tunnel,) = [c for c in cfg["worker_start_ray_commands"] if "ssh -N" in c]
    assert "-L 127.0.0.1:5000:127.0.0.1:5000" in tunnel and "$RAY_HEAD_IP" in tunnel
    key = re.search(r"-i (\S+)", tunnel).group(1)
    remote = {k.replace("/home/ubuntu/", "~/") for k in cfg["file_mounts"]}
    synced = {f.replace("/home/ubuntu/", "~/") for f in cfg["cluster_synced_files"]}
    if name == "cluster.yaml":  # issue 27: a tunnel-only key from the head, not the cluster's
        assert key in synced and key not in remote  # (tests/test_cluster_security.py)
        return
    assert key in remote  # the key the tunnel uses is mounted on the workers
    source = cfg["file_mounts"][next(k for k in cfg["file_mounts"] if k.endswith(key[2:]))]
    assert source == cfg["auth"]["ssh_private_key"]


@pytest.mark.parametrize("name", FILES)
def test_ray_is_authenticated_its_dashboard_local_and_host_keys_checked(name):
    """No unauthenticated job API on a reachable address, no unchecked host key."""
    cfg = load(name)
    text = (REPO / name).read_text()
    assert "RAY_AUTH_MODE=disabled" not in text and "0.0.0.0" not in text
    profiles = [c for c in cfg["setup_commands"] if "export PATH=" in c]
    assert profiles and all("export RAY_AUTH_MODE=token" in c for c in profiles)
    token = {r: loc for r, loc in cfg["file_mounts"].items() if r.endswith(".ray/auth_token")}
    assert list(token.values()) == ["~/.ray/auth_token"]  # every node gets the cluster's token
    (start,) = [c for c in cfg["head_start_ray_commands"] if "ray start --head" in c]
    assert "--dashboard-host=127.0.0.1" in start
    (tunnel,) = [c for c in cfg["worker_start_ray_commands"] if "ssh -N" in c]
    assert "StrictHostKeyChecking=yes" in tunnel and "KnownHostsFile=/dev/null" not in tunnel
    known = re.search(r"UserKnownHostsFile=(\S+)", tunnel).group(1).replace("$HOME", "~")
    synced = [f.replace("/home/ubuntu", "~") for f in cfg["cluster_synced_files"]]
    assert known in synced  # the head's key, published by the head, is what the tunnel trusts
    published = " ".join(cfg["head_setup_commands"])
    assert "ssh-keyscan" in published and known.replace("~", "") in published


@pytest.mark.parametrize("name", FILES)
def test_every_field_is_commented(name):
    """Each key line has a comment on it or on the line above (nanoGPT / Ray example style)."""
    lines = (REPO / name).read_text().splitlines()
    key = re.compile(r"^\s*(- )?[\"\w./~-]+\s*:(\s|$)")
    missing = []
    for i, line in enumerate(lines):
        if not key.match(line) or line.lstrip().startswith("#"):
            continue
        above = next((p.strip() for p in reversed(lines[:i]) if p.strip()), "")
        if "#" not in line and not above.startswith("#"):
            missing.append(f"{i + 1}: {line.strip()}")
    assert not missing, "uncommented fields:\n" + "\n".join(missing)


COMMAND_FIELDS = ("initialization_commands", "setup_commands", "head_setup_commands",
                  "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")


@pytest.mark.parametrize("name", FILES)
def test_every_command_is_well_formed_shell(name):
    """A plain YAML scalar ends at " #": a cut command has an unclosed quote (ray up fails)."""
    import shlex

    cfg = load(name)
    for command in commands(cfg, *COMMAND_FIELDS):
        shlex.split(command, comments=True)  # raises on an unclosed quote


@pytest.mark.parametrize("name", FILES)
def test_submitted_scripts_find_the_sweep_modules(name):
    """`ray submit` runs the uploaded script from ~/, so sweeps/ must be on PYTHONPATH."""
    text = " ".join(commands(load(name), "setup_commands"))
    assert "PYTHONPATH=" in text and "flatlm/sweeps" in text
