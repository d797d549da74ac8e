"""Fine-tuning learns an easy task, is fixed by its seeds and leaves the pre-trained model alone."""

import pytest
import torch

from flatlm.core.schedules import learning_rate as finetune_lr
from flatlm.measure import finetune_keys
from flatlm.measure.probes.finetune import FinetuneConfig, finetune_accuracy
from flatlm.models import build_model, parse_model

FAST = FinetuneConfig(lr=3e-3, warmup_steps=10, epochs=5, seeds=2)
TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                        "roots": 2}, "seed": 0}  # 2-4 words; 1548 sentences




class FirstWordSource:
    """Sentences of 4 i.i.d. words out of 4; the label is whether the first word is 2 or 3."""

    V, max_length, tasks = 4, 4, ("first",)

    def sample(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 4, (n, 4), generator=g), torch.full((n,), 4)

    def labels(self, tokens, lengths, task):
        return (tokens[:, 0] >= 2).long()

    def num_classes(self, task):
        return 2


@pytest.fixture
def model():
    return build_model(parse_model("d16-h2-l1-i32"), 4, 4, seed=0)


def test_finetuning_learns_an_easy_task_far_above_chance(model):
    src = FirstWordSource()
    tokens, lengths = src.sample(400, seed=0)
    out = finetune_accuracy(model, src, tokens, lengths, src.labels(tokens, lengths, "first"),
                            "first", FAST)
    mean_key, std_key = finetune_keys("first")
    assert set(out) == {mean_key, std_key}
    assert out[mean_key] >= 0.9  # chance 0.5


def test_seeds_fix_the_result_and_the_pretrained_model_is_untouched(model):
    src = FirstWordSource()
    tokens, lengths = src.sample(60, seed=1)
    labels = torch.randint(0, 2, (60,), generator=torch.Generator().manual_seed(2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    cfg = FinetuneConfig(lr=1e-3, warmup_steps=2, epochs=1, seeds=2, batch_size=16)
    a = finetune_accuracy(model, src, tokens, lengths, labels, "first", cfg)
    assert a == finetune_accuracy(model, src, tokens, lengths, labels, "first", cfg)
    assert torch.equal(rng, torch.get_rng_state()) and model.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_pcfg_task_with_undefined_labels_runs(src):
    model = build_model(parse_model("d16-h2-l1-i32"), src.V, src.max_length, seed=0)
    tokens, lengths = src.sample(40, seed=3)
    cfg = FinetuneConfig(epochs=1, seeds=1, batch_size=16)
    out = finetune_accuracy(model, src, tokens, lengths, src.labels(tokens, lengths, "B"), "B",
                            cfg)
    assert 0.0 <= out["finetune/B/acc_mean"] <= 1.0 and out["finetune/B/acc_std"] == 0.0


# step: 0     1     2     3     4     5     6     7     (warmup 4, 8 updates, peak 1)
LINEAR = [0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 0.5, 0.25]
CONSTANT = [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("schedule", "table"), [("linear", LINEAR), ("constant", CONSTANT)])
def test_schedule_table(schedule, table):
    got = [finetune_lr(s, peak=1.0, warmup_steps=4, total_steps=8, schedule=schedule)
           for s in range(8)]
    assert got == pytest.approx(table)
    # warmup longer than the run: the rate never reaches the peak
    assert finetune_lr(2, peak=1.0, warmup_steps=200, total_steps=3, schedule=schedule) == 0.015


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="schedule"):
        FinetuneConfig(schedule="cosine")
    with pytest.raises(ValueError, match="test_fraction"):
        FinetuneConfig(test_fraction=0.0)
