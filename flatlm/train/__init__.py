"""Masked-LM pre-training: one run = source + model + algorithm + schedule + steps + checkpoints.

- ``registry``: one ``Algorithm`` per algorithm (defaults, config section, update, data-parallel
  update, batch transform, hooks); ``register_algorithm`` adds one. The tables below are views.
- ``config``: ``TrainConfig`` (every field commented), ``ALGORITHMS`` (each one's defaults),
  ``resolve``.
- ``algorithms``: ``build_optimizer`` and the updates ``standard_step``, ``sam_step``,
  ``adversarial_step`` (``STEPS``), ``ridge_head_loss``.
- ``data``: batch streams whose position is one integer, masking, the adversarial D pool.
- ``growth``: algorithm "grow", the model replaced by its function-preserving embedding mid-run.
- ``label_noise``: algorithm "label_noise", SGD on targets replaced by uniform words.
- ``muon``: algorithm "muon", torch's Muon on the encoder's hidden matrices and AdamW on the
  rest as one optimizer (``MuonWithAdamW``), its settings ``train.muon.*`` (``MuonConfig``).
- ``state``: ``TrainState`` and the checkpoint layout ``OUT/checkpoints/step-<N>/``.
- ``run``: ``Run``, a run in progress, shared by the loop and the data-parallel ranks.
- ``errors``: ``Diverged`` and ``CheckpointWriteError``, what a run raises and its callers
  catch (``run`` re-exports them; importing them loads no torch).
- ``loop``: ``train(cfg, source, model_cfg, out_dir, *, device, on_checkpoint, ...)``.
- ``sizes``: ``check_fits``, what a run holds checked against memory before it allocates.
- ``distributed``: ``train.world_size`` processes sharing every update (``DATA_PARALLEL_STEPS``).
- ``pack``: ``train_pack(cfgs, source, model_cfg, out_dirs, ...)``, K runs of one shape trained
  as one model with a member axis (``flatlm.models.packed``), each member its own run, equal to
  it alone bit for bit on the CPU; ``pack_steps`` (the packed updates, ``Algorithm.packed_step``)
  and ``packed_optim`` (the members' AdamW / SGD as one step).
"""

from __future__ import annotations

import importlib

# name -> submodule, imported lazily: ``flatlm.train.config`` is read when sweep configs are
# parsed and should not pay for importing torch and transformers.
_EXPORTS = {
    "registry": "Algorithm AlgorithmDefaults register_algorithm",
    "config": "ALGORITHMS AdversarialConfig GrowConfig LabelNoiseConfig SamConfig TrainConfig "
              "resolve",
    "algorithms": "STEPS build_optimizer ridge_head_loss sentence_features",
    "state": "TrainState checkpoint_dir find_checkpoints newest_checkpoint",
    "loop": "TrainResult train",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'flatlm.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flatlm.train.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
