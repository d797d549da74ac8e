"""Loss barriers between the final checkpoints of runs: are runs that reach one loss in one basin?

For every pair of runs under a trials root (``analysis.trials``: what ``flatlm replicate`` and the
sweeps write) whose final checkpoints have one shape (``flatlm.json``'s ``shape``), were trained on
one language (its source fingerprint) and end within ``--kl-tol`` of each other in
``pretrain/kl`` (``pretrain/loss`` where a run has no KL), the loss barrier on the straight line
between them (``flatlm.measure.landscape.barrier``): the population loss (``pretrain/loss``
per token, ``flatlm.measure.loss``) on ``--n-eval`` fresh validation sentences of the language,
drawn once per language from ``--seed``. Pairs in order of their run ids, at most
``--max-pairs``. Writes one CSV row per pair::

    python -m analysis.barriers --trials runs/paper --out barriers.csv --max-pairs 10
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import pandas as pd

from analysis.checkpoints import final_checkpoints
from analysis.trials import load_trials
from flatlm.core.flags import COUNT, NON_NEGATIVE, SEED, number_flag
from flatlm.measure import KL, LOSS
from flatlm.measure.landscape.barrier import loss_barrier
from flatlm.measure.loss import POSITIONS, LossConfig, pair_truth, per_token_loss
from flatlm.models.checkpoint import INFO_NAME, SOURCE_FINGERPRINT, load_checkpoint
from flatlm.sources import load

COLUMNS = ("run_a", "run_b", "shape", "kl_a", "kl_b", "loss_a", "loss_b", "barrier", "t_max",
           "losses")


def final_runs(root: Path) -> pd.DataFrame:
    """One row per run whose final measured checkpoint is on disk: run_id, step, the KL (or loss)
    it ended at, its checkpoint directory, shape and language."""
    df = final_checkpoints(load_trials(root))
    rows = []
    for _, r in df.iterrows():
        ckpt = root / r["run_id"] / "checkpoints" / f"step-{int(r['step'])}"
        if not (ckpt / INFO_NAME).is_file():
            continue  # the checkpoint was not kept
        info = json.loads((ckpt / INFO_NAME).read_text())
        language = info["extra"].get(SOURCE_FINGERPRINT) or json.dumps(info["source"],
                                                                       sort_keys=True)
        end = r[KL] if KL in r and pd.notna(r[KL]) else r.get(LOSS)
        rows.append({"run_id": r["run_id"], "step": int(r["step"]), "end": float(end),
                     "checkpoint": ckpt, "shape": info["shape"], "language": language,
                     "source": info["source"]})
    return pd.DataFrame(rows, columns=["run_id", "step", "end", "checkpoint", "shape",
                                       "language", "source"])


def barrier_pairs(runs: pd.DataFrame, kl_tol: float, max_pairs: int) -> list[tuple[int, int]]:
    """Index pairs (i, j), i before j in run-id order, of one shape and language with ends
    within ``kl_tol``; the first ``max_pairs``."""
    ordered = runs.sort_values("run_id")
    pairs = [(i, j) for i, j in itertools.combinations(ordered.index, 2)
             if runs.at[i, "shape"] == runs.at[j, "shape"]
             and runs.at[i, "language"] == runs.at[j, "language"]
             and abs(runs.at[i, "end"] - runs.at[j, "end"]) <= kl_tol]
    return pairs[:max_pairs]


def population_loss(spec: dict, *, n_eval: int, seed: int, loss_cfg: LossConfig, device):
    """model -> its ``pretrain/loss`` on ``n_eval`` validation sentences of the language
    ``spec`` drawn from ``seed``, their truth inferred once."""
    source = load(spec)
    tokens, lengths = source.sample_validation(n_eval, seed)
    truth = pair_truth(source, tokens, lengths, loss_cfg, device=device) \
        if source.has_truth else None
    return lambda model: per_token_loss(model, source, tokens, lengths, loss_cfg, device=device,
                                        truth=truth)


def measure_barriers(runs: pd.DataFrame, pairs, *, points: int, n_eval: int, seed: int,
                     loss_cfg: LossConfig, device: str) -> pd.DataFrame:
    """One row per pair (``COLUMNS``); the sentences and their truth drawn once per language."""
    losses, rows = {}, []
    for i, j in pairs:
        a, b = runs.loc[i], runs.loc[j]
        if a["language"] not in losses:
            losses[a["language"]] = population_loss(a["source"], n_eval=n_eval, seed=seed,
                                                    loss_cfg=loss_cfg, device=device)
        result = loss_barrier(load_checkpoint(a["checkpoint"])[0].to(device),
                              load_checkpoint(b["checkpoint"])[0].to(device),
                              losses[a["language"]], points)
        rows.append({"run_a": a["run_id"], "run_b": b["run_id"], "shape": a["shape"],
                     "kl_a": a["end"], "kl_b": b["end"], "loss_a": result.loss[0],
                     "loss_b": result.loss[-1], "barrier": result.barrier,
                     "t_max": result.t_max, "losses": json.dumps(result.loss)})
    return pd.DataFrame(rows, columns=COLUMNS)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", required=True, type=Path, help="a root of trial directories")
    p.add_argument("--out", required=True, type=Path, help="the CSV to write")
    p.add_argument("--max-pairs", type=COUNT, default=10)
    p.add_argument("--kl-tol", type=NON_NEGATIVE, default=0.05,
                   help="largest difference of the runs' final pretrain/kl (nats)")
    p.add_argument("--points", type=number_flag(int, at_least=3), default=11,
                   help="t values on the segment, ends included")
    p.add_argument("--n-eval", type=COUNT, default=1000, help="validation sentences")
    p.add_argument("--seed", type=SEED, default=0, help="draws the validation sentences")
    p.add_argument("--positions", default="one", choices=POSITIONS,
                   help="masked positions per sentence (measure.loss.positions)")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.trials.is_dir():
        raise SystemExit(f"error: --trials {args.trials}: no such directory")
    runs = final_runs(args.trials)
    pairs = barrier_pairs(runs, args.kl_tol, args.max_pairs)
    if not pairs:
        print(f"no pair of runs of one shape and language within --kl-tol {args.kl_tol} "
              f"({len(runs)} runs with a final checkpoint)", file=sys.stderr)
        return 1
    table = measure_barriers(runs, pairs, points=args.points, n_eval=args.n_eval,
                             seed=args.seed, loss_cfg=LossConfig(positions=args.positions),
                             device=args.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.drop(columns="losses").to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
