"""cluster.yaml's exposure (issue 27, case 11; read, not launched): SSH only from the user's
address through a security group the user makes (Ray's own default group opens port 22 to every
address), the cluster's private key kept off the workers (they get a tunnel-only key the head
restricts to MLflow's port), and uv installed from PyPI at a pinned version, not a script piped
into sh."""

import os
import re
import shlex
from pathlib import Path

import pytest

from tests.cluster_files import FILES, REPO, load


def commands(cfg: dict) -> list[str]:
    fields = ("initialization_commands", "setup_commands", "head_setup_commands",
              "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
    return [c for f in fields for c in cfg.get(f) or []]


def test_every_node_uses_the_users_security_group_so_ray_opens_no_port_to_all():
    """Ray's AWS provider creates a group with SSH from 0.0.0.0/0 for every node type lacking
    SecurityGroupIds; with them on every node type it configures none (read in Ray's own source:
    importing it needs boto3)."""
    import ray

    cfg = load("cluster.yaml")
    groups = [t["node_config"].get("SecurityGroupIds") for t in
              cfg["available_node_types"].values()]
    assert all(groups) and all(g == groups[0] for g in groups), groups
    ray_aws = Path(ray.__file__).parent / "autoscaler" / "_private" / "aws" / "config.py"
    source = ray_aws.read_text()
    assert 'if "SecurityGroupIds" not in node_type["node_config"]' in source
    assert "return config  # have user-defined groups" in source
    text = (REPO / "cluster.yaml").read_text()
    header = text.split("\ncluster_name:")[0]
    # the documented field: how to make the group, with SSH from the user's /32 only
    assert "authorize-security-group-ingress" in header and "--port 22" in header
    assert '/32"' in header and "checkip" in header
    assert "0.0.0.0" not in text


def test_the_cluster_key_is_not_copied_to_workers():
    cfg = load("cluster.yaml")
    key = os.path.expanduser(cfg["auth"]["ssh_private_key"])
    mounted = [os.path.expanduser(v) for v in cfg["file_mounts"].values()]
    assert key not in mounted  # file_mounts go to every node; Ray itself copies it to the head
    synced = " ".join(cfg["cluster_synced_files"])
    assert "flatlm-cluster" not in synced and "flatlm-cluster.pem" not in " ".join(commands(cfg))
    (tunnel,) = [c for c in cfg["worker_start_ray_commands"] if "ssh -N" in c]
    tunnel_key = re.search(r"-i (\S+)", tunnel).group(1).replace("~", "/home/ubuntu")
    assert tunnel_key in cfg["cluster_synced_files"]  # made on the head, synced to workers
    head = " ".join(cfg["head_setup_commands"])
    home_key = tunnel_key.replace("/home/ubuntu", "~")
    assert f"ssh-keygen -q -t ed25519 -N '' -C flatlm-tunnel -f {home_key}" in head
    # the head accepts that key only to forward to MLflow's loopback port
    (grant,) = [c for c in cfg["head_setup_commands"] if "authorized_keys" in c]
    options = re.search(r'echo "([^ ]+) \$\(cat', grant).group(1)
    assert options.split(",")[0] == "restrict"  # no pty, agent, X11 or forwarding ...
    assert 'permitopen=\\"127.0.0.1:5000\\"' in options  # ... but this one port
    assert 'command=\\"/bin/false\\"' in options  # and no shell
    assert "chmod 600 ~/.ssh/flatlm_tunnel" in cfg["worker_setup_commands"]


@pytest.mark.parametrize("name", FILES)
def test_uv_comes_from_pypi_at_a_pinned_version_never_a_piped_script(name):
    cfg = load(name)
    text = " ".join(commands(cfg))
    assert not re.search(r"curl[^|;&]*\|\s*(ba)?sh", text), "a downloaded script piped to sh"
    (install,) = [c for c in cfg["setup_commands"] if "~/.local/bin/uv ||" in c]
    assert re.search(r'python3 -m pip install --user --no-cache-dir "uv==\d+\.\d+\.\d+"',
                     install)
    shlex.split(install, comments=True)  # well-formed shell
