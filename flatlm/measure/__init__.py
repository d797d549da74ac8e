"""Measurements of a pre-trained masked LM; every metric key and its definition lives here.

Keys are ``<stage>/<quantity>[_<stat>]``. Each estimate comes with its standard error (``_se``).

Pre-training (exact on a synthetic source, over a validation set; see ``measure.loss``):
    pretrain/loss       cross-entropy of the model at masked positions (nats) =
                        pretrain/entropy + pretrain/kl
    pretrain/entropy    mean entropy of the true conditional Pr(. | x_{-t})
    pretrain/kl         mean KL(Pr(. | x_{-t}) || p_theta(. | x_{-t}))
    pretrain/loss_data  mean one-hot -log p_theta(x_t | x_{-t}) of the data's words (the usual
                        validation loss; same expectation as pretrain/loss, higher variance)
Flatness (see ``measure.flatness``):
    flat/trace_fisher   Tr(F) = E_{x_{-t}} E_{c ~ p_theta} ||grad_theta log p_theta(c | x_{-t})||^2
    flat/trace_hessian  Tr of the Hessian of the population loss (labels = the true conditional)
    flat/trace_hessian_data   Tr of the Hessian of the loss with one-hot data labels
    flat/hessian_fisher_gap   flat/trace_hessian - flat/trace_fisher
    flat/<quantity>_grown     the same of the model grown into one common shape (``measure.grown``,
                        ``MeasureConfig.grow_to``), so that models of different sizes are compared
                        in one parameterisation (paper Fig. 5, B.3-B.4)
Downstream (see ``measure.probe``, ``measure.finetune``, ``measure.lookup``):
    probe/<task>/acc_mean, probe/<task>/acc_std   linear probe on frozen features, over seeds
    finetune/<task>/acc_mean, finetune/<task>/acc_std
    lookup/<task>/acc, lookup/<task>/acc_std   linear probe on the concatenated true
                        conditionals of every position (the paper's "lookup table")
"""

LOSS = "pretrain/loss"
ENTROPY = "pretrain/entropy"
KL = "pretrain/kl"
LOSS_DATA = "pretrain/loss_data"
TRACE_FISHER = "flat/trace_fisher"
TRACE_HESSIAN = "flat/trace_hessian"
TRACE_HESSIAN_DATA = "flat/trace_hessian_data"
HESSIAN_FISHER_GAP = "flat/hessian_fisher_gap"
TRACE_FISHER_GROWN = "flat/trace_fisher_grown"
TRACE_HESSIAN_GROWN = "flat/trace_hessian_grown"


def se_key(key: str) -> str:
    """The standard-error twin of a metric key: ``pretrain/kl`` -> ``pretrain/kl_se``."""
    return f"{key}_se"


def grown_key(key: str) -> str:
    """The key of a flatness metric measured in the grown shape: ``flat/trace_fisher`` ->
    ``flat/trace_fisher_grown``."""
    return f"{key}_grown"


def probe_keys(task: str) -> tuple[str, str]:
    return f"probe/{task}/acc_mean", f"probe/{task}/acc_std"


def finetune_keys(task: str) -> tuple[str, str]:
    return f"finetune/{task}/acc_mean", f"finetune/{task}/acc_std"


def lookup_key(task: str) -> str:
    return f"lookup/{task}/acc"
