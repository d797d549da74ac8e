"""Which of the leaderboard's measures survive function-preserving reparameterisations (issue 54):
each measure before and after each reparameterisation of a tiny trained BERT, its relative
change, the logits' largest change and the verdict (``flatlm.experiments.invariance`` says how,
and why the tolerance is what it is).

    python bench/invariance.py [--out bench/results] [--workdir DIR] [--threads 1]

Writes ``invariance.md`` (the verdicts, then every number) and ``invariance.json`` to ``--out``.
About a minute and a half on one CPU thread. ``tests/measure/test_invariance.py`` holds the
verdicts and checks that the committed JSON has them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from flatlm.experiments import invariance as inv

NAME = "invariance"


def cell(row: inv.Row) -> str:
    """The matrix's entry: the answer, and the number behind it."""
    mark = " ?" if row.fragile else ""
    if row.verdict == "exact":
        return "yes (exact)"
    if row.verdict == "within noise":
        return f"yes ({row.relative_change:.2g} <= {row.tolerance:.2g}){mark}"
    if row.verdict == "changes":
        return f"**no** ({row.relative_change:.2g}){mark}"
    return "**no** (undefined after)" if row.verdict == "undefined after" else "n/a"


def _table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(line) + " |" for line in lines)]


def _number(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.4g}"


def markdown(rows: list[inv.Row], command: str, seconds: float) -> str:
    cases = list(dict.fromkeys(r.case for r in rows))
    by = {(r.measure, r.case): r for r in rows}
    what = {c.name: c for c in inv.CASES}
    out = ["# Invariance of the measures under function-preserving reparameterisations", "",
           f"`{command}` ({seconds:.0f} s; `flatlm/experiments/invariance.py`). A tiny BERT "
           f"({inv.SHAPE}, {inv.TRAIN.steps} AdamW updates on a 6-word PCFG), float64, c = "
           f"{inv.FACTOR:g}. Each entry: invariant?, and the relative change |after - before| / "
           "|before| (`<=` the tolerance max(1e-6, 3 x the same-seed noise of the control "
           "permutations)); `?`: within a factor 2 of the tolerance (fragile).", "",
           "## Verdicts", ""]
    out += _table(["measure", *cases], [[m, *(cell(by[m, c]) for c in cases)]
                                        for m in inv.TESTED_MEASURES])
    out += ["", "## The reparameterisations", ""]
    out += _table(["case", "what", "logits kept", "max abs logit change"],
                  [[c, what[c].what, what[c].exact, f"{by[inv.LOSS, c].max_logit_change:.1e}"]
                   for c in cases])
    out += ["", "## Every number", ""]
    out += _table(["measure", "case", "before", "after", "s.e. before", "relative change",
                   "same-seed noise", "tolerance", "verdict"],
                  [[r.measure, r.case, _number(r.before), _number(r.after), _number(r.se_before),
                    _number(r.relative_change), _number(r.noise), _number(r.tolerance),
                    r.verdict + (" (fragile)" if r.fragile else "")] for r in rows])
    return "\n".join(out) + "\n"


def _json_row(row: inv.Row) -> dict:
    """The row with NaN as null (strict JSON)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in dataclasses.asdict(row).items()}


def record(rows: list[inv.Row], command: str, seconds: float) -> dict:
    return {"command": command, "seconds": round(seconds, 1), "shape": inv.SHAPE,
            "factor": inv.FACTOR, "floor": inv.FLOOR, "noise_multiple": inv.NOISE_MULTIPLE,
            "control_seeds": list(inv.CONTROL_SEEDS), "measures": list(inv.TESTED_MEASURES),
            "cases": [{"name": c.name, "what": c.what, "exact": c.exact} for c in inv.CASES],
            "rows": [_json_row(r) for r in rows]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the run and the checkpoints go (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python bench/invariance.py " + shlex.join(argv if argv is not None else
                                                         sys.argv[1:])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        rows = inv.invariance_table(args.workdir or scratch,
                                    progress=lambda name: print(name, flush=True))
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.md").write_text(markdown(rows, command.strip(), seconds))
    (args.out / f"{NAME}.json").write_text(
        json.dumps(record(rows, command.strip(), seconds), indent=1) + "\n")
    print(f"wrote {args.out / NAME}.md and .json ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
