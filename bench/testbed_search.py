"""The search for the ``testbed`` scale (issue 23, item 3): a random grammar, a model grid, steps,
lr and batch on which the paper's precondition (models at the same, saturated, pre-training loss)
can hold on a 2-core laptop, with downstream tasks that random features do not solve.

The command line of ``apps.testbed_search`` (its definition, ``first``: criteria
(a)-(d) fixed before any claim was looked at, the grammar families, grids and settings; the runs,
``trials`` and ``jobs``) and ``apps.testbed_search.verdicts_first`` (the verdicts and the table).

Stages (each appends to ``--out``, a JSON file with the exact configs; the next reads it):

0 screen     (no training, seconds a candidate) random grammars from ``first.SPACES``: T,
             entropy, per task the majority share, the probe on a random d64 model's features
             (random_init), on the lookup table and on both concatenated (the truth beside the
             words), under the ``span`` rule; the kept: majority <= 50% and random_init <= 85%
             on every task, ranked by the smallest (random+lookup - random_init) gap.
1 learn      (minutes) the smallest model of each grid (``first.GRIDS``) on the kept, under each
             of ``first.SETTINGS``; a (candidate, grid, setting) passes when its final KL <= 0.02.
2 grid       the experiments (sizes, steps, algorithms, sgd; one seed, protocol ``paper``) of
             the candidate scale of the best 1-2 passing candidates, run as the replication runs
             them (``flatlm.runs.trial.run_trial``): the criteria table, per-trial CPU and wall
             times, the extrapolated replication and sweep times; (b) also under ``inside``.
3 adversary  (d) on the chosen scale.

    python bench/testbed_search.py --stage 0 --candidates 48
    python bench/testbed_search.py --stage 1
    python bench/testbed_search.py --stage 2 --finalists 1
    python bench/testbed_search.py --stage 3
    python bench/testbed_search.py --table      # writes the .md table from the JSON
    python bench/testbed_search.py --check      # the committed .md regenerates from the JSON

Times: CPU seconds of each one-thread trial process (``time.process_time``) are the cost (the
machine is shared; the wall time of a trial is also recorded); the replication's time is a
longest-first schedule of those onto 2 workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from apps.testbed_search.first import (
    CRITERIA,
    GRIDS,
    ID_PREFIX,
    MEASURE,
    REFERENCES,
    SETTINGS,
    SPACES,
    STEPS_VARIANTS,
)
from apps.testbed_search.jobs import (
    add_screened,
    adversary_lambda,
    finalist_jobs,
    scale_jobs,
    stage_saver,
    write_results,
)
from apps.testbed_search.pool import run_all
from apps.testbed_search.trials import (
    candidate_pins,
    candidate_scale,
    expected_cost,
    learn,
    run_one,
    screen,
)
from apps.testbed_search.verdicts_first import (
    best_passing,
    screen_kept,
    screen_verdict,
    summarise,
    table,
)
from flatlm.experiments.scales import scale as get_scale
from flatlm.sources.pcfg_family import draw_pcfg_specs, layered_pcfg_spec

RESULTS = Path(__file__).parent / "results"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3))
    p.add_argument("--table", action="store_true", help="write the .md table from --out")
    p.add_argument("--check", action="store_true",
                   help="regenerate the .md table from --out and compare it with the .md beside "
                        "it (its leading part: hand-run sections may follow); exit 1 if it differs")
    p.add_argument("--candidates", type=int, default=48, help="stage 0: grammars drawn")
    p.add_argument("--search-seed", type=int, default=0, help="stage 0: draws the grammars")
    p.add_argument("--space", default="wide", choices=list(SPACES),
                   help="stage 0: the random family; stage 1: whose kept to train")
    p.add_argument("--keep", type=int, default=6, help="stage 0: candidates kept for stage 1")
    p.add_argument("--only", nargs="*", default=None,
                   help="stages 1-2: candidate ids (default: stage 0's kept / stage 1's best)")
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--grids", nargs="*", default=list(GRIDS), choices=list(GRIDS))
    p.add_argument("--model", default=None,
                   help="stage 1: train this model instead of the grid's smallest (the grid "
                        "then names whose model it stands in; e.g. its steps model)")
    p.add_argument("--finalists", type=int, default=1, help="stage 2: candidates run")
    p.add_argument("--experiments", nargs="*", default=["sizes", "steps", "algorithms", "sgd"],
                   help="stage 2 (steps also runs STEPS_VARIANTS)")
    p.add_argument("--seeds", type=int, nargs="*", default=[0], help="stage 2 training seeds")
    p.add_argument("--variants", nargs="*", default=["lr2e-3", "nodrop"],
                   choices=list(STEPS_VARIANTS), help="stage 2: the steps run's variants")
    p.add_argument("--variants-only", action="store_true",
                   help="stage 2: only the steps run's variants (the pre-training loss only)")
    p.add_argument("--steps", type=int, default=None,
                   help="stages 1-2: replace the settings' steps (a quick check)")
    p.add_argument("--long-lr", type=float, default=None,
                   help="stage 2: the steps run's constant rate (default: the setting's)")
    p.add_argument("--long-steps", type=int, default=None,
                   help="stage 2: the steps / sgd run (default: 1.5 x the setting's steps)")
    p.add_argument("--scale", default=None,
                   help="stages 2-3: a scale of flatlm.experiments.scales (default: the "
                        "candidate scale of stage 1's best / stage 2's finalist)")
    p.add_argument("--jobs", type=int, default=2, help="processes (one thread each)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "testbed_search",
                   help="trial directories (checkpoints; not committed)")
    p.add_argument("--out", type=Path, default=RESULTS / "testbed_search.json")
    return p.parse_args(argv)



def _command() -> str:
    return "python bench/testbed_search.py " + " ".join(sys.argv[1:])


def _by_trial(row: dict) -> tuple:
    return row["id"], row["experiment"], row["trial"]


def stage0(args, results: dict) -> None:
    candidates = draw_pcfg_specs(SPACES[args.space], args.candidates, args.search_seed,
                                 ID_PREFIX[args.space])
    if args.space == "fixed":
        candidates += [{"id": name, "spec": layered_pcfg_spec(knobs, max_length, seed)}
                       for name, (knobs, max_length, seed) in REFERENCES.items()]
    rows = run_all(args.jobs, partial(screen, keep=screen_kept), candidates, "stage 0 (screen)")
    for row in rows:
        row["kept"], row["score"] = screen_verdict(row)
        row["space"] = args.space
    ranked = sorted((r for r in rows if r["kept"] and not r["id"].startswith("ref-")),
                    key=lambda r: -r["score"])
    stage = add_screened(results, rows)
    stage.setdefault("rounds", {})[args.space] = {
        "command": _command(), "kept": [r["id"] for r in ranked[: args.keep]]}


def stage1(args, results: dict) -> None:
    by_id = {r["id"]: r for r in results["stage0"]["candidates"]}
    ids = args.only or results["stage0"]["rounds"][args.space]["kept"]
    jobs = [{"id": i, "spec": by_id[i]["spec"], "grid": g,
             "model": args.model or GRIDS[g]["models"][0], "setting_name": s,
             "setting": SETTINGS[s] if args.steps is None else {**SETTINGS[s],
                                                                  "train.steps": args.steps}}
            for i in ids for g in args.grids for s in args.settings]
    run_all(args.jobs, learn, jobs, "stage 1 (smallest models)", stage_saver(
        args.out, results, "stage1", lambda r: (r["id"], r["grid"], r["model"], r["setting_name"]),
        _command()))


def stage2(args, results: dict) -> None:
    if args.scale:
        return stage2_of_scale(args, results)
    finalists = [r for r in best_passing(results) if not args.only or r["id"] in args.only]
    finalists = finalists[: args.finalists]
    if not finalists:
        raise SystemExit("stage 2: no candidate passed stage 1; widen stage 1 (--settings, "
                         "--grids, more candidates)")
    by_id = {r["id"]: r for r in results["stage0"]["candidates"]}
    jobs = []
    for f in finalists:
        sc = candidate_scale(by_id[f["id"]]["spec"], f["grid"], f["setting"], args.long_steps,
                             long_lr=args.long_lr)
        jobs += finalist_jobs(f["id"], sc, args.experiments, args.seeds, args.work,
                              variants=args.variants, variants_only=args.variants_only,
                              long_steps=args.long_steps, pins=candidate_pins(f["setting"]))
    jobs.sort(key=lambda j: -expected_cost(j))  # longest first: the two workers end together
    stage = results.setdefault("stage2", {"runs": []})
    if not args.variants_only:
        stage["finalists"] = [f for f in stage.get("finalists", [])
                              if f["id"] not in {g["id"] for g in finalists}] + [
            {k: f[k] for k in ("id", "grid", "setting_name", "setting")} | {
                "long_steps": args.long_steps or f["setting"]["train.steps"] * 3 // 2,
                "long_lr": args.long_lr} for f in finalists]
    desc = "stage 2 (steps variants)" if args.variants_only else "stage 2 (experiments)"
    run_all(args.jobs, run_one, jobs, desc,
            stage_saver(args.out, results, "stage2", _by_trial, _command()))
    stage.setdefault("summary", {}).update({f["id"]: summarise(f["id"], stage["runs"])
                                            for f in finalists})


def stage2_of_scale(args, results: dict) -> None:
    """Stage 2 on a scale of flatlm.experiments.scales (the chosen one, as committed)."""
    cid = f"scale:{args.scale}"
    stage = results.setdefault("stage2", {"runs": []})
    jobs = scale_jobs(cid, get_scale(args.scale), args.experiments, args.seeds, args.work,
                      stage["runs"])
    jobs.sort(key=lambda j: -expected_cost(j))
    run_all(args.jobs, run_one, jobs, f"stage 2 ({args.scale})",
            stage_saver(args.out, results, "stage2", _by_trial, _command()))
    stage.setdefault("summary", {})[cid] = summarise(cid, stage["runs"])


def stage3(args, results: dict) -> None:
    """(d) on ``--scale`` or stage 2's first finalist (of ``--only``); stage 2's adamw and
    adversarial (lambda = 1, the default) runs of the candidate are reused."""
    pins = None  # a committed scale's trials follow the protocol
    if args.scale:
        sc, cid = get_scale(args.scale), args.scale
    else:
        f = next(f for f in results["stage2"]["finalists"]
                 if not args.only or f["id"] in args.only)
        spec = {r["id"]: r for r in results["stage0"]["candidates"]}[f["id"]]["spec"]
        sc = candidate_scale(spec, f["grid"], f["setting"], f["long_steps"],
                             long_lr=f.get("long_lr"))
        cid, pins = f["id"], candidate_pins(f["setting"])
    seed = args.seeds[0]
    done = {r["trial"]: r for r in results.get("stage2", {}).get("runs", [])
            if r["id"] == cid and r["experiment"] == "algorithms"}
    found = adversary_lambda(cid, sc, seed, args.work, done, args.jobs,
                             say=lambda line: print(line, flush=True), pins=pins)
    results["stage3"] = {"command": _command(), "id": cid, "seed": seed, **found}


def check(args) -> int:
    """0 where the .md beside ``--out`` starts with the table regenerated from ``--out``."""
    md = args.out.with_suffix(".md")
    fresh, committed = table(json.loads(args.out.read_text())), md.read_text()
    if committed.startswith(fresh):
        print(f"{md}: regenerates from {args.out.name} ({len(fresh.splitlines())} lines; "
              f"{len(committed.splitlines()) - len(fresh.splitlines())} hand-run lines after)")
        return 0
    print(f"{md}: differs from the table regenerated from {args.out.name}")
    return 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.check:
        return check(args)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.setdefault("criteria", CRITERIA)
    results.pop("space", None)  # the layout before SPACES
    results.update({"spaces": SPACES, "references": REFERENCES, "grids": GRIDS,
                    "settings": SETTINGS, "measure": MEASURE,
                    "machine": f"{platform.platform()}, {os.cpu_count()} cores"})
    stages = {0: stage0, 1: stage1, 2: stage2, 3: stage3}
    if args.stage is not None:
        start = time.perf_counter()
        stages[args.stage](args, results)
        results.setdefault("wall_s", {})[f"stage{args.stage}"] = round(
            time.perf_counter() - start)
        write_results(args.out, results)
    if args.table or args.stage is not None:
        args.out.with_suffix(".md").write_text(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
