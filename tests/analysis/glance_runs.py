"""Hand-built tidy tables (``analysis.runs.load_runs``'s columns) of the three default sweeps,
small enough to check every number by hand: no Ray, no MLflow."""

import pandas as pd

STEPS = (100, 200, 300)
KL_SE, ACC_SE, TRF_SE = 0.001, 0.006, 0.4

# model, n_params, KL per step, probe A per step, random-init A, grown Tr(F)
SIZES = (("d16-h1-l1-i64", 1e4, (0.20, 0.06, 0.032), (0.90, 0.92, 0.931), 0.893, 40.0),
         ("d32-h2-l1-i128", 3e4, (0.15, 0.04, 0.019), (0.92, 0.94, 0.947), 0.939, 35.0),
         ("d64-h4-l2-i256", 1e5, (0.10, 0.03, 0.009), (0.94, 0.955, 0.963), 0.940, 50.0))


def _references(random_a: float) -> dict:
    return {"random_init/A/acc_mean": random_a, "random_init/A/acc_se": 0.007,
            "random_init/B/acc_mean": random_a - 0.25, "random_init/B/acc_se": 0.008,
            "lookup/A/acc_mean": 0.97, "lookup/A/acc_se": 0.005,
            "lookup/B/acc_mean": 0.80, "lookup/B/acc_se": 0.01,
            "probe/A/majority_acc": 0.5, "probe/B/majority_acc": 0.34}


def scaling_runs() -> pd.DataFrame:
    """3 models x 3 checkpoints, tasks A and B (B = A - 0.2), every reference row."""
    rows = []
    for model, n, kls, accs, random_a, grown in SIZES:
        for step, kl, acc in zip(STEPS, kls, accs, strict=True):
            rows.append({"run_id": model, "trial": f"{model}_seed0", "status": "FINISHED",
                         "model": model, "train.seed": 0, "algorithm": "adamw", "step": step,
                         "n_params": n, "pretrain/kl": kl, "pretrain/kl_se": KL_SE,
                         "pretrain/loss": 2 + kl, "pretrain/entropy": 2.0,
                         "probe/A/acc_mean": acc, "probe/A/acc_se": ACC_SE,
                         "probe/B/acc_mean": acc - 0.2, "probe/B/acc_se": 0.008,
                         **_references(random_a),
                         "flat/trace_fisher": 10 + step / 100, "flat/trace_fisher_se": TRF_SE,
                         "flat/trace_fisher_grown": grown, "flat/trace_fisher_grown_se": 1.5})
    return pd.DataFrame(rows)


# algorithm: KL per step, probe A level, Tr(F)
ALGORITHMS = {"adamw": ((0.05, 0.02, 0.012), 0.93, 12.0), "sam": ((0.05, 0.025, 0.015), 0.94, 10.0),
              "noreg": ((0.04, 0.02, 0.011), 0.92, 14.0),
              "adversarial": ((0.4, 0.35, 0.33), 0.63, 30.0)}


def algorithm_runs() -> pd.DataFrame:
    """4 algorithms of one model; the adversarial run never gets below KL 0.33."""
    rows = []
    for algorithm, (kls, acc, trace) in ALGORITHMS.items():
        for step, kl in zip(STEPS, kls, strict=True):
            rows.append({"run_id": algorithm, "trial": f"{algorithm}_seed0",
                         "status": "FINISHED", "model": "d32-h2-l1-i128",
                         "train.algorithm": algorithm, "algorithm": algorithm, "train.seed": 0,
                         "step": step, "n_params": 3e4, "pretrain/kl": kl,
                         "pretrain/kl_se": KL_SE, "probe/A/acc_mean": acc + 0.01 - kl / 10,
                         "probe/A/acc_se": ACC_SE, "probe/B/acc_mean": acc - 0.2 - kl / 10,
                         "probe/B/acc_se": 0.008, **_references(0.94),
                         "flat/trace_fisher": trace + kl, "flat/trace_fisher_se": TRF_SE})
    return pd.DataFrame(rows)


