"""TrainConfig: defaults per algorithm, and bad fields rejected up front with the field named."""

import dataclasses
import json

import pytest

from flatlm.core.config import ConfigError, apply_overrides, from_dict, to_dict, to_flat_dict
from flatlm.train import ALGORITHMS, AdversarialConfig, SamConfig, TrainConfig, resolve, train


@pytest.mark.parametrize(("algorithm", "weight_decay", "dropout", "warmup"), [
    ("adamw", 0.01, 0.1, 1000),  # A.5: dropout 0.1, weight decay 0.01, 1000 warmup steps
    ("sgd", 0.01, 0.1, 1200),  # warmup over 12% of the 10,000 steps
    ("noreg", 0.0, 0.0, 1000),
    ("sam", 0.0, 0.0, 1000),  # the paper runs SAM without dropout and weight decay
    ("adversarial", 0.01, 0.1, 1000),
])
def test_algorithm_defaults(algorithm, weight_decay, dropout, warmup):
    cfg = resolve(TrainConfig(algorithm=algorithm, steps=10_000))
    assert (cfg.weight_decay, cfg.dropout, cfg.warmup_steps) == (weight_decay, dropout, warmup)
    assert (cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.batch_size) == (1e-3, 0.9, 0.98, 1e-6, 4096)


def test_explicit_values_override_the_defaults():
    cfg = resolve(TrainConfig(algorithm="noreg", steps=200, weight_decay=0.1, dropout=0.2,
                              warmup_proportion=0.06))
    assert (cfg.weight_decay, cfg.dropout, cfg.warmup_steps) == (0.1, 0.2, 12)


def test_checkpoint_steps_are_sorted_and_unique():
    assert TrainConfig(steps=10, checkpoint_steps=[10, 0, 5, 5]).checkpoint_steps == (0, 5, 10)


