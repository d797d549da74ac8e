"""Every trial config the layers build is the committed snapshot's (``trial_configs.py``): a
change to the layers (scales, protocols, source kinds, experiments) that moves no value passes;
one that changes any trial's config (and so a committed result's rerun) fails, naming it."""

import json
import os

import pytest

from flatlm.experiments.protocols import BASES
from tests.experiments.trial_configs import (
    PLAIN_SOURCES,
    SCALE_NAMES,
    SNAPSHOT,
    count,
    file_sources,
    search_trial_configs,
    trial_configs,
)


def differences(expected: dict, got: dict, path: str = "") -> list[str]:
    """Each path where the two nested snapshots differ, with both sides."""
    out = []
    for key in sorted(set(expected) | set(got)):
        a, b = expected.get(key), got.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{path}/{key}")
        elif a != b:
            out.append(f"{path}/{key}: snapshot {a!r}, now {b!r}")
    return out


# The whole enumeration builds 27,380 trials (about 7 CPU-minutes, most of it the text and LM
# sources): the suite checks every scale under each base protocol, every protocol (each switch)
# on the default scale, and the file sources on one scale under the bases;
# FLATLM_ALL_TRIAL_CONFIGS=1 checks them all, as a change to the layers should before it lands.
ALL = os.environ.get("FLATLM_ALL_TRIAL_CONFIGS") == "1"
PROTOCOLS = None if ALL else list(BASES)
FILE_SCALES = SCALE_NAMES if ALL else ("tiny",)


def only(snapshot: dict, labels, scales=SCALE_NAMES, protocol_names=None) -> dict:
    """The snapshot's entries of the sources ``labels`` (of ``scales`` and ``protocol_names``:
    default all)."""
    return {scale: {protocol: {label: by_source[label] for label in labels}
                    for protocol, by_source in protocols.items()
                    if protocol_names is None or protocol in protocol_names}
            for scale, protocols in snapshot.items()
            if scale != "testbed searches" and scale in scales}


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


def test_the_snapshot_covers_every_scale_protocol_source_and_experiment(snapshot):
    assert count(snapshot) > 20_000
    assert set(snapshot) == {*SCALE_NAMES, "testbed searches"}
    assert set(snapshot["tiny"]["paper"]) == {*PLAIN_SOURCES, "text", "text-glue", "lm",
                                              "lm-glue"}


def test_every_trial_config_on_a_plain_source_is_the_snapshot_s(snapshot):
    got = trial_configs(PLAIN_SOURCES, "/no/tmp", protocol_names=PROTOCOLS)
    wrong = differences(only(snapshot, PLAIN_SOURCES, protocol_names=PROTOCOLS), got)
    if not ALL:  # every protocol (each switch) on the default scale
        got = trial_configs(PLAIN_SOURCES, "/no/tmp", scales=("sweep",))
        wrong += differences(only(snapshot, PLAIN_SOURCES, ("sweep",)), got)
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])


def test_every_trial_config_on_text_and_lm_sources_is_the_snapshot_s(snapshot, tmp_path):
    sources = file_sources(tmp_path)
    got = trial_configs(sources, str(tmp_path), scales=FILE_SCALES, protocol_names=PROTOCOLS)
    wrong = differences(only(snapshot, sources, FILE_SCALES, PROTOCOLS), got)
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])


def test_every_trial_config_of_the_testbed_searches_is_the_snapshot_s(snapshot):
    wrong = differences(snapshot["testbed searches"], search_trial_configs())
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])
