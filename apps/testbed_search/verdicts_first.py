"""The first testbed search's verdicts and report (issue 23, item 3): its rows held against the
criteria it fixed before any claim was read (``apps.testbed_search.first``).

The search never reads a claim's outcome: these functions read KL, the best trained probe against
the random-init features, majority shares and times, never a probe (or Tr(F)) difference between
models, algorithms or checkpoints.

- ``screen_verdict``: stage 0's keep rule and score;
- ``best_passing``: stage 1's passing (candidate, grid, setting), one per candidate;
- ``summarise``: stage 2's criteria table of one candidate, ``replication_time`` its (c);
- ``table``: the markdown report of every stage (``bench/results/testbed_search.md``).
"""

from __future__ import annotations

import json

from apps.testbed_search.first import (
    CRITERIA,
    GRIDS,
    RANDOM_INIT_MAX,
    SETTINGS,
    SPACES,
)


def screen_verdict(row: dict) -> tuple[bool, float]:
    """(kept, score): majority <= 50% and random_init <= 85% on every task under ``span``; the
    score, the smallest gain of the truth beside the words over the words alone."""
    if "error" in row:
        return False, -1.0
    tasks = row["span"].values()
    ok = all(t["majority"] <= CRITERIA["majority_max"] and t["random_init"] <= RANDOM_INIT_MAX
             for t in tasks)
    return ok, round(min(t["random+lookup"] - t["random_init"] for t in tasks), 4)


def screen_kept(row: dict) -> bool:
    """Whether stage 0 keeps ``row`` (the screen labels by the inside rule too only then)."""
    return screen_verdict(row)[0]


def best_passing(results: dict) -> list[dict]:
    """Stage 1's passing (candidate, grid, setting), one per candidate: the most paper-like
    setting, then the first grid; candidates by stage 0's score."""
    score = {r["id"]: r["score"] for r in results["stage0"]["candidates"] if r["kept"]}
    order = {s: k for k, s in enumerate(SETTINGS)}
    grid_order = {g: k for k, g in enumerate(GRIDS)}
    best = {}
    for r in results.get("stage1", {}).get("runs", []):
        if not r["passed"] or r["model"] != GRIDS[r["grid"]]["models"][0] or \
                r["id"] not in score:  # passed, as its grid's smallest, and kept by stage 0
            continue
        rank = (order[r["setting_name"]], grid_order[r["grid"]])
        if r["id"] not in best or rank < best[r["id"]][0]:
            best[r["id"]] = (rank, r)
    return [r for _, r in sorted(best.values(), key=lambda x: -score[x[1]["id"]])]


def summarise(cid: str, runs: list[dict]) -> dict:
    """The criteria table of one candidate: (a) the final KL of every AdamW sizes model and the
    steps model, (b) per task the best trained probe, the random-init features (the best over
    the trials' shapes), the majority, (c) the extrapolated times."""
    runs = [r for r in runs if r["id"] == cid]
    adamw = [r for r in runs if r["experiment"] in ("sizes", "steps")]
    a = {f"{r['experiment']}:{r['model']}": r["final"]["pretrain/kl"] for r in adamw}
    variants = {r["trial"]: r["final"]["pretrain/kl"] for r in runs
                if r["experiment"] == "steps-variant"}
    tasks = sorted({k.split("/")[1] for r in adamw for k in r["final"] if k.startswith("probe/")})
    b = {}
    for rule, get in (("span", lambda r, k: r["final"].get(k)),
                      ("inside", lambda r, k: r.get("inside", {}).get(k))):
        b[rule] = {}
        for task in tasks:
            probe = [v for r in adamw if (v := get(r, f"probe/{task}/acc_mean")) is not None]
            rand = [v for r in adamw if (v := get(r, f"random_init/{task}/acc_mean")) is not None]
            major = [v for r in adamw if (v := get(r, f"probe/{task}/majority_acc")) is not None]
            if not probe:
                continue
            b[rule][task] = {"best_probe": round(max(probe), 4), "random_init": round(max(rand), 4),
                             "gain": round(max(probe) - max(rand), 4),
                             "majority": round(max(major), 4)}
    c = replication_time(runs)
    return {"a_kl": a, "a_passed": all(v <= CRITERIA["kl_max"] for v in a.values()),
            "a_steps_variants_kl": variants,
            "b": b, "b_passed": {rule: all(t["gain"] >= CRITERIA["probe_gain_min"] and
                                           t["majority"] <= CRITERIA["majority_max"]
                                           for t in rows.values()) for rule, rows in b.items()},
            "c": c}


