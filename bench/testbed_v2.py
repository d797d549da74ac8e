"""The search for testbed v2 (issue 38, item 2): a random grammar and model grid whose tasks are
as hard as the paper's (its probes read 49-90%), on which the paper's precondition still holds
on a CPU. The first testbed (``bench/testbed_search.py``, whose stages this search reuses) put
every trained probe at 97.5-100%: its verdicts on "probes better" claims were set by the ceiling.

Criteria, fixed in this file before any run of it (``CRITERIA``):

(a) every AdamW model of the sizes grid, and the steps model, ends at KL <= 0.02 nats/token;
(b) tasks of the paper's kind: the nonterminal label of the span by the paper's rule (``span``,
    A.1), spans by parse depth (A / B / C: the whole sentence, its first half, its first
    quarter), >= 10 classes per task and a majority share <= 30%;
(c) on every task the best trained probe lies in [50%, 90%], random-init features >= 10 points
    below it, and every accuracy claim of ``analysis.claims.CLAIMS`` with a size has room >= 2x
    the paper's effect in its direction (``room_needed``: for "probes better", 1 - the compared
    arm's accuracy; for "worse", the compared arm's accuracy - the majority share);
(d) the sizes grid grows width and depth together (as Table 3) over >= 4x in parameters;
(e) the adversary's lambda by the first search's rule (within 0.02 nats of AdamW's KL);
(f) a trial <= 30 CPU-minutes on one core.

The search reads KL, probe levels (the best trained probe, random-init features, the lookup
table), majority shares, class counts and times; never a claim's outcome (no difference between
models, algorithms or checkpoints).

Stages (each appends to ``--out``; the next reads it):

0 screen  (no training, seconds a candidate) random grammars of ``SPACES``, plus the paper's own
          grammar: per task classes, majority, the probe on random d64 features, on the lookup
          table, on both; kept: (b) met and random-init features <= 80% on every task (room for
          (c)'s +10 points under 90%); ranked by the fewest grammar rules (the fewer, the sooner
          a small model saturates: the first search's stage 1 found every large grammar at KL
          0.2-0.45), then by the truth's gain over the words.
1 learn   (minutes) among the kept, those whose lookup table reads <= 90% on every task
          (``stage1_lookup_max``): the steps model (d64-h4-l2-i256) at the first testbed's
          recipe (AdamW, constant 1e-3 after 100 warmup steps, batch 256, dropout 0.1), KL every 500
          steps and, at the end, the trained probe against random-init features of its shape:
          (a) for that model, (c)'s band, gap and room.

    python bench/testbed_v2.py --stage 0 --space v2-layered --candidates 40
    python bench/testbed_v2.py --stage 1 --keep 6 --steps 4000
    python bench/testbed_v2.py --table        # bench/results/testbed_v2_search.md from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import testbed_search as first  # bench/testbed_search.py: its screen and learn stages

from flatlm.measure import SATURATED_KL

RESULTS = Path(__file__).parent / "results"
CRITERIA = {
    "kl_max": SATURATED_KL,  # (a) nats/token
    "classes_min": 10,  # (b) every task
    "majority_max": 0.30,  # (b) every task
    "probe_band": [0.50, 0.90],  # (c) the best trained probe, every task
    "random_init_gap_min": 0.10,  # (c) best trained probe - random-init features
    "room_factor": 2.0,  # (c) room >= this x |the paper's effect|, every accuracy claim
    "param_ratio_min": 4.0,  # (d) the largest / the smallest model of the sizes grid
    "adversary_kl_tol": 0.02,  # (e)
    "trial_cpu_min_max": 30.0,  # (f) one core
    "screen_random_init_max": 0.80,  # stage 0's keep rule, room for (c)'s gap under 90%
    # stage 1's pick among the kept, set after stage 0 and before any training (stage 0's table
    # has no claim in it): a saturated model's conditionals are the truth's, so where the lookup
    # table (the probe on the true conditionals) reads above 90% on a task, a trained probe is
    # expected above (c)'s band too; 10 of stage 0's 18 kept read 0.94-0.99 on some task
    "stage1_lookup_max": 0.90,
}
# Stage 0's families: fixed-length sentences (terminal_share 0) of depth 3 (8 words, the first
# testbed's shape) or depth 4 (16 words), >= 10 roots (task A's classes) and >= 10 nonterminals
# a level (B's and C's), with more rules and shared words than the first testbed's 2 rules and 2
# shared words per nonterminal: ambiguity is what makes the span's label hard to read off.
SPACES = {
    "v2-layered": {
        "vocab": (64, 128, 200), "roots": (10, 12), "nonterminals_per_level": (10, 12, 16),
        "depth": (3,), "binary_per_nonterminal": (2, 3, 4, 6),
        "words_per_nonterminal": (1, 2, 4, 8), "terminal_share": (0.0,),
        "concentration": (1.0, 2.0, 4.0), "max_length": (8,),
    },
    "v2-deep": {
        "vocab": (128, 200), "roots": (10, 12), "nonterminals_per_level": (10, 12),
        "depth": (4,), "binary_per_nonterminal": (2, 3, 4),
        "words_per_nonterminal": (1, 2, 4), "terminal_share": (0.0, 0.1),
        "concentration": (2.0, 4.0), "max_length": (16,),
    },
    # after stage 1's first rounds (the layered grammars that read in (c)'s band stall at KL
    # 0.6-0.9, those that learn fast read 94-99.5%): a small grammar (few nonterminals a level,
    # few rules, words mostly one class's) with sentences of varying length, so that the span
    # of the first L words is a constituent of varying level: its label ranges over the
    # nonterminals of every level (>= 10 classes from 4-6 a level) and is not read off a fixed
    # tree shape; >= 10 roots (task A), each with its one rule
    "v2-varlen": {
        "vocab": (64, 128), "roots": (10, 12), "nonterminals_per_level": (4, 5, 6),
        "depth": (3, 4), "binary_per_nonterminal": (2, 3), "words_per_nonterminal": (1, 2),
        "terminal_share": (0.1, 0.2, 0.3), "concentration": (2.0, 4.0),
        "max_length": (8, 12, 16),
    },
}
ID_PREFIX = {"v2-layered": "L", "v2-deep": "D", "v2-varlen": "V"}
# The paper's own grammar (the released rules: 9 roots, 10 nonterminals a level, 20 rules each,
# 200 words, sentences up to 16 words), screened beside the random ones.
PAPER_GRAMMAR = {"id": "paper", "spec": {"kind": "pcfg", "grammar": "paper", "spans": "depth",
                                         "label_rule": "span"}}
# Stage 1: the first testbed's recipe (flatlm/experiments/scales.py TESTBED), steps model only.
STEPS_MODEL = "d64-h4-l2-i256"
# Stage 2's sizes grids (criterion (d): width and depth grow together, as Table 3; one head
# size, 16, so each grows into the largest; the steps model in each), smallest first.
GRIDS = {
    "w48-80": ("d48-h3-l1-i192", "d64-h4-l2-i256", "d80-h5-l3-i320"),  # 7.1x at V = 64
    "w32-64": ("d32-h2-l1-i128", "d48-h3-l2-i192", "d64-h4-l3-i256"),  # 9.7x at V = 64
}
SEEDS = {"steps": 5, "sizes": 5, "algorithms": 3, "sgd": 3}  # the replication's (issue 38, 3.)
SETTING = {"train.lr": 1e-3, "train.batch_size": 256, "train.schedule": "constant",
           "train.dropout": None, "train.steps": 10000, "train.warmup_steps": 100}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=(0, 1, 2))
    p.add_argument("--table", action="store_true", help="write the .md table from --out")
    p.add_argument("--space", default="v2-layered", choices=list(SPACES))
    p.add_argument("--candidates", type=int, default=40, help="stage 0: grammars drawn")
    p.add_argument("--search-seed", type=int, default=0, help="stage 0: draws the grammars")
    p.add_argument("--keep", type=int, default=6, help="stage 1: the best kept candidates run")
    p.add_argument("--only", nargs="*", default=None, help="stage 1: candidate ids")
    p.add_argument("--steps", type=int, default=None, help="stage 1: replace SETTING's steps")
    p.add_argument("--lr", type=float, default=None, help="stage 1: replace SETTING's rate")
    p.add_argument("--model", default=STEPS_MODEL, help="stage 1: the model trained")
    p.add_argument("--schedule", default=None, choices=("constant", "linear"),
                   help="stage 1: replace SETTING's schedule (the first search's stage 2 ran "
                        "5e-3 with a linear decay)")
    p.add_argument("--grid", default="w48-80", choices=list(GRIDS), help="stage 2: sizes grid")
    p.add_argument("--lambdas", type=float, nargs="*", default=[0.01, 0.00316],
                   help="stage 2: the adversary's lambdas (the first testbed's 0.01 and the "
                        "next below; the largest within (e)'s tolerance is taken)")
    p.add_argument("--jobs", type=int, default=2, help="processes (one thread each)")
    p.add_argument("--work", type=Path, default=Path("/tmp/testbed_v2"),
                   help="stage 2: trial directories (checkpoints; not committed)")
    p.add_argument("--out", type=Path, default=RESULTS / "testbed_v2_search.json")
    p.add_argument("--merge", type=Path, nargs="*", default=[],
                   help="add the stage 1-2 rows of these result files (runs made in parallel, "
                        "each on a copy of --out) to --out")
    return p.parse_args(argv)


# ---------------------------------------------------------------- criteria


def room_needed(claims=None, factor: float = CRITERIA["room_factor"]) -> list[dict]:
    """What (c)'s room asks of the compared arm's probe on each task: per accuracy claim with a
    size, ``max`` (a claim that the treatment probes better: the control at most 1 - factor x
    effect) or ``above_majority`` (worse: the control at least factor x |effect| above the
    majority share)."""
    from analysis.claims import CLAIMS

    out = []
    for c in claims or CLAIMS:
        task = c.metric.split(":")[-1] if c.metric.startswith("lookup:") else \
            c.metric.split("/")[1] if c.metric.startswith("probe/") else None
        if task is None or c.effect_size is None or c.relative:
            continue
        need = factor * abs(c.effect_size)
        row = {"claim": f"{c.figure}: {c.statement}", "task": task, "experiment": c.experiment}
        row.update({"max": round(1 - need, 4)} if c.sign > 0 else
                   {"above_majority": round(need, 4)})
        out.append(row)
    return out


def room_met(probe: dict, majority: dict, needs: list[dict]) -> list[dict]:
    """Each room requirement against the trained probe levels ``probe[task]`` (the compared arm
    stands in for AdamW's model) and ``majority[task]``: rows with ``room`` and ``met``."""
    rows = []
    for n in needs:
        if n["task"] not in probe:
            continue
        p, m = probe[n["task"]], majority[n["task"]]
        if "max" in n:
            room, need = 1 - p, 1 - n["max"]
        else:
            room, need = p - m, n["above_majority"]
        rows.append({**n, "room": round(room, 4), "needed": round(need, 4), "met": room >= need})
    return rows


def screen_verdict(row: dict) -> tuple[bool, list]:
    """(kept, rank key) of a stage-0 row: (b) on every task and random-init features <=
    ``screen_random_init_max``; ranked by the fewest rules, then the largest smallest gain of
    the truth beside the words over the words alone."""
    if "error" in row:
        return False, [1e9, 0.0]
    tasks = row["span"].values()
    ok = all(t["classes_seen"] >= CRITERIA["classes_min"] and
             t["majority"] <= CRITERIA["majority_max"] and
             t["random_init"] <= CRITERIA["screen_random_init_max"] for t in tasks)
    gain = min(t["random+lookup"] - t["random_init"] for t in tasks)
    return ok, [row["rules"], -round(gain, 4)]


def learn_verdict(row: dict, needs: list[dict]) -> dict:
    """Stage 1's criteria on one trained steps model: (a), (c)'s band, gap and room."""
    tasks = sorted({k.split("/")[1] for k in row["probe"] if k.startswith("probe/")})
    probe = {t: row["probe"][f"probe/{t}/acc_mean"] for t in tasks}
    rand = {t: row["probe"][f"random_init/{t}/acc_mean"] for t in tasks}
    major = {t: row["probe"][f"probe/{t}/majority_acc"] for t in tasks}
    lo, hi = CRITERIA["probe_band"]
    room = room_met(probe, major, needs)
    return {"a": row["final_kl"] <= CRITERIA["kl_max"],
            "c_band": all(lo <= v <= hi for v in probe.values()),
            "c_gap": all(probe[t] - rand[t] >= CRITERIA["random_init_gap_min"] for t in tasks),
            "c_room": all(r["met"] for r in room), "room": room}


# ---------------------------------------------------------------- stages


def stage0(args, results: dict) -> None:
    candidates = first.draw_candidates(args.candidates, args.search_seed, args.space,
                                       spaces=SPACES, prefixes=ID_PREFIX)
    screened = results.get("stage0", {}).get("candidates", [])
    if not any(r["id"] == PAPER_GRAMMAR["id"] for r in screened):
        candidates.append(PAPER_GRAMMAR)
    rows = first._run_all(args.jobs, first.screen, candidates, "stage 0 (screen)")
    for row in rows:
        row["kept"], row["rank"] = screen_verdict(row)
        row["space"] = args.space if row["id"] != PAPER_GRAMMAR["id"] else "paper"
    stage = results.setdefault("stage0", {"candidates": [], "rounds": {}})
    fresh = {r["id"] for r in rows}
    stage["candidates"] = [r for r in stage["candidates"] if r["id"] not in fresh] + rows
    stage["rounds"][f"{args.space}:{args.search_seed}"] = {"command": _command()}


def kept(results: dict) -> list[dict]:
    """Stage 0's kept candidates whose lookup table reads <= ``stage1_lookup_max`` on every
    task, best first."""
    rows = [r for r in results.get("stage0", {}).get("candidates", []) if r.get("kept") and
            all(t["lookup"] <= CRITERIA["stage1_lookup_max"] for t in r["span"].values())]
    return sorted(rows, key=lambda r: r["rank"])


def stage1(args, results: dict) -> None:
    by_id = {r["id"]: r for r in results["stage0"]["candidates"]}
    ids = args.only or [r["id"] for r in kept(results)[: args.keep]]
    changes = {"train.steps": args.steps, "train.lr": args.lr, "train.schedule": args.schedule}
    setting = {**SETTING, **{k: v for k, v in changes.items() if v is not None}}
    name = f"testbed-{setting['train.steps']}" + ("" if args.lr is None and args.schedule is None
                                                   else f"-{setting['train.lr']:g}-"
                                                   f"{setting['train.schedule']}")
    jobs = [{"id": i, "spec": by_id[i]["spec"], "grid": "v2", "model": args.model,
             "setting_name": name, "setting": setting} for i in ids]
    needs = room_needed()

    def save(row):
        row["verdict"], row["command"] = learn_verdict(row, needs), _command()
        first._saver(args, results, "stage1",
                     lambda r: (r["id"], r["model"], r["setting_name"]))(row)

    first._run_all(args.jobs, first.learn, jobs, "stage 1 (steps model)", save)


def v2_scale(spec: dict, grid: str, steps: int | None = None):
    """The scale a finalist stands for: the first testbed's (recipe, measurements, adversary's
    pools) with the candidate's language, the grid's models and the steps model."""
    from dataclasses import replace

    from flatlm.experiments.scales import TESTBED

    source = json.dumps(spec)
    return replace(TESTBED, name="v2-candidate", source=source, deep_source=source,
                   models=GRIDS[grid], model=STEPS_MODEL, steps=steps or TESTBED.steps,
                   long_steps=steps or TESTBED.long_steps, second_source=None,
                   selection_what=(), selection_lrs=())


def stage2(args, results: dict) -> None:
    """The finalist's sizes grid (one seed, measured as the replication measures it: (a), (c),
    (d), (f)) and its adversary at ``--lambdas`` (the pre-training loss only: (e))."""
    by_id = {r["id"]: r for r in results["stage0"]["candidates"]}
    cid = args.only[0]
    sc = v2_scale(by_id[cid]["spec"], args.grid, args.steps)
    jobs = [{"id": cid, "experiment": e, "trial": t, "config": c, "work": str(args.work)}
            for e, t, c in first.experiment_trials(sc, ["sizes"], [0])]
    adversarial = first._loss_only(first._trial_of(sc, "adversarial", 0))
    for lam in args.lambdas:
        config = json.loads(json.dumps(adversarial))
        config["train"]["adversarial"]["lambda"] = lam
        jobs.append({"id": cid, "experiment": "adversary", "trial": f"lambda{lam}_seed0",
                     "config": config, "work": str(args.work)})
    jobs.sort(key=lambda j: -first._expected_cost(j))
    results.setdefault("stage2", {})["grid"] = {cid: args.grid}
    first._run_all(args.jobs, first.run_one, jobs, "stage 2 (sizes, adversary)", first._saver(
        args, results, "stage2", lambda r: (r["id"], r["experiment"], r["trial"])))


def _command() -> str:
    import sys

    return "python bench/testbed_v2.py " + " ".join(sys.argv[1:])


# ---------------------------------------------------------------- table


def table(results: dict) -> str:
    lines = ["# Testbed v2 search (issue 38, item 2)", "",
             "Made by `bench/testbed_v2.py` (commands below); the JSON beside this file has "
             "every config. The search never read a claim's outcome: only KL, probe levels, "
             "majority shares, class counts and times.", "",
             f"Criteria (fixed in the script before any run): `{json.dumps(CRITERIA)}`", "",
             "Room each accuracy claim needs of the compared arm (criterion (c), "
             f"{CRITERIA['room_factor']:g}x the paper's effect):", "",
             "| claim | task | compared arm at most | or at least this above the majority |",
             "|---|---|---|---|"]
    for n in room_needed():
        lines.append(f"| {n['claim']} | {n['task']} | {n.get('max', '')} | "
                     f"{n.get('above_majority', '')} |")
    lines += _stage0_lines(results) + _stage1_lines(results) + _stage2_lines(results)
    lines += ["", "Cost, the sum over each stage's rows (one-thread processes, two or three at a "
              "time): " + "; ".join(
                  f"{stage} {sum(r.get('cpu_s', 0) for r in rows) / 60:.0f} CPU-min"
                  for stage, rows in (("stage 0", results.get("stage0", {}).get("candidates", [])),
                                      ("stage 1", results.get("stage1", {}).get("runs", [])),
                                      ("stage 2", results.get("stage2", {}).get("runs", []))))
              + f"; machine: {results.get('machine', '')}."]
    return "\n".join(lines) + "\n"


def _stage0_lines(results: dict) -> list[str]:
    stage = results.get("stage0", {})
    lines = ["", "## Stage 0: screen (no training)", "",
             "Commands: " + "; ".join(f"`{r['command']}`" for r in stage.get("rounds", {})
                                      .values()), "",
             "Per task: classes / majority / random-init d64 features / lookup table / both "
             "(span rule, 400 test sentences).", "",
             "| id | knobs (V, roots, N/level, depth, rules, words, share, conc.) | T | H | rules "
             "| A | B | C | kept |", "|---|---|---|---|---|---|---|---|---|"]
    rows = sorted(stage.get("candidates", []), key=lambda r: (not r.get("kept"), r["rank"]))
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['id']} | | | | | error: {r['error'][:60]} | | | no |")
            continue
        k = r["spec"].get("random", {})
        knobs = ",".join(str(k.get(n, "")) for n in (
            "vocab", "roots", "nonterminals_per_level", "depth", "binary_per_nonterminal",
            "words_per_nonterminal", "terminal_share", "concentration")) if k else \
            "the paper's grammar"
        cells = [" / ".join(f"{t[x]:.2f}" if x != "classes_seen" else str(t[x]) for x in (
            "classes_seen", "majority", "random_init", "lookup", "random+lookup"))
            for t in r["span"].values()]
        lines.append(f"| {r['id']} | {knobs} | {r['T']} | {r['entropy']:.2f} | {r['rules']} | "
                     + " | ".join(cells) + f" | {'yes' if r['kept'] else 'no'} |")
    return lines


