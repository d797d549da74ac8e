"""Every trial config the layers build is the committed snapshot's (``trial_configs.py``): a
change to the layers (scales, protocols, source kinds, experiments) that moves no value passes;
one that changes any trial's config (and so a committed result's rerun) fails, naming it."""

import json

import pytest

from tests.experiments.trial_configs import (
    PLAIN_SOURCES,
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


def only(snapshot: dict, labels) -> dict:
    """The snapshot's entries of the sources ``labels``."""
    return {scale: {protocol: {label: by_source[label] for label in labels}
                    for protocol, by_source in protocols.items()}
            for scale, protocols in snapshot.items() if scale != "testbed searches"}


@pytest.fixture(scope="module")
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())


def test_the_snapshot_covers_every_scale_protocol_source_and_experiment(snapshot):
    assert count(snapshot) > 20_000
    assert set(snapshot) == {"sweep", "tiny", "gpu", "testbed", "testbed searches"}
    assert set(snapshot["tiny"]["paper"]) == {*PLAIN_SOURCES, "text", "text-glue", "lm",
                                              "lm-glue"}


def test_every_trial_config_on_a_plain_source_is_the_snapshot_s(snapshot):
    got = trial_configs(PLAIN_SOURCES, "/no/tmp")
    wrong = differences(only(snapshot, PLAIN_SOURCES), got)
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])


def test_every_trial_config_on_text_and_lm_sources_is_the_snapshot_s(snapshot, tmp_path):
    sources = file_sources(tmp_path)
    got = trial_configs(sources, str(tmp_path))
    wrong = differences(only(snapshot, sources), got)
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])


def test_every_trial_config_of_the_testbed_searches_is_the_snapshot_s(snapshot):
    wrong = differences(snapshot["testbed searches"], search_trial_configs())
    assert not wrong, f"{len(wrong)} trial configs changed:\n" + "\n".join(wrong[:30])