def replication_time(runs: list[dict]) -> dict:
    """(c): the replication's trials (CRITERIA seeds per experiment, each seed costing what the
    first measured seed did) on 2 workers, longest first; one protocol, and two (paper and
    paper-code, assumed to cost the same); each no-argument sweep: one seed. CPU seconds of
    one-thread trials."""
    first = min(r["config"]["train"]["seed"] for r in runs)
    per_seed: dict[str, list[float]] = {}
    for r in runs:
        if r["config"]["train"]["seed"] == first and r["experiment"] in CRITERIA["seeds"]:
            per_seed.setdefault(r["experiment"], []).append(r["cpu_s"])
    one = [c for exp, costs in per_seed.items() for c in costs * CRITERIA["seeds"][exp]]
    workers = CRITERIA["workers"]
    return {"per_trial_cpu_s": {e: [round(x) for x in c] for e, c in per_seed.items()},
            "replication_one_protocol_s": round(makespan(one, workers)),
            "replication_two_protocols_s": round(makespan(one * 2, workers)),
            "sweeps_s": {e: round(makespan(c, workers)) for e, c in per_seed.items()}}


def makespan(costs: list[float], workers: int) -> float:
    """Longest-processing-time-first schedule of ``costs`` on ``workers``: when the last ends."""
    loads = [0.0] * workers
    for c in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads) if loads else 0.0


def criteria_table(results: dict, cid: str = "scale:testbed") -> list[str]:
    """The criteria, measured on the chosen scale (stage 2 with --scale testbed, stage 3)."""
    summary = results.get("stage2", {}).get("summary", {}).get(cid)
    if summary is None:
        return []
    kl, tol = CRITERIA["kl_max"], CRITERIA["probe_gain_min"]
    lines = [f"## The criteria on the chosen scale (`{cid}`; one seed, protocol paper)", "",
             "| criterion | model / task | measured | needed | met |", "|---|---|---|---|---|"]
    for name, value in summary["a_kl"].items():
        lines.append(f"| (a) final KL, nats/token | {name} | {value:.4f} | <= {kl} | "
                     f"{'yes' if value <= kl else 'no'} |")
    for rule, rows in summary["b"].items():
        for task, v in rows.items():
            met = v["gain"] >= tol and v["majority"] <= CRITERIA["majority_max"]
            lines.append(f"| (b) {rule} labels: best probe - random-init; majority | task "
                         f"{task} | {v['best_probe']:.3f} - {v['random_init']:.3f} = "
                         f"{v['gain'] * 100:+.1f} pts; {v['majority'] * 100:.1f}% | >= "
                         f"{tol * 100:.0f} pts; <= {CRITERIA['majority_max'] * 100:.0f}% | "
                         f"{'yes' if met else 'no'} |")
    c, budget = summary["c"], CRITERIA["replication_budget_s"]
    for key, what in (("replication_one_protocol_s", "replication, one protocol"),
                      ("replication_two_protocols_s", "replication, paper + paper-code")):
        lines.append(f"| (c) {what} (5/5/3/3 seeds), 2 workers | all trials | "
                     f"{c[key] / 60:.0f} min | <= {budget / 60:.0f} min | "
                     f"{'yes' if c[key] <= budget else 'no'} |")
    for exp, sec in c["sweeps_s"].items():
        lines.append(f"| (c) no-argument sweep, one seed, 2 workers (without Ray's start) | "
                     f"{exp} | {sec / 60:.1f} min | <= {CRITERIA['sweep_budget_s'] / 60:.0f} "
                     f"min | {'yes' if sec <= CRITERIA['sweep_budget_s'] else 'no'} |")
    s3 = results.get("stage3")
    if s3:
        lam = s3["lambda"]
        lines.append(f"| (d) adversary's lambda (largest of {CRITERIA['adversary_lambdas']} "
                     f"within {CRITERIA['adversary_kl_tol']} nats of AdamW's KL "
                     f"{s3['adamw_kl']:.4f}) | {s3['id']} | "
                     + ("none: " if lam is None else f"{lam}: ") + ", ".join(
                         f"{t['lambda']} -> {t['kl']:.4f}" for t in s3["tried"])
                     + f" | gap <= {CRITERIA['adversary_kl_tol']} | "
                     + ("no lambda does" if lam is None else "yes") + " |")
    lines += ["", "CPU seconds per trial (one thread; the replication's time is a longest-first "
              "schedule of them onto 2 workers, each further seed costing the same): "
              + json.dumps(c["per_trial_cpu_s"]), ""]
    return lines


