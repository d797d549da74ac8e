"""Ray, imported once, after the environment it reads at import: every sweep module that needs
Ray takes it from here (``from _rayenv import ray, tune``).

Loopback only, no token-auth prompt, no usage stats, no chdir into trial directories, quiet
output without colour codes. On a cluster the nodes' profiles set ``RAY_AUTH_MODE=token``
(cluster.yaml), which wins. ``setdefault``: a variable the caller already set wins.
"""

import os

RAY_ENVIRONMENT = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled", "RAY_AIR_NEW_OUTPUT": "0", "RAY_CHDIR_TO_TRIAL_DIR": "0",
    "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS": "0", "RAY_DEDUP_LOGS": "0",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "HF_HUB_OFFLINE": "1",
    "RAY_COLOR_PREFIX": "0",  # worker lines without ANSI colour codes (logs are files)
}
for _key, _value in RAY_ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)

import atexit  # noqa: E402

import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray.autoscaler._private.cli_logger import colorama  # noqa: E402

# ray.init imports cli_logger, whose colorama.init(strip=False) registers an exit handler that
# writes ESC[0m to a terminal after the last line the sweep printed: unregistered (imported
# here, before ray.init, so that the handler exists to be removed).
atexit.unregister(colorama.initialise.reset_all)

__all__ = ["RAY_ENVIRONMENT", "ray", "tune"]