def _stage1_lines(results: dict) -> list[str]:
    runs = results.get("stage1", {}).get("runs", [])
    if not runs:
        return []
    commands = dict.fromkeys(r.get("command", "") for r in runs)
    lines = ["", "## Stage 1: the steps model trained", "",
             "Commands: " + "; ".join(f"`{c}`" for c in commands if c), "",
             "Per task: trained probe / random-init features of its shape / majority.", "",
             "| id | model | setting (steps, rate, schedule) | final KL | A | B | C | (a) "
             "| (c) band | (c) gap | (c) room "
             "(unmet) | CPU min |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        v, p = r["verdict"], r["probe"]
        cells = [f"{p[f'probe/{t}/acc_mean']:.3f} / {p[f'random_init/{t}/acc_mean']:.3f} / "
                 f"{p[f'probe/{t}/majority_acc']:.3f}" for t in ("A", "B", "C")
                 if f"probe/{t}/acc_mean" in p]
        unmet = "; ".join(f"{x['task']} {x['claim'].split(':')[0]} room {x['room']:.3f} < "
                          f"{x['needed']:.3f}" for x in v["room"] if not x["met"]) or "all met"
        name = r["setting_name"].removeprefix("testbed-")
        setting = name if "-" in name else f"{name}, 0.001, constant"
        lines.append(f"| {r['id']} | {r['model']} | {setting.replace('-', ', ')} | "
                     f"{r['final_kl']:.4f} | "
                     + " | ".join(cells) + " | " + " | ".join(
                         "yes" if v[k] else "no" for k in ("a", "c_band", "c_gap")) +
                     f" | {unmet} | {r['cpu_s'] / 60:.1f} |")
    return lines


def stage2_summary(results: dict, cid: str) -> dict:
    """The criteria on a finalist's stage-2 runs: (a) each model's final KL, (c) each model's
    probe levels with band, gap and room, (d) the parameter ratio, (e) each lambda's KL gap to
    the steps model's AdamW run, (f) each trial's CPU minutes and the replication's cost."""
    from flatlm.models.presets import parameter_count, parse_model
    from flatlm.sources import load

    runs = [r for r in results.get("stage2", {}).get("runs", []) if r["id"] == cid]
    sizes = {r["model"]: r for r in runs if r["experiment"] == "sizes"}
    source = load(json.dumps(_spec(results, cid)))
    needs = room_needed()
    models = {m: {"kl": r["final"]["pretrain/kl"], "cpu_min": round(r["cpu_s"] / 60, 1),
                  "params": parameter_count(parse_model(m), source.V, source.max_length),
                  **learn_verdict({"probe": r["final"], "final_kl": r["final"]["pretrain/kl"]},
                                  needs)} for m, r in sizes.items()}
    adamw = sizes.get(STEPS_MODEL, {}).get("final", {}).get("pretrain/kl")
    adversary = {r["trial"]: {"kl": r["final"]["pretrain/kl"], "cpu_min": round(
        r["cpu_s"] / 60, 1), "gap": None if adamw is None else round(
        r["final"]["pretrain/kl"] - adamw, 4)} for r in runs if r["experiment"] == "adversary"}
    params = [m["params"] for m in models.values()]
    return {"models": models, "adversary": adversary,
            "param_ratio": round(max(params) / min(params), 2) if params else None,
            "replication_min": replication_cost(models, adversary)}


def _spec(results: dict, cid: str) -> dict:
    return next(r["spec"] for r in results["stage0"]["candidates"] if r["id"] == cid)


def replication_cost(models: dict, adversary: dict) -> dict:
    """Wall minutes of one protocol's replication on 2, 8 and 16 one-thread workers (longest
    first), from stage 2's per-trial CPU minutes: a sizes trial as measured; the steps, sgd,
    AdamW and noreg trials as the steps model's sizes trial (the same training length; the
    steps run's two extra checkpoints not counted); SAM twice it (two passes a step); the
    adversary as its stage-2 run plus the steps model's measuring (taken as 20% of it)."""
    if STEPS_MODEL not in models:
        return {}
    base = models[STEPS_MODEL]["cpu_min"]
    adv = max((a["cpu_min"] for a in adversary.values()), default=base) + 0.2 * base
    trials = [m["cpu_min"] for m in models.values() for _ in range(SEEDS["sizes"])]
    trials += [base] * (SEEDS["steps"] + SEEDS["sgd"]) + [base, base, 2 * base, adv] * SEEDS[
        "algorithms"]
    return {str(w): round(first._makespan(trials, w)) for w in (2, 8, 16)}


def _stage2_lines(results: dict) -> list[str]:
    stage = results.get("stage2", {})
    lines = []
    for cid, grid in stage.get("grid", {}).items():
        s = stage2_summary(results, cid)
        lines += ["", f"## Stage 2: {cid}, grid {grid} (one seed, protocol paper)", "",
                  f"Command: `{stage.get('command', '')}`", "",
                  "| model | parameters | final KL | (a) | A / B / C trained probe | (c) band | "
                  "(c) gap | (c) room (unmet) | CPU min | (f) |", "|---|---|---|---|---|---|---|"
                  "---|---|---|"]
        for m, v in s["models"].items():
            r = next(r for r in stage["runs"] if r["id"] == cid and r["model"] == m
                     and r["experiment"] == "sizes")
            probes = " / ".join(f"{r['final'].get(f'probe/{t}/acc_mean', float('nan')):.3f}"
                                for t in ("A", "B", "C"))
            unmet = "; ".join(f"{x['task']} {x['claim'].split(':')[0]} {x['room']:.3f} < "
                              f"{x['needed']:.3f}" for x in v["room"] if not x["met"])
            lines.append(f"| {m} | {v['params']:,} | {v['kl']:.4f} | {_yes(v['a'])} | {probes} | "
                         f"{_yes(v['c_band'])} | {_yes(v['c_gap'])} | {unmet or 'all met'} | "
                         f"{v['cpu_min']} | {_yes(v['cpu_min'] <= CRITERIA['trial_cpu_min_max'])} "
                         "|")
        lines += ["", f"(d) parameters, largest / smallest: {s['param_ratio']}x (needed >= "
                  f"{CRITERIA['param_ratio_min']:g}x).", "",
                  "(e) the adversary (loss only): " + "; ".join(
                      f"{k}: KL {v['kl']:.4f}, {v['gap']:+.4f} from AdamW's, {v['cpu_min']} "
                      "CPU min" for k, v in s["adversary"].items()) + ".", "",
                  "(f) one protocol's replication (steps and sizes 5 seeds, the others 3), wall "
                  "minutes on 2 / 8 / 16 one-thread workers: " + " / ".join(
                      s["replication_min"].get(str(w), "?") and str(s["replication_min"][str(w)])
                      for w in (2, 8, 16)) + " (`replication_cost`: estimated from these trials)."]
    return lines


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def merge(results: dict, other: dict) -> None:
    """``other``'s rows into ``results`` (a row of the same key replaced), its wall times
    added."""
    zero = other.get("stage0", {})
    stage = results.setdefault("stage0", {"candidates": [], "rounds": {}})
    fresh = {r["id"] for r in zero.get("candidates", [])}
    stage["candidates"] = [r for r in stage["candidates"] if r["id"] not in fresh] + zero.get(
        "candidates", [])
    stage["rounds"].update(zero.get("rounds", {}))
    keys = {"stage1": lambda r: (r["id"], r["model"], r["setting_name"]),
            "stage2": lambda r: (r["id"], r["experiment"], r["trial"])}
    for stage, key in keys.items():
        rows = other.get(stage, {}).get("runs", [])
        mine = results.setdefault(stage, {}).setdefault("runs", [])
        fresh = {key(r) for r in rows}
        mine[:] = [r for r in mine if key(r) not in fresh] + rows
        results[stage].update({k: v for k, v in other.get(stage, {}).items() if k != "runs"})


def main(argv=None) -> int:
    args = parse_args(argv)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.update({"criteria": CRITERIA, "spaces": SPACES, "setting": SETTING,
                    "measure": first.MEASURE,
                    "machine": f"{platform.platform()}, {os.cpu_count()} cores"})
    for other in args.merge:
        merge(results, json.loads(other.read_text()))
    if args.merge:
        first._write(args, results)
    if args.stage is not None:
        start = time.perf_counter()
        {0: stage0, 1: stage1, 2: stage2}[args.stage](args, results)
        wall = results.setdefault("wall_s", {})
        wall[f"stage{args.stage}"] = wall.get(f"stage{args.stage}", 0) + round(
            time.perf_counter() - start)
        first._write(args, results)
    args.out.with_suffix(".md").write_text(table(results))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
