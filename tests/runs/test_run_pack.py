"""A packed trial (flatlm.runs.pack.run_pack) writes each member's directory as run_trial writes
its trial's: every metric but the timings equal bit for bit on the CPU (``==`` on every float,
tolerance 0), every checkpoint's metrics.json and the training log too; a resumed pack equals one
that never stopped; a diverging member stops alone with its diverged.json; a trial that cannot
be packed runs alone, its reason logged; grouping keeps packs to one shape and at most K. The
same holds with ``batched_measure`` (the members' loss measured in one batched forward)."""

import json
import logging
import shutil

import pytest

from flatlm.core.config import apply_overrides
from flatlm.measure.packed_loss import packed_pretrain_loss
from flatlm.runs import pack_measure
from flatlm.runs.pack import check_pack_request, group_packs, run_pack, unpacked_reason
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.storage.diverged import DIVERGED_FILE, divergence
from flatlm.storage.metrics_log import TRAIN_LOG_FILE, read_metrics
from flatlm.train.run import Diverged

TINY = {
    "source": '{"kind":"pcfg","random":{"vocab":12,"depth":2,"nonterminals_per_level":3,'
              '"roots":2},"seed":0}',
    "model": "d16-h2-l1-i32",
    "train.batch_size": 16, "train.warmup_steps": 2, "train.steps": 4,
    "train.checkpoint_steps": [0, 2, 4], "train.log_every": 1,
    "measure.n_eval": 64, "measure.n_downstream": 40, "measure.tasks": ["B"],
    "measure.probe.epochs": 3, "measure.probe.seeds": 2,
    "measure.flatness.batch_size": 32, "measure.flatness.hutchinson_batch_size": 16,
}
# members differ in seed, rate and algorithm (noreg: no dropout, no weight decay)
MEMBERS = ({"train.seed": 1}, {"train.seed": 2, "train.lr": 3e-3},
           {"train.seed": 3, "train.algorithm": "noreg"})


def tiny(**overrides) -> TrialConfig:
    return apply_overrides(TrialConfig(), {**TINY, **overrides})


def _untimed(rows: dict[int, dict]) -> dict[int, dict]:
    return {s: {k: v for k, v in r.items() if not k.startswith("time/")} for s, r in rows.items()}


def _assert_same_directory(member, alone):
    """The member's files are the trial's: config, metrics (less timings), training log, each
    checkpoint's metrics.json and the checkpoint steps."""
    assert (member / "config.json").read_text() == (alone / "config.json").read_text()
    assert _untimed(read_metrics(member)) == _untimed(read_metrics(alone))
    assert ([_without_time(line) for line in (member / TRAIN_LOG_FILE).open()]
            == [_without_time(line) for line in (alone / TRAIN_LOG_FILE).open()])
    steps = sorted(p.name for p in (alone / "checkpoints").iterdir())
    assert sorted(p.name for p in (member / "checkpoints").iterdir()) == steps
    for step in steps:
        a, b = (json.loads((d / "checkpoints" / step / "metrics.json").read_text())
                for d in (member, alone))
        assert _untimed({0: a}) == _untimed({0: b})


def _without_time(line: str) -> dict:
    row = json.loads(line)
    return {k: v for k, v in row.items() if not k.startswith("time/")}


def test_each_member_measures_as_its_trial_alone(tmp_path):
    cfgs = [tiny(**m) for m in MEMBERS]
    seen = [[] for _ in cfgs]
    reports = [lambda s, m, d, k=k: seen[k].append(s) for k in range(len(cfgs))]
    packed = run_pack(cfgs, [tmp_path / f"m{k}" for k in range(3)], reports)
    for k, cfg in enumerate(cfgs):
        alone = run_trial(cfg, tmp_path / f"alone{k}")
        assert _untimed(packed[k]) == _untimed(alone)
        assert seen[k] == [0, 2, 4]
        assert {"pretrain/kl", "flat/trace_fisher", "flat/trace_hessian",
                "probe/B/acc_mean"} <= set(alone[4])
        _assert_same_directory(tmp_path / f"m{k}", tmp_path / f"alone{k}")


class StopError(Exception):
    pass


@pytest.mark.parametrize("batched", [False, True])
def test_a_resumed_pack_equals_one_that_never_stopped(tmp_path, batched):
    """The process stops in member 0's report of step 2 (member 1's step 2 not yet measured;
    ``batched``: after the round's batched loss); the rerun measures what is missing (batched:
    member 1's step 2 as a round) and trains on."""
    cfgs = [tiny(**m) for m in MEMBERS[:2]]
    straight = run_pack(cfgs, [tmp_path / "a0", tmp_path / "a1"])

    def stop_at_2(step, metrics, ckpt):
        if step == 2:
            raise StopError

    dirs = [tmp_path / "b0", tmp_path / "b1"]
    with pytest.raises(StopError):
        run_pack(cfgs, dirs, [stop_at_2, None], batched_measure=batched)
    assert sorted(read_metrics(dirs[1])) == [0]  # its step 2 left unmeasured
    resumed = run_pack(cfgs, dirs, batched_measure=batched)
    for k in range(2):
        assert _untimed(resumed[k]) == _untimed(straight[k])
        _assert_same_directory(dirs[k], tmp_path / f"a{k}")


