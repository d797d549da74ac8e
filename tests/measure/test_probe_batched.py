"""The batched probe trains the heads the per-task probe trains: every task x seed x feature set
against ``probe.train_heads`` / ``linear_probe_accuracy`` one task at a time.

Tolerance: weights within 1e-5 (absolute; float32 weights of size ~0.1-1) after training, and
the same accuracies. The two differ only in rounding order (one GEMM over the tasks' classes side
by side instead of one per task, the softmax gradient written out, torch's fused AdamW kernel
instead of its per-tensor one, W stored transposed); on the bert-2m checkpoint of pcfg:paper
with the default probe (100 epochs, 5 seeds, 3 tasks, trained and random-init features) every
per-seed test and training accuracy, and so all 50 reported probe values, came out the same
(bench/results/checkpoint_cost_cpu.json, "probe_equality": largest difference 0)."""

import dataclasses

import pytest
import torch

from flatlm.measure.probes.probe import ProbeConfig, linear_probe_accuracy, train_heads
from flatlm.measure.probes.probe_batched import Task, probe_feature_sets, train_heads_batched

CFG = ProbeConfig(epochs=6, seeds=3, batch_size=16, warmup_steps=5, grad_clip=1.0)  # clips ~half


def _features(seed, n=90, D=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g)


def _labels(x, C, seed):
    """Classes a noisy linear function of the features decides: learnable, not separable."""
    g = torch.Generator().manual_seed(seed)
    scores = x @ torch.randn(x.shape[1], C, generator=g) + torch.randn(len(x), C, generator=g)
    return scores.argmax(1)


@pytest.mark.parametrize("changes", [{}, {"batch_size": None}, {"schedule": "linear",
                                                                 "batch_size": 32}],
                         ids=["minibatch", "full-batch", "linear-decay"])
def test_every_head_is_the_head_trained_alone(changes):
    cfg = dataclasses.replace(CFG, **changes)
    x = torch.stack([_features(0), _features(1)])  # (F=2, N, D): two feature sets
    y = torch.stack([_labels(x[0], 4, 2), _labels(x[1], 4, 3)])  # (K=2, N), 4 classes each
    seeds = [11, 12, 13]
    W, b, epochs = train_heads_batched(x, y, 4, seeds, cfg)
    assert W.shape == (2, 3, 2, 4, 12) and b.shape == (2, 3, 2, 4) and epochs is None
    for f in range(2):
        for k in range(2):
            W1, b1 = train_heads(x[f], y[k], 4, seeds, cfg)  # (S, D, C): the task alone
            torch.testing.assert_close(W[f, :, k].transpose(1, 2), W1, rtol=0, atol=1e-5)
            torch.testing.assert_close(b[f, :, k], b1, rtol=0, atol=1e-5)


def test_results_are_the_per_task_probes_for_every_task_and_feature_set():
    n = 150
    features = {"probe": _features(4, n), "random_init": _features(5, n),
                "lookup": _features(6, n, D=20)}  # another width: its own problem
    keep_b = torch.arange(n) % 5 != 0  # task B leaves some sentences out: its own split
    classes = {"A": _labels(features["probe"], 3, 7), "B": _labels(features["probe"], 4, 8),
               "C": _labels(features["lookup"], 4, 9)}
    keeps = {"A": torch.ones(n, dtype=torch.bool), "B": keep_b,
             "C": torch.ones(n, dtype=torch.bool)}
    tasks = [Task(t, keeps[t], classes[t][keeps[t]], c) for t, c in (("A", 3), ("B", 4),
                                                                       ("C", 4))]
    cfg = dataclasses.replace(CFG, seeds=2, project_dim=None)
    got = probe_feature_sets(features, tasks, cfg)
    for name, x in features.items():
        for task in tasks:
            alone = linear_probe_accuracy(x[task.keep], task.classes, task.num_classes, cfg)
            assert got[name][task.name] == alone, (name, task.name)


def test_early_stopping_keeps_each_heads_best_epoch_as_if_trained_alone():
    x = _features(10, n=200)[None]
    y = torch.stack([_labels(x[0], 4, 11), _labels(x[0], 4, 12)])
    cfg = dataclasses.replace(CFG, epochs=30, patience=3, lr=1e-2)
    val = (_features(13, n=60)[None], torch.stack([_labels(_features(13, n=60), 4, 11),
                                                    _labels(_features(13, n=60), 4, 12)]))
    W, b, epochs = train_heads_batched(x, y, 4, [1, 2, 3], cfg, val=val)
    assert epochs.shape == (1, 3, 2) and int(epochs.min()) >= 1 and int(epochs.max()) <= 30
    for k in range(2):  # one task alone, one seed alone: the same head, the same epoch
        W1, b1, e1 = train_heads_batched(x, y[k : k + 1], 4, [2], cfg,
                                         val=(val[0], val[1][k : k + 1]))
        assert int(e1[0, 0, 0]) == int(epochs[0, 1, k])
        torch.testing.assert_close(W1[0, 0, 0], W[0, 1, k], rtol=0, atol=1e-5)


def test_early_stopping_reports_its_epochs_and_fixed_epochs_stay_the_default():
    assert ProbeConfig().patience is None  # the paper's fixed epochs
    x = {"probe": _features(14, n=200)}
    task = Task("A", torch.ones(200, dtype=torch.bool), _labels(x["probe"], 3, 15), 3)
    fixed = probe_feature_sets(x, [task], CFG)["probe"]["A"]
    assert "epochs" not in fixed and fixed["n_train"] == 160
    stopped = probe_feature_sets(x, [task], dataclasses.replace(CFG, epochs=20, patience=2))
    result = stopped["probe"]["A"]
    assert 1 <= result["epochs"] <= 20 and result["n_train"] == 144  # 10% held out to stop


@pytest.mark.parametrize("kwargs, match", [
    ({"patience": 0}, "patience"), ({"patience": 3, "batched": False}, "patience"),
    ({"val_fraction": 1.0}, "val_fraction")])
def test_config_rejects_bad_early_stopping(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProbeConfig(**kwargs)
