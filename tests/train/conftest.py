"""Shared tiny setting for the training tests: a 12-word random PCFG and a one-layer BERT."""

import contextlib
import importlib
import sys

import pytest

from flatlm.measure.loss import kl_to_truth
from flatlm.sources import load
from flatlm.train import train
from flatlm.train.data import generator, mask_batch
from flatlm.train.registry import REGISTRY


@pytest.fixture(scope="session")
def src():
    """Sentences of 2-4 words over 12 words; tasks A (2 classes), B, C."""
    return load({"kind": "pcfg", "random": {"vocab": 12, "depth": 2, "nonterminals_per_level": 3,
                                            "roots": 2}, "seed": 0})


@pytest.fixture(scope="module")
def paper():
    """The paper's grammar: sentences of 2..16 words (4..18 slots), so that a batch has padding
    to trim (``train.unpad``) or to pack away (``train.sequence_packing``)."""
    return load("pcfg:paper")


def masked_sample(src, n, seed, mask="one", max_predictions=None):
    """(batch, lengths): ``n`` sentences of ``src`` drawn by ``seed`` and masked as BERT masks
    (80% [MASK], 10% a random word, 10% kept), the draws seeded by ``seed`` too."""
    tokens, lengths = src.sample(n, seed)
    batch = mask_batch(tokens, lengths, mask, generator(seed, "mask", 0), n_words=src.V,
                       replace=(0.8, 0.1, 0.1), max_predictions=max_predictions)
    return batch, lengths


@pytest.fixture(scope="session")
def tiny_model():
    return "d32-h2-l1-i64"


@pytest.fixture(scope="session")
def eval_sentences(src):
    """Held-out sentences for KL(truth || model), drawn with a seed no run uses."""
    return src.sample(256, seed=10_000)


def assert_learns(cfg, src, model: str, eval_sentences, out) -> None:
    """Training ``model`` under ``cfg`` at least halves KL(truth || model) on ``eval_sentences``
    from its first checkpoint to its last, and lowers the training loss."""
    kl = {}
    result = train(cfg, src, model, out, progress=False,
                   on_checkpoint=lambda step, trained, _: kl.update(
                       {step: kl_to_truth(trained, src, *eval_sentences)}))
    assert kl[cfg.checkpoint_steps[-1]] < 0.5 * kl[cfg.checkpoint_steps[0]], kl
    assert result.history[-1]["train/loss"] < result.history[0]["train/loss"]


class Stopped(Exception):  # noqa: N818 - what the hook does, as a name
    """Raised by a ``stop_at`` hook: the process dying right after writing a checkpoint."""


@pytest.fixture(scope="session")
def stop_at():
    """``stop_at(step)``: a checkpoint hook raising ``stop_at.Stopped`` right after checkpoint
    ``step`` is written (on a data-parallel run, rank 0 dies there)."""
    def hook_for(step):
        def hook(s, model, ckpt_dir):
            if s == step:
                raise Stopped
        return hook

    hook_for.Stopped = Stopped
    return hook_for


@contextlib.contextmanager
def plugin_algorithm(module: str):
    """The plug-in module ``module``, imported as a user's code would (which registers its
    algorithm); the registry is put back after, so that the other tests see the built-in table."""
    saved = dict(REGISTRY)
    sys.modules.pop(module, None)
    try:
        yield importlib.import_module(module)
    finally:
        REGISTRY.clear()
        REGISTRY.update(saved)
        sys.modules.pop(module, None)