@pytest.mark.parametrize(("fields", "named"), [
    ({"algorithm": "adam"}, "train.algorithm='adam'"),
    ({"lr": -1e-3}, "train.lr=-0.001"),
    ({"lr": 0.0}, "train.lr=0.0"),
    ({"steps": 10, "checkpoint_steps": (0, 11)}, "train.checkpoint_steps"),
    ({"checkpoint_steps": (-1,)}, "train.checkpoint_steps"),
    ({"steps": 0}, "train.steps=0"),
    ({"batch_size": 64, "micro_batch_size": 10}, "train.micro_batch_size=10"),
    ({"algorithm": "sam", "batch_size": 64, "micro_batch_size": 64}, "train.micro_batch_size"),
    ({"algorithm": "sam", "batch_size": 7}, "train.batch_size=7"),
    ({"beta2": 1.0}, "train.beta2=1.0"),
    ({"eps": 0.0}, "train.eps"),
    ({"weight_decay": -0.1}, "train.weight_decay"),
    ({"dropout": 1.0}, "train.dropout"),
    ({"warmup_steps": 10, "warmup_proportion": 0.1}, "train.warmup_steps"),
    ({"warmup_proportion": 1.5}, "train.warmup_proportion"),
    ({"mask": "all"}, "train.mask='all'"),
    ({"mask": 1.5}, "train.mask=1.5"),
    ({"precision": "fp16"}, "train.precision"),
    ({"prefetch": -1}, "train.prefetch=-1"),
    ({"prefetch": "some"}, "train.prefetch='some'"),
    ({"prefetch_workers": "fork"}, "train.prefetch_workers='fork'"),
])
def test_bad_fields_are_named(fields, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")):
        TrainConfig(**fields)


@pytest.mark.parametrize(("fields", "named"), [
    ({"sam.rho": 0.0}, "train.sam.rho=0.0"),
    ({"adversarial.d1": 256, "adversarial.d2": 256, "adversarial.pool": 100},
     "train.adversarial.pool=100"),
    ({"adversarial.lambda": -1.0}, "train.adversarial.lambda=-1.0"),
    ({"adversarial.d1": 1}, "train.adversarial.d1=1"),
    ({"adversarial.ridge": 0.0}, "train.adversarial.ridge=0.0"),
])
def test_bad_algorithm_settings_are_named(fields, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        apply_overrides(TrainConfig(), fields)


def test_every_field_is_a_documented_algorithm_input():
    assert set(ALGORITHMS) == {"adamw", "sgd", "noreg", "sam", "adversarial", "grow",
                               "label_noise", "muon"}
    cfg = TrainConfig(steps=5, checkpoint_steps=(5,),
                      sections={"sam": SamConfig(rho=0.1),
                                "adversarial": AdversarialConfig(lambda_=0.5, task="C")})
    assert from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg
    assert to_dict(cfg)["adversarial"]["lambda"] == 0.5


def test_train_rejects_an_unknown_preset_before_writing(src, tmp_path):
    with pytest.raises(ValueError, match="model 'bert-3m' is neither a preset"):
        train(TrainConfig(steps=2), src, "bert-3m", tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_train_rejects_an_unknown_task_before_writing(src, tiny_model, tmp_path):
    cfg = TrainConfig(algorithm="adversarial", steps=2, batch_size=8,
                      sections={"adversarial": AdversarialConfig(task="Z", d1=8, d2=8, pool=64)})
    with pytest.raises(ValueError, match="train.adversarial.task='Z'"):
        train(cfg, src, tiny_model, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_train_rejects_a_missing_corpus(src, tiny_model, tmp_path):
    cfg = dataclasses.replace(TrainConfig(steps=2), data=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="train.data="):
        train(cfg, src, tiny_model, tmp_path / "run", progress=False)


def test_algorithm_settings_by_dotted_keys():
    cfg = apply_overrides(TrainConfig(), {"sam.rho": "0.1", "adversarial.lambda": "2",
                                          "adversarial.task": "C"})
    assert cfg.settings("sam") == SamConfig(rho=0.1)
    assert cfg.settings("adversarial") == AdversarialConfig(lambda_=2.0, task="C")
    flat = to_flat_dict(cfg)
    assert flat["sam.rho"] == 0.1 and flat["adversarial.lambda"] == 2.0
    with pytest.raises(ConfigError, match=r"train\.adversarial\.pool=10: use at least"):
        apply_overrides(cfg, {"adversarial.pool": 10})


@pytest.mark.parametrize(("old", "new"), [
    ("sam_rho", "sam.rho"), ("adversarial_lambda", "adversarial.lambda"),
    ("adversarial_pool", "adversarial.pool"), ("adversarial_task", "adversarial.task"),
])
def test_old_flat_keys_name_the_new_key(old, new):
    with pytest.raises(ConfigError, match=f"'{old}' was renamed: use '{new}'"):
        apply_overrides(TrainConfig(), {old: "1"})


def test_a_checkpoint_saved_with_the_old_flat_keys_still_resumes(src, tiny_model, tmp_path):
    from flatlm.train.state import load_state, newest_checkpoint, save_state

    cfg = TrainConfig(algorithm="sam", steps=4, batch_size=8, checkpoint_steps=(2,),
                      sections={"sam": SamConfig(rho=0.1)})
    train(dataclasses.replace(cfg, steps=2), src, tiny_model, tmp_path, progress=False)
    ckpt = newest_checkpoint(tmp_path)
    (ckpt / "manifest.json").unlink()  # an old checkpoint: written before manifests
    state = load_state(ckpt)
    old = {k: v for k, v in state.config.items() if k not in ("sam", "adversarial")}
    old.update({"sam_rho": 0.1, **{f"adversarial_{k}": v  # an old run wrote every section
                                   for k, v in to_dict(AdversarialConfig()).items()}})
    save_state(dataclasses.replace(state, config=old), ckpt)
    assert train(cfg, src, tiny_model, tmp_path, progress=False, resume=True).step == 4
    old["sam_rho"] = 0.2  # a real change is still caught, under its new name
    save_state(dataclasses.replace(state, config=old), ckpt)
    with pytest.raises(ValueError, match=r"train\.sam\.rho=0\.2 -> 0\.1"):
        train(cfg, src, tiny_model, tmp_path, progress=False, resume=True)
