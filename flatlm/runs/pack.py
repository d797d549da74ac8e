"""A packed trial: K trials of one shape trained as one model (``flatlm.train.pack.train_pack``)
and each measured at its checkpoints exactly as ``flatlm.runs.trial.run_trial`` measures it.

``run_pack(cfgs, out_dirs, reports)`` writes into each member's ``out_dir`` what ``run_trial``
writes (``config.json``, ``metrics.jsonl``, ``train_log.jsonl``, ``checkpoints/step-<N>/``
with their ``metrics.json``), and a diverged member's ``diverged.json``
(``flatlm.storage.diverged``), so that a member's directory is its unpacked trial's: on the CPU
every metric but the timings (``time/*``) is bit for bit the one ``run_trial`` gives
(tests/runs/test_run_pack.py). Re-running resumes every member from the step they all reached.
A member that diverges stops alone; the others go on. With ``batched_measure=True`` each round
of checkpoints measures the members' loss, KL and entropy in one batched forward
(``flatlm.runs.pack_measure``), still bit for bit on the CPU.

Which trials share a pack: ``pack_key`` (same labelled source, model shape, batch and
micro-batch sizes, precision, masking kind, optimizer, packed update and checkpoint steps);
``group_packs`` cuts a list of trials into packs of at most K. A trial ``unpacked_reason``
names a reason for (an algorithm without a packed update, grow; a model other than the post-LN
BERT; data-parallel training) runs alone through ``run_trial``, the reason logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from flatlm.core.config import to_dict
from flatlm.models.architectures import unpackable_reason
from flatlm.models.presets import parse_model
from flatlm.runs.pack_measure import RoundMeasurer
from flatlm.runs.pack_size import check_pack_size
from flatlm.runs.trial import (
    Report,
    Runtime,
    TrialConfig,
    TrialMeasurer,
    labelled_source,
    recorded_divergence,
    run_trial_once,
    validate_trial,
    with_downstream_resolved,
)
from flatlm.runs.trial_progress import Sink, TrialProgress
from flatlm.storage.dirlock import writer_lock
from flatlm.storage.diverged import record_divergence
from flatlm.train.config import ALGORITHMS, resolve
from flatlm.train.pack import SHARED_FIELDS, train_pack
from flatlm.train.registry import algorithm_named
from flatlm.train.run import Diverged

log = logging.getLogger(__name__)

# What run_pack returns for a member: step -> metrics of each checkpoint, or what stopped it.
MemberResult = dict[int, dict] | Diverged


def unpacked_reason(cfg: TrialConfig) -> str | None:
    """Why ``cfg`` cannot train in a pack, or None when it can."""
    why = unpackable_reason(parse_model(cfg.model))
    if why is not None:
        return f"{cfg.model}: {why}"
    algorithm = algorithm_named(cfg.train.algorithm)
    if algorithm.packed_step is None:
        return f"train.algorithm={algorithm.name}: {algorithm.unpacked_reason}"
    if cfg.train.world_size != 1:
        return f"train.world_size={cfg.train.world_size}: a pack is one process"
    if cfg.train.targets != "sampled":
        return f"train.targets={cfg.train.targets}: the packed updates train on the sampled words"
    return None


def pack_key(cfg: TrialConfig) -> str:
    """What trials in one pack share, as a string (equal keys: one pack). A packable ``cfg``."""
    train = resolve(cfg.train)
    shape = dataclasses.replace(parse_model(cfg.model), dropout=0.0)
    return json.dumps({
        "source": labelled_source(cfg).to_dict(), "model": shape.to_dict(),
        "shared": {f: getattr(train, f) for f in SHARED_FIELDS},
        "mask": "one" if train.mask == "one" else "rate",
        "optimizer": ALGORITHMS[train.algorithm].optimizer,
        "update": str(algorithm_named(train.algorithm).packed_step),
        "checkpoint_steps": sorted(set(train.checkpoint_steps)),
    }, sort_keys=True, default=str)


def group_packs(cfgs: Sequence[TrialConfig], size: int) -> list[list[int]]:
    """The indices of ``cfgs`` cut into packs of at most ``size`` trials of one ``pack_key``,
    in the order the trials come (a pack where its first trial is); an unpackable trial is a
    pack of its own. ``size`` 1: every trial alone."""
    check_pack_size(size)
    packs: list[list[int]] = []
    open_pack: dict[str, list[int]] = {}  # key -> the pack still taking members
    for k, cfg in enumerate(cfgs):
        if size == 1 or unpacked_reason(cfg) is not None:
            packs.append([k])
            continue
        key = pack_key(cfg)
        if key not in open_pack or len(open_pack[key]) >= size:
            open_pack[key] = []
            packs.append(open_pack[key])
        open_pack[key].append(k)
    return packs


def check_pack_request(cfgs: Sequence[TrialConfig], size) -> None:
    """A ``--pack`` the user gave: a whole number >= 1, and with ``size`` > 1 no trial of an
    algorithm that cannot be packed (a ValueError naming it and the way out). A trial whose
    model cannot be packed (an LSTM, a pre-LN BERT) is not an error: it runs alone."""
    check_pack_size(size)
    if size == 1:
        return
    for cfg in cfgs:
        algorithm = algorithm_named(cfg.train.algorithm)
        if algorithm.packed_step is None:
            raise ValueError(f"--pack {size}: train.algorithm={algorithm.name} cannot be packed "
                             f"({algorithm.unpacked_reason}); leave {algorithm.name} out of "
                             "the trials, or pass --pack 1")


def run_pack(cfgs: Sequence[TrialConfig], out_dirs: Sequence[str | Path],
             reports: Sequence[Report | None] | None = None, *,
             device: str | torch.device = "cpu", progress: bool = False,
             eval_cache: str | Path | None = None, on_progress: Sink | None = None,
             on_round: Callable[[], None] | None = None,
             batched_measure: bool = False) -> list[MemberResult]:
    """Runs (or resumes) the trials ``cfgs`` into ``out_dirs``, the packable ones as one pack;
    ``reports[k]``: member k's report sink (``run_trial``'s ``report``). Returns, per member,
    step -> metrics of every checkpoint, or the ``Diverged`` that stopped it (recorded in its
    ``diverged.json``; a member that has one already is not trained again). The packable
    members must share a ``pack_key`` (a ValueError before any work). ``on_progress``: the
    pack's progress (its step; the member measured). ``on_round()``: called after each round
    of the pack's reports (the checkpoints a resume measured or re-reported; then every
    checkpoint step's), for a sink that reports the members together (the Ray sweeps).
    ``batched_measure``: each round of checkpoints measures the members' loss, KL and entropy
    in one batched forward (``flatlm.runs.pack_measure``; equal bit for bit on the CPU, to
    float rounding on CUDA), the rest member by member; False (the default): every member
    measured alone, exactly as ``run_trial`` measures it, on every device."""
    if len(cfgs) != len(out_dirs) or not cfgs:
        raise ValueError(f"run_pack: {len(cfgs)} configs for {len(out_dirs)} directories")
    reports = list(reports) if reports is not None else [None] * len(cfgs)
    out_dirs = [Path(d).absolute() for d in out_dirs]
    results: list[MemberResult | None] = [None] * len(cfgs)
    packed = []
    for k, cfg in enumerate(cfgs):
        if (recorded := recorded_divergence(out_dirs[k])) is not None:
            results[k] = recorded
        elif (reason := unpacked_reason(cfg)) is not None:
            log.warning("trial %s runs unpacked: %s", out_dirs[k].name, reason)
        else:
            packed.append(k)
    if len({pack_key(cfgs[k]) for k in packed}) > 1:
        raise ValueError("run_pack: the packable trials differ in what a pack shares (source, "
                         "shape, batch, masking, optimizer or checkpoint steps); group them "
                         "with group_packs")
    alone = [k for k in range(len(cfgs)) if results[k] is None and k not in packed]
    if len(packed) == 1:  # a pack of one is its trial
        alone, packed = sorted([*alone, *packed]), []
    for k in alone:
        results[k] = _alone(cfgs[k], out_dirs[k], reports[k], device, progress, eval_cache,
                            on_progress)
    if packed:
        trained = _train_measured([cfgs[k] for k in packed], [out_dirs[k] for k in packed],
                                  [reports[k] for k in packed],
                                  Runtime(device, progress, eval_cache), on_progress, on_round,
                                  batched_measure)
        for k, result in zip(packed, trained, strict=True):
            results[k] = result
    return results


def _alone(cfg, out_dir, report, device, progress, eval_cache, on_progress) -> MemberResult:
    try:
        return run_trial_once(cfg, out_dir, report, device=device, progress=progress,
                              eval_cache=eval_cache, on_progress=on_progress)
    except Diverged as e:  # recorded by run_trial_once
        return e


def _train_measured(cfgs, out_dirs, reports, runtime: Runtime, on_progress, on_round,
                    batched_measure) -> list[MemberResult]:
    """The pack: every member validated and its measuring side built, then trained together."""
    source, model_cfg = validate_trial(cfgs[0])
    cfgs = [with_downstream_resolved(c, source) for c in cfgs]
    for cfg in cfgs[1:]:
        validate_trial(cfg, source)
    steps = max(c.train.steps for c in cfgs)
    checkpoints = sorted({s for c in cfgs for s in c.train.checkpoint_steps})
    watch = TrialProgress(steps, checkpoints, on_progress or (lambda snapshot: None))
    with contextlib.ExitStack() as stack:
        for d in out_dirs:  # every member's directory ours before any work
            stack.enter_context(writer_lock(d))
        measurers = _measurers(cfgs, source, model_cfg, out_dirs, reports, runtime, watch)
        hooks, after_round = measurers, on_round
        if batched_measure:  # the hooks record; each round is measured as one problem
            rounds = RoundMeasurer(measurers, runtime.device)
            hooks = [rounds.hook(k) for k in range(len(measurers))]
            after_round = _chained(rounds.flush, on_round)
        for m, hook in zip(measurers, hooks, strict=True):
            m.catch_up(hook)
        if after_round is not None:
            after_round()
        trained = train_pack([c.train for c in cfgs], source, model_cfg, out_dirs,
                             device=runtime.device, on_checkpoint=hooks,
                             progress=runtime.progress,
                             resume=True, on_step=watch.stepped,
                             on_round=None if after_round is None else lambda step: after_round(),
                             resume_before=[m.retrain_from() for m in measurers])
    results: list[MemberResult] = []
    for d, m, outcome in zip(out_dirs, measurers, trained, strict=True):
        if isinstance(outcome, Diverged):
            record_divergence(d, outcome)
            results.append(outcome)
        else:
            results.append(m.done)
    return results


def _chained(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
    def both() -> None:
        first()
        if then is not None:
            then()
    return both


def _measurers(cfgs, source, model_cfg, out_dirs, reports, runtime: Runtime,
               watch) -> list[TrialMeasurer]:
    """One ``TrialMeasurer`` per member; members measured alike share their evaluation data."""
    shared: dict[str, TrialMeasurer] = {}
    measurers = []
    for cfg, d, report in zip(cfgs, out_dirs, reports, strict=True):
        key = json.dumps(to_dict(cfg.measure), sort_keys=True, default=str)
        data = shared[key].data if key in shared else None
        m = TrialMeasurer(cfg, source, model_cfg, d, report, runtime=runtime, watch=watch,
                          data=data)
        shared.setdefault(key, m)
        measurers.append(m)
    return measurers