def steps_runs(n_seeds: int = 3) -> pd.DataFrame:
    """One model, ``n_seeds`` seeds, 5 checkpoints: KL below 0.05 from step 300 on, then
    accuracy rises by 0.01 and Tr(F) falls by 1 per checkpoint."""
    rows = []
    for seed in range(n_seeds):
        for i, step in enumerate((100, 200, 300, 400, 500)):
            plateau = max(0, i - 2)
            rows.append({"run_id": f"s{seed}", "trial": f"seed{seed}", "status": "FINISHED",
                         "model": "d16-h1-l1-i64", "train.seed": seed, "step": step,
                         "n_params": 1e4, "pretrain/kl": (0.3, 0.1, 0.04, 0.035, 0.034)[i],
                         "pretrain/kl_se": KL_SE,
                         "probe/A/acc_mean": 0.90 + 0.01 * plateau + 0.001 * seed,
                         "probe/A/acc_se": ACC_SE, **_references(0.89),
                         "flat/trace_fisher": 20.0 - plateau + 0.1 * seed,
                         "flat/trace_fisher_se": TRF_SE})
    return pd.DataFrame(rows)


def fragmented(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` widened to 120 more metric columns and cast one column at a time, as
    ``load_runs`` builds it (a frame that warns on insertion unless consolidated)."""
    extra = {f"flat/extra_{i}": 1.0 for i in range(120)}
    out = pd.DataFrame.from_records([{**r, **extra} for r in df.to_dict("records")])
    for column in out.columns:
        if column.startswith(("flat/", "pretrain/", "probe/")):
            out[column] = pd.to_numeric(out[column], errors="coerce").astype("float64")
    return out


# The README's main job (`python sweeps/scaling.py`): the testbed's three BERTs, one seed each,
# checkpoints at steps 0, 1000 and 2000, tasks A, B and C; they end at KL 0.045 / 0.040 / 0.034
# (near the sweeps' rule KL < 0.05, not at one loss), the lookup table one measurement repeated.
# model, n_params, KL per step, probe A per step, random-init A
README_SIZES = (("d64-h4-l2-i256", 113_920, (1.95, 0.090, 0.045), (0.66, 0.960, 0.985), 0.65),
                ("d64-h4-l3-i256", 164_096, (1.97, 0.080, 0.040), (0.68, 0.970, 0.990), 0.70),
                ("d64-h4-l4-i256", 214_272, (2.00, 0.070, 0.034), (0.70, 0.975, 0.995), 0.82))
README_STEPS = (0, 1000, 2000)
ENTROPY = 3.71  # nats/token: the testbed grammar's


def readme_runs() -> pd.DataFrame:
    """3 models x 3 checkpoints as ``load_runs`` reads the README's sweep from MLflow (its
    scale and protocol included), tasks A, B, C (B = A - 0.01, C = A - 0.02)."""
    rows = []
    for model, n, kls, accs, random_a in README_SIZES:
        for step, kl, acc in zip(README_STEPS, kls, accs, strict=True):
            tasks = {}
            for task, shift, majority in (("A", 0.0, 0.30), ("B", 0.01, 0.45), ("C", 0.02, 0.43)):
                tasks.update({f"probe/{task}/acc_mean": acc - shift, f"probe/{task}/acc_se": 0.004,
                              f"random_init/{task}/acc_mean": random_a - shift,
                              f"random_init/{task}/acc_se": 0.006,
                              f"lookup/{task}/acc_mean": 0.973 - shift,
                              f"lookup/{task}/acc_se": 0.005,
                              f"probe/{task}/majority_acc": majority})
            rows.append({"run_id": f"id-{model}", "trial": f"{model}_seed0_0a1b2",
                         "status": "FINISHED", "sweep": "scaling", "scale": "sweep",
                         "protocol": "paper",
                         "algorithm": "adamw", "model": model, "train.algorithm": "adamw",
                         "train.seed": 0, "step": step, "n_params": float(n),
                         "pretrain/kl": kl, "pretrain/kl_se": 0.0012,
                         "pretrain/loss": ENTROPY + kl, "pretrain/entropy": ENTROPY, **tasks,
                         "flat/trace_fisher": 5.0 if step == 0 else 140 + step / 100 + n / 10_000,
                         "flat/trace_fisher_se": 2.0,
                         "flat/trace_fisher_grown": 5.0 if step == 0 else 190 - n / 20_000,
                         "flat/trace_fisher_grown_se": 3.0})
    df = pd.DataFrame(rows)
    df.attrs["params"] = ["model", "train.algorithm", "train.seed"]
    return df
