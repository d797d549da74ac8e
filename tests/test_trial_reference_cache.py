"""Two trials of a sweep sharing an eval cache: the second reads the first's reference rows."""

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial

TINY = {
    "source": '{"kind":"pcfg","random":{"vocab":12,"depth":2,"nonterminals_per_level":3,'
              '"roots":2},"seed":0}',
    "model": "d16-h2-l1-i32", "train.batch_size": 16, "train.warmup_steps": 2,
    "train.steps": 2, "train.checkpoint_steps": [2],
    "measure.what": ["loss", "probe", "lookup"], "measure.n_eval": 32,
    "measure.n_downstream": 40, "measure.tasks": ["B"], "measure.probe.epochs": 3,
    "measure.probe.seeds": 2,
}


def test_the_second_trial_of_a_sweep_reads_the_reference_rows(tmp_path):
    cache = tmp_path / "eval_cache"
    first = run_trial(apply_overrides(TrialConfig(), TINY), tmp_path / "a", eval_cache=cache)[2]
    other_seed = apply_overrides(TrialConfig(), {**TINY, "train.seed": 1})
    second = run_trial(other_seed, tmp_path / "b", eval_cache=cache)[2]
    reference = [k for k in first if k.startswith(("random_init", "lookup"))]
    assert reference and all(second[k] == first[k] for k in reference)
    assert second["pretrain/kl"] != first["pretrain/kl"]  # another model, the same references
    assert len(list(cache.glob("reference-*.json"))) == 2