def test_a_diverging_member_stops_alone_with_its_record(tmp_path):
    diverging = {"train.algorithm": "sgd", "train.lr": 1e4, "train.warmup_steps": 0,
                 "train.divergence_factor": 2.0, "train.steps": 8,
                 "train.checkpoint_steps": [0, 8], "measure.what": ["loss"]}
    cfgs = [tiny(**{**diverging, "train.lr": 0.1, "train.seed": 1}),
            tiny(**{**diverging, "train.seed": 2}), tiny(**{**diverging, "train.lr": 0.05})]
    dirs = [tmp_path / f"m{k}" for k in range(3)]
    packed = run_pack(cfgs, dirs)
    with pytest.raises(Diverged) as alone:
        run_trial(cfgs[1], tmp_path / "alone1")
    assert isinstance(packed[1], Diverged) and str(packed[1]) == str(alone.value)
    assert divergence(dirs[1])["step"] == alone.value.step
    assert sorted(read_metrics(dirs[1])) == [0]
    for k in (0, 2):
        assert not (dirs[k] / DIVERGED_FILE).exists()
        assert _untimed(packed[k]) == _untimed(run_trial(cfgs[k], tmp_path / f"alone{k}"))
    again = run_pack(cfgs, dirs)  # a rerun: the diverged member is not trained again
    assert isinstance(again[1], Diverged) and again[1].step == alone.value.step


def test_an_unpackable_trial_runs_alone_with_its_reason_logged(tmp_path, caplog):
    grow = tiny(**{"train.algorithm": "grow", "train.grow.steps": [2],
                   "train.grow.to": ["d32-h4-l2-i64"], "measure.what": ["loss"]})
    plain = tiny(**{"measure.what": ["loss"]})
    assert "cannot" not in (unpacked_reason(grow) or "") and "shape" in unpacked_reason(grow)
    assert unpacked_reason(plain) is None
    with caplog.at_level(logging.WARNING, logger="flatlm.runs.pack"):
        packed = run_pack([plain, grow], [tmp_path / "p", tmp_path / "g"])
    assert "g runs unpacked: train.algorithm=grow" in caplog.text
    alone = run_trial(grow, tmp_path / "alone")
    assert _untimed(packed[1]) == _untimed(alone)
    check_pack_request([plain, grow], 1)  # no packing asked for: nothing to refuse
    with pytest.raises(ValueError, match=r"--pack 2: train.algorithm=grow cannot be packed "
                                         r"\(the model's shape changes.*--pack 1"):
        check_pack_request([plain, grow], 2)


def test_packs_group_one_shape_at_most_k_and_refuse_a_bad_k():
    cfgs = [tiny(**{"train.seed": s}) for s in range(5)]
    other = tiny(**{"model": "d32-h2-l1-i64"})
    lstm = tiny(**{"model": "lstm-h16-l1"})
    assert group_packs([*cfgs, other, lstm], 2) == [[0, 1], [2, 3], [4], [5], [6]]
    assert group_packs(cfgs, 1) == [[k] for k in range(5)]
    assert "post-LN" in unpacked_reason(lstm)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--pack"):
            group_packs(cfgs, bad)


def test_members_of_two_shapes_are_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="group_packs"):
        run_pack([tiny(), tiny(**{"model": "d32-h2-l1-i64"})], [tmp_path / "a", tmp_path / "b"])
    assert not (tmp_path / "a").exists()


def test_a_finished_member_is_not_trained_again(tmp_path):
    cfgs = [tiny(**m) for m in MEMBERS[:2]]
    dirs = [tmp_path / "a", tmp_path / "b"]
    first = run_pack(cfgs, dirs)
    shutil.rmtree(dirs[1])  # member 1 starts again, member 0 is done
    again = run_pack(cfgs, dirs)
    assert _untimed(again[0]) == _untimed(first[0]) and _untimed(again[1]) == _untimed(first[1])


def test_a_batched_round_measures_each_member_as_its_trial_alone(tmp_path, monkeypatch):
    """``batched_measure``: the loss of all members in one forward, the rest member by member;
    every metric but the timings equals the per-member pack's (and so the trial's alone), bit
    for bit. Member 2 measures only the loss on other data (its own problem in the round)."""
    cfgs = [tiny(**MEMBERS[0]), tiny(**MEMBERS[1]),
            tiny(**{**MEMBERS[2], "measure.what": ["loss"], "measure.seed": 1})]
    seen = [[] for _ in cfgs]
    reports = [lambda s, m, d, k=k: seen[k].append((s, m["pretrain/kl"])) for k in range(3)]
    problems = []  # the members of each batched loss

    def counted(models, *args, **kwargs):
        problems.append(len(models))
        return packed_pretrain_loss(models, *args, **kwargs)

    monkeypatch.setattr(pack_measure, "packed_pretrain_loss", counted)
    batched = run_pack(cfgs, [tmp_path / f"b{k}" for k in range(3)], reports,
                       batched_measure=True)
    assert problems == [2, 1] * 3  # at steps 0, 2, 4: members 0 and 1 as one, member 2 alone
    one_by_one = run_pack(cfgs, [tmp_path / f"m{k}" for k in range(3)])
    for k in range(3):
        assert _untimed(batched[k]) == _untimed(one_by_one[k])
        assert [s for s, _ in seen[k]] == [0, 2, 4]
        assert [kl for _, kl in seen[k]] == [one_by_one[k][s]["pretrain/kl"] for s in (0, 2, 4)]
        assert batched[k][4]["time/loss_s"] <= batched[k][4]["time/measure_s"]
        _assert_same_directory(tmp_path / f"b{k}", tmp_path / f"m{k}")
    assert "probe/B/acc_mean" in batched[0][4] and "flat/trace_fisher" not in batched[2][4]
