"""The jobs of the first search's stages 2 and 3 (``trials.run_one`` runs each): the experiments
of a finalist with the steps run's variants, the trials of a committed scale reusing the runs
already made, and the adversary's lambda searched from the largest down.

A job is ``{"id", "experiment", "trial", "config", "work"[, "inside"]}``; a row is what
``run_one`` returns for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from apps.testbed_search.first import CRITERIA, STEPS_VARIANTS
from apps.testbed_search.pool import run_all
from apps.testbed_search.trials import (
    algorithm_trial,
    experiment_trials,
    loss_only,
    run_one,
)
from flatlm.experiments.scales import Scale


def finalist_jobs(cid: str, sc: Scale, experiments, seeds, work: Path, *, variants=(),
                  variants_only: bool = False, long_steps: int | None = None,
                  pins: dict | None = None) -> list[dict]:
    """The trials of ``experiments`` at the finalist's scale ``sc`` (unless ``variants_only``;
    probes under the inside rule too for sizes and steps), and the steps run once per
    ``first.STEPS_VARIANTS`` name in ``variants`` (with ``variants_only``: the loss only, every
    1500 steps: a long run's KL at any multiple of 1500 is that of a run so long, at a constant
    rate). ``long_steps`` only names the variants' trials; ``pins``: ``candidate_pins``."""
    jobs = []
    for exp, trial, config in experiment_trials(sc, experiments, seeds, pins=pins):
        if not variants_only:
            jobs.append({"id": cid, "experiment": exp, "trial": trial, "config": config,
                         "work": str(work), "inside": exp in ("sizes", "steps")})
        if exp != "steps":
            continue
        for variant in variants:  # the steps run's own lr / dropout
            changed = loss_only(config) if variants_only else json.loads(json.dumps(config))
            if variants_only:
                steps = changed["train"]["steps"]
                changed["train"]["checkpoint_steps"] = list(range(1500, steps + 1, 1500))
            for key, value in STEPS_VARIANTS[variant].items():
                changed["train"][key.removeprefix("train.")] = value
            long = f"_{long_steps}" if long_steps else ""
            jobs.append({"id": cid, "experiment": "steps-variant",
                         "trial": f"{trial}_{variant}{long}", "config": changed,
                         "work": str(work)})
    return jobs


def scale_jobs(cid: str, sc: Scale, experiments, seeds, work: Path, runs: list[dict]) -> list[dict]:
    """The trials of a committed scale ``sc`` not yet run: one whose config equals a row of
    ``runs`` made for another id (training is deterministic) is that row, copied into ``runs``
    under ``cid`` with ``reused_from``, not a job."""
    jobs = []
    for exp, trial, config in experiment_trials(sc, experiments, seeds):
        same = next((r for r in runs if r["config"] == config and
                     r["experiment"] == exp and r["id"] != cid), None)
        if same is not None:
            runs[:] = [r for r in runs if (r["id"], r["trial"]) != (cid, trial)]
            runs.append({**same, "id": cid, "reused_from": same["id"]})
            continue
        jobs.append({"id": cid, "experiment": exp, "trial": trial, "config": config,
                     "work": str(work), "inside": exp in ("sizes", "steps")})
    return jobs


def adversary_lambda(cid: str, sc: Scale, seed: int, work: Path, done: dict, jobs: int,
                     say: Callable[[str], None] = print, pins: dict | None = None) -> dict:
    """Criterion (d): adversarial runs (the pre-training loss only) at ``CRITERIA``'s lambdas,
    largest first, ``jobs`` at a time, until one ends within the tolerance of AdamW's KL (the
    algorithms experiment's adamw trial of the same seed); the largest such lambda is taken.
    ``done`` (trial name -> row of the algorithms experiment) is reused: its adamw trial, and its
    adversarial trial where its lambda is the one tried. Returns ``adamw_kl``, ``tried`` and
    ``lambda`` (None where none is within the tolerance)."""
    adamw, adversarial = (loss_only(algorithm_trial(sc, a, seed, pins))
                          for a in ("adamw", "adversarial"))
    base = done.get(f"adamw_seed{seed}") or run_one(
        {"id": cid, "experiment": "algorithms", "trial": f"adamw_seed{seed}", "config": adamw,
         "work": str(work)})
    target = base["final"]["pretrain/kl"]
    tol, tried = CRITERIA["adversary_kl_tol"], []
    lambdas = list(CRITERIA["adversary_lambdas"])
    while lambdas and not any(abs(t["gap"]) <= tol for t in tried):
        batch, lambdas = lambdas[:jobs], lambdas[jobs:]
        pending, rows = [], {}
        for lam in batch:
            old = done.get(f"adversarial_seed{seed}")
            if old and old["config"]["train"].get("adversarial", {}).get("lambda") == lam:
                rows[lam] = old
                continue
            config = json.loads(json.dumps(adversarial))
            config["train"].setdefault("adversarial", {})["lambda"] = lam
            pending.append({"id": cid, "experiment": "adversary", "config": config,
                            "trial": f"lambda{lam}_seed{seed}", "work": str(work)})
        for row in run_all(jobs, run_one, pending, f"stage 3 (lambda {batch})"):
            rows[row["config"]["train"]["adversarial"]["lambda"]] = row
        for lam in batch:
            kl = rows[lam]["final"]["pretrain/kl"]
            tried.append({"lambda": lam, "kl": round(kl, 5), "gap": round(kl - target, 5),
                          "cpu_s": rows[lam]["cpu_s"], "wall_s": rows[lam]["wall_s"]})
            say(f"lambda {lam}: KL {kl:.4f} (adamw {target:.4f})")
    within = [t["lambda"] for t in tried if abs(t["gap"]) <= tol]
    return {"adamw_kl": target, "tried": tried, "lambda": max(within) if within else None}


def write_results(out: Path, results: dict) -> None:
    """A search's results JSON, written whole (each finished job's row is kept at once)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def add_screened(results: dict, rows: list[dict]) -> dict:
    """Stage 0 of ``results`` with the screened ``rows`` among its candidates, each in place of
    an earlier screen of the same id; returns the stage."""
    stage = results.setdefault("stage0", {"candidates": [], "rounds": {}})
    fresh = {r["id"] for r in rows}
    stage["candidates"] = [r for r in stage["candidates"] if r["id"] not in fresh] + rows
    return stage


def stage_saver(out: Path, results: dict, stage: str, key: Callable[[dict], object],
                command: str) -> Callable[[dict], None]:
    """``on_result`` for a stage whose rows are ``results[stage]["runs"]``, unique by ``key``:
    each row replaces an older one of the same key, the stage records ``command``, and the JSON
    is written."""
    def save(row: dict) -> None:
        runs = results.setdefault(stage, {}).setdefault("runs", [])
        runs[:] = [r for r in runs if key(r) != key(row)] + [row]
        results[stage]["command"] = command
        write_results(out, results)
    return save
