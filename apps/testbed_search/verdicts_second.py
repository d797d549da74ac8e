"""Testbed v2's verdicts and report (issue 38, item 2): its rows held against the criteria it fixed
before any run (``apps.testbed_search.second``).

The search reads KL, probe levels (the best trained probe, random-init features, the lookup
table), majority shares, class counts and times; never a claim's outcome (no difference between
models, algorithms or checkpoints). The claims enter only through the room each needs of the
compared arm (``room_needed``), read from their statements, not their verdicts.

- ``screen_verdict`` / ``kept``: stage 0's keep rule and rank, stage 1's pick;
- ``learn_verdict``: stage 1's criteria on a trained steps model;
- ``stage2_summary``: the criteria on a finalist's sizes grid and adversary;
- ``table``: the markdown report (``bench/results/testbed_v2_search.md``); ``merge``: the rows of
  runs made in parallel into one results dict.
"""

from __future__ import annotations

import json

from analysis.claims import CLAIMS
from apps.testbed_search.second import CRITERIA, SEEDS, STEPS_MODEL
from apps.testbed_search.verdicts_first import makespan
from flatlm.models.presets import parameter_count, parse_model
from flatlm.sources import load


def room_needed(claims=None, factor: float = CRITERIA["room_factor"]) -> list[dict]:
    """What (c)'s room asks of the compared arm's probe on each task: per accuracy claim with a
    size, ``max`` (a claim that the treatment probes better: the control at most 1 - factor x
    effect) or ``above_majority`` (worse: the control at least factor x |effect| above the
    majority share)."""
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


def kept(results: dict) -> list[dict]:
    """Stage 0's kept candidates whose lookup table reads <= ``stage1_lookup_max`` on every
    task, best first."""
    rows = [r for r in results.get("stage0", {}).get("candidates", []) if r.get("kept") and
            all(t["lookup"] <= CRITERIA["stage1_lookup_max"] for t in r["span"].values())]
    return sorted(rows, key=lambda r: r["rank"])


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
    return {str(w): round(makespan(trials, w)) for w in (2, 8, 16)}


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
