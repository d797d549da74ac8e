"""Settings that make a replication trial take a second or two (tiny runs, tiny measurements)."""

FAST = {
    "train.steps": 6, "train.checkpoint_steps": [0, 3, 6], "train.batch_size": 16,
    "train.log_every": 3,
    "train.adversarial.pool": 64, "train.adversarial.d1": 16, "train.adversarial.d2": 16,
    "measure.n_eval": 48, "measure.n_downstream": 240, "measure.probe.epochs": 2,
    "measure.probe.seeds": 2, "measure.flatness.n_inputs": 8,
    # 2 sampled labels per input, not the paper protocol's 50 (B.1): the estimator is the same,
    # its variance does not matter here, and 50 made Tr(F) a third of a tiny trial's time
    "measure.flatness.labels_per_input": 2, "measure.flatness.hutchinson_batch_size": 8,
}
FAST_MODELS = ("d16-h1-l1-i64", "d32-h2-l1-i128")


def fast_set_flags() -> list[str]:
    """FAST as ``--set`` arguments."""
    import json
    flags = []
    for key, value in FAST.items():
        flags += ["--set", f"{key}={json.dumps(value)}"]
    return flags