def table(results: dict) -> str:
    """A short markdown table of each stage (from the JSON)."""
    lines = ["# Testbed search (issue 23, item 3)", "",
             "Made by `bench/testbed_search.py` (commands below); the JSON beside this file has "
             "every config. The search never read a claim's outcome: only KL, the best trained "
             "probe against random-init features, majority shares and times.", "",
             "Criteria (fixed before the search): " + json.dumps(CRITERIA), ""]
    lines += criteria_table(results)
    if "stage0" in results:
        s0 = results["stage0"]
        lines += ["## Stage 0: screen", "",
                  "span rule; per task majority / random_init / lookup / random+lookup", "",
                  "| id | knobs | T | H | A | B | C | kept | score |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(s0["candidates"], key=lambda r: -r.get("score", -1)):
            if "error" in r:
                continue
            knobs = ",".join(f"{v}" for v in r["spec"]["random"].values())
            cells = ["/".join(f"{r['span'][t][k]:.2f}" for k in ("majority", "random_init",
                                                               "lookup", "random+lookup"))
                     for t in ("A", "B", "C")]
            lines.append(f"| {r['id']} | {knobs},L{r['spec']['max_length']} | {r['T']} | "
                         f"{r['entropy']:.2f} | {' | '.join(cells)} | {r['kept']} | {r['score']} |")
        lines += ["", f"knob order: {', '.join(SPACES['wide'])}", ""] + [
            f"round {k}: `{v['command']}`, kept {v['kept']}" for k, v in s0["rounds"].items()]
        lines.append("")
    if "stage1" in results:
        lines += [f"## Stage 1: the smallest model (`{results['stage1']['command']}`)", "",
                  "| id | grid | model | setting | final KL | cpu s |", "|---|---|---|---|---|---|"]
        for r in results["stage1"]["runs"]:
            lines.append(f"| {r['id']} | {r['grid']} | {r['model']} | {r['setting_name']} | "
                         f"{r['final_kl']:.4f} | {r['cpu_s']} |")
        lines.append("")
    if "stage2" in results:
        s2 = results["stage2"]
        lines += [f"## Stage 2: the experiments (`{s2['command']}`)", ""]
        for cid, s in s2["summary"].items():
            lines += [f"### {cid}", "", "(a) final KL: " + ", ".join(
                f"{k} {v:.4f}" for k, v in s["a_kl"].items()) + f" -> {s['a_passed']}; the "
                "steps run's variants: " + ", ".join(
                f"{k} {v:.4f}" for k, v in s.get("a_steps_variants_kl", {}).items()), ""]
            for rule, rows in s["b"].items():
                lines.append(f"(b) {rule}: " + "; ".join(
                    f"{t}: probe {v['best_probe']:.3f} vs random {v['random_init']:.3f} "
                    f"(+{v['gain'] * 100:.1f} pts), majority {v['majority']:.2f}"
                    for t, v in rows.items()) + f" -> {s['b_passed'].get(rule)}")
            c = s["c"]
            lines += ["", f"(c) CPU s per trial: {c['per_trial_cpu_s']}; replication "
                      f"{c['replication_one_protocol_s']} s (one protocol), "
                      f"{c['replication_two_protocols_s']} s (two); sweeps {c['sweeps_s']}", ""]
        lines += ["| trial | algorithm | final KL | cpu s | wall s |", "|---|---|---|---|---|"]
        for r in s2["runs"]:
            lines.append(f"| {r['id']}/{r['experiment']}/{r['trial']} | {r['algorithm']} | "
                         f"{r['final']['pretrain/kl']:.4f} | {r['cpu_s']} | {r['wall_s']} |")
        lines.append("")
    if "stage3" in results:
        s3 = results["stage3"]
        lines += [f"## Stage 3: the adversary's lambda (`{s3['command']}`)", "",
                  f"AdamW KL {s3['adamw_kl']:.4f}; tried: " + "; ".join(
                      f"lambda {t['lambda']}: KL {t['kl']:.4f} (gap {t['gap']:+.4f})"
                      for t in s3["tried"]) + f"; chosen: {s3['lambda']}", ""]
    return "\n".join(lines) + "\n"
