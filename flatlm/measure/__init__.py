"""Measurements of a pre-trained masked LM; every metric key and its definition lives here.

Keys are ``<stage>/<quantity>[_<stat>]``. Each estimate comes with its standard error (``_se``).

Pre-training (exact on a synthetic source, over a validation set; see ``measure.loss``; on real
text, which has no truth, only pretrain/loss = pretrain/loss_data, the one-hot loss), per
token (every masked word weighs the same, as ``Source.entropy`` and the paper's code weigh them):
    pretrain/loss       cross-entropy of the model at masked positions (nats) =
                        pretrain/entropy + pretrain/kl
    pretrain/entropy    mean entropy of the true conditional Pr(. | x_{-t})
    pretrain/kl         mean KL(Pr(. | x_{-t}) || p_theta(. | x_{-t}))
    pretrain/loss_data  mean one-hot -log p_theta(x_t | x_{-t}) of the data's words (the usual
                        validation loss; same expectation as pretrain/loss, higher variance)
    pretrain/<q>_per_sentence   the same quantities with every sentence weighing the same
                        (the mean over its words first); differs from the per-token value when
                        the quantity varies with sentence length
Flatness (see ``measure.flatness``):
    flat/trace_fisher   Tr(F) = E_{x_{-t}} E_{c ~ p_theta} ||grad_theta log p_theta(c | x_{-t})||^2
    flat/trace_hessian  Tr of the Hessian of the population loss (labels = the true conditional)
    flat/trace_hessian_data   Tr of the Hessian of the loss with one-hot data labels
    flat/hessian_fisher_gap   flat/trace_hessian - flat/trace_fisher
    flat/<quantity>_grown     the same of the model grown into one common shape (``measure.grown``,
                        ``MeasureConfig.grow_to``), so that models of different sizes are compared
                        in one parameterisation (paper Fig. 5, B.3-B.4), by the construction
                        ``measure.growth_construction`` (default "paper", B.4.2; in the trial's
                        config.json)
    flat/<quantity>_grown_<construction>   the same by each construction of
                        ``measure.growth_compare`` ("-" written "_": ``_grown_head_norm``)
Curvature beyond the trace (``measure.spectrum``, ``measure.blocks``, ``measure.sharpness``), of
the population loss (labels = the true conditional) over the parameters flatness counts:
    flat/top_eig_hessian, flat/top_eig_fisher   lambda_max of H and of F over n masked inputs
                        (Lanczos with Hessian-vector products; s.e. by the delta method: the
                        spread over batches of u^T H_b u, u the top eigenvector)
    flat/slq_trace_hessian    Tr(H) from the stochastic Lanczos quadrature of the spectral
                        density (agrees with flat/trace_hessian within the s.e.; the density
                        itself is the artifact spectral_density.json / .png)
    flat/slq_negative_trace   sum of H's negative eigenvalues, from the same quadrature (its
                        non-convexity; <= 0)
    flat/blocks/<block>/trace_hessian   Tr(H_bb), the diagonal block of one parameter block
                        (embeddings, layer<i>, head); the blocks add up to flat/trace_hessian
    flat/sharpness_worst_<p>  adaptive worst-case sharpness (Andriushchenko et al., ICML 2023):
                        E_S max_{||delta / |w| ||_p <= rho} L_S(w + delta) - L_S(w), p = linf, l2,
                        over batches S of m inputs, by projected gradient ascent
    flat/sharpness_avg  adaptive average sharpness: the same with delta ~ N(0, rho^2 diag(w^2))
    flat/precond_sharpness    lambda_max(P^{-1} H), P = diag(sqrt(v_hat) + eps) from the
                        checkpoint's saved AdamW moments (``measure.precond``; Cohen et al. 2022);
                        NaN without Adam moments (SGD, step 0); s.e. by the delta method
    flat/precond_sharpness_x_lr   the same times the learning rate: Adam's stability threshold
                        is (2 + 2 beta1) / (1 - beta1) = 38 at beta1 = 0.9
    flat/precond_sharpness_ratio  flat/precond_sharpness over that threshold (1: at the edge)
    flat/critical_sharpness   2 / eta_c, eta_c the largest learning rate at which the
                        optimizer's next update does not raise the loss, from a quadratic fit of
                        the loss along the update (``measure.critical``; Kalra et al. 2026)
    flat/critical_step  eta_c
    flat/critical_sharpness_x_lr  flat/critical_sharpness times the learning rate (> 2: the
                        next update raises the loss)
    flat/update_curvature     d^T H d / ||d||^2 along the update direction d (the same fit)
Beyond curvature (``measure.noise``, ``measure.cka``):
    noise/loss_delta_<s>  the rise of pretrain/loss (KL to the truth) under per-tensor relative
                        Gaussian weight noise, W + s ||W||_F / sqrt(numel W) Z, mean over draws;
                        one key per scale s of measure.noise.scales, written "%g" (0.03)
    cka/truth           linear CKA (Kornblith et al. 2019) of the probe's features to the truth's
                        per-word parse posteriors (a PCFG's; an HMM's states), per sentence
    cka/truth_token     the same per real word: its final-layer state against its posterior
    cka/truth_random_init, cka/truth_token_random_init   the same of the random-init model
                        (reference rows, once per trial)
Local learning coefficient (``measure.llc``; Lau et al. 2023/2024), of the same population loss
L_n over n masked inputs, by SGLD chains from the checkpoint w* on the localised tempered posterior
exp(-n beta L_n(w) - gamma/2 ||w - w*||^2) (its calibration, measure.llc.*, in the trial's params):
    llc/mean            n beta (E_w[L_n(w)] - L_n(w*)), the mean over chains (NaN when a chain
                        diverged); llc/mean_se its s.e., llc/chain_mean_std / sqrt(chains)
    llc/chain_mean_std  the spread (sd) of the chains' estimates
    llc/loss_below_init_frac   the share of draws whose batch loss is below w*'s on that batch
                        (large: w* is not a local minimum, or the step is too large)
    llc/distance        ||w - w*|| at the chains' last step, the mean over chains
    llc/diverged        the chains that diverged (a non-finite loss or gradient, or an estimate
                        beyond measure.llc.divergence_ratio d/2)
    llc/init_loss       L_n(w*);  llc/n_beta  the n beta used (n / log n by default)
Downstream (see ``measure.probe``, ``measure.finetune``, ``measure.lookup``), per task, each on
the same held-out sentences, labelled as ``Source.sample_downstream`` labels them:
    probe/<task>/<stat>      linear probe on the model's frozen features
    random_init/<task>/<stat>  the same probe on a randomly initialised model of the same shape
                        (reference row, measured once per trial)
    lookup/<task>/<stat>     the same probe on the concatenated true conditionals of every
                        position (the paper's "lookup table"; reference row, once per trial)
    finetune/<task>/acc_mean, finetune/<task>/acc_std   the whole model fine-tuned, over seeds
    glue/<task>/<metric>, glue/<task>/<metric>_std   GLUE fine-tuning on a text or LM source's
                        task (``measure.glue``): the dev split scored with GLUE's metric(s) for
                        the task (accuracy; CoLA matthews_correlation; MRPC, QQP also f1), over
                        seeds; on an LM source also glue/<task>/oov_fraction, the share of the
                        task's tokens outside its vocabulary (dropped; ``sources.lm_glue``)
    <stage>/feature_rank    effective rank (participation ratio) of the probed features over
                        all downstream sentences: a collapse of the representation shows here
  with <stat> one of PROBE_STATS: acc_mean, acc_std (over head seeds), acc_se (honest standard
  error: test-set sampling and the seed spread), train_acc, majority_acc (reference row: the
  training split's most frequent class), n_train, n_test, num_classes; with early stopping
  (ProbeConfig.patience) also epochs, the mean over seeds of the epoch each head was kept from.
  Where the task's labels are not a function of the sentence (an HMM's rule ``sampled``: the
  hidden state the sampler drew) also bayes_ceiling, the exact Bayes accuracy on the probe's test
  sentences, the mean of max_y Pr(label = y | x) (``Source.bayes_accuracies``): no probe can
  beat it; absent where the labels are the sentence's (the ceiling is 1).
    <stage>_ridge/<task>/<stat>   the closed-form ridge probe on the same features, split and
                        standardisation (``measure.ridge``; ProbeConfig.ridge): probe_ridge,
                        random_init_ridge, lookup_ridge; <stat> one of RIDGE_STATS: acc_mean (one
                        deterministic fit), acc_se (binomial over test sentences), train_acc,
                        alpha (the L2 penalty / n_train, by leave-one-out accuracy)
"""

LOSS = "pretrain/loss"
ENTROPY = "pretrain/entropy"
KL = "pretrain/kl"
# nats/token: a checkpoint whose KL to the true conditionals is at most this is in the paper's
# saturation regime (2.1), the one threshold of the verdicts (analysis/claims.py), the
# leaderboard's window, the testbed's criterion (a) and the testbed scale's sweep rule
SATURATED_KL = 0.02
LOSS_DATA = "pretrain/loss_data"
TRACE_FISHER = "flat/trace_fisher"
TRACE_HESSIAN = "flat/trace_hessian"
TRACE_HESSIAN_DATA = "flat/trace_hessian_data"
HESSIAN_FISHER_GAP = "flat/hessian_fisher_gap"
TRACE_FISHER_GROWN = "flat/trace_fisher_grown"
TRACE_HESSIAN_GROWN = "flat/trace_hessian_grown"
TOP_EIG_HESSIAN = "flat/top_eig_hessian"
TOP_EIG_FISHER = "flat/top_eig_fisher"
SLQ_TRACE_HESSIAN = "flat/slq_trace_hessian"
SLQ_NEGATIVE_TRACE = "flat/slq_negative_trace"
SHARPNESS_AVG = "flat/sharpness_avg"
PRECOND_SHARPNESS = "flat/precond_sharpness"
PRECOND_SHARPNESS_X_LR = "flat/precond_sharpness_x_lr"
PRECOND_SHARPNESS_RATIO = "flat/precond_sharpness_ratio"
CRITICAL_SHARPNESS = "flat/critical_sharpness"
CRITICAL_STEP = "flat/critical_step"
CRITICAL_SHARPNESS_X_LR = "flat/critical_sharpness_x_lr"
UPDATE_CURVATURE = "flat/update_curvature"
LLC = "llc/mean"
LLC_CHAIN_MEAN_STD = "llc/chain_mean_std"
LLC_LOSS_BELOW_INIT_FRAC = "llc/loss_below_init_frac"
LLC_DISTANCE = "llc/distance"
LLC_DIVERGED = "llc/diverged"
LLC_INIT_LOSS = "llc/init_loss"
LLC_N_BETA = "llc/n_beta"
LLC_KEYS = (LLC, "llc/mean_se", LLC_CHAIN_MEAN_STD, LLC_LOSS_BELOW_INIT_FRAC, LLC_DISTANCE,
            LLC_DIVERGED, LLC_INIT_LOSS, LLC_N_BETA)  # "llc/mean_se": se_key(LLC)
NOISE_PREFIX = "noise/loss_delta_"  # + the scale, "%g": noise/loss_delta_0.03
CKA_TRUTH = "cka/truth"  # the probe's features (sentence level)
CKA_TRUTH_TOKEN = "cka/truth_token"  # every real word's final-layer state (token level)
RANDOM_INIT = "_random_init"  # the random-init model's twin of a key (a reference row)


def block_key(block: str) -> str:
    """Tr(H) of one parameter block: ``layer0`` -> ``flat/blocks/layer0/trace_hessian``."""
    return f"flat/blocks/{block}/trace_hessian"


def sharpness_worst_key(norm: str) -> str:
    """Adaptive worst-case sharpness in one norm: ``flat/sharpness_worst_linf``."""
    return f"flat/sharpness_worst_{norm}"


def per_sentence_key(key: str) -> str:
    """The sentence-weighted twin of a per-token ``pretrain/`` key."""
    return f"{key}_per_sentence"


def se_key(key: str) -> str:
    """The standard-error twin of a metric key: ``pretrain/kl`` -> ``pretrain/kl_se``, and for
    an accuracy over seeds ``probe/B/acc_mean`` -> ``probe/B/acc_se`` (the honest one: test-set
    sampling and the seed spread)."""
    return f"{key.removesuffix('_mean')}_se"


def grown_key(key: str, construction: str | None = None) -> str:
    """The key of a flatness metric measured in the grown shape: ``flat/trace_fisher`` ->
    ``flat/trace_fisher_grown``; with a ``construction`` (``measure.growth_compare``) its name
    follows, "-" written "_".

    >>> grown_key(TRACE_FISHER, "head-norm")
    'flat/trace_fisher_grown_head_norm'
    """
    tail = "" if construction is None else "_" + construction.replace("-", "_")
    return f"{key}_grown{tail}"


# what measure.precond and measure.critical always give ("_se": se_key)
PRECOND_KEYS = (PRECOND_SHARPNESS, PRECOND_SHARPNESS + "_se", PRECOND_SHARPNESS_X_LR,
                PRECOND_SHARPNESS_RATIO)
CRITICAL_KEYS = (CRITICAL_SHARPNESS, CRITICAL_SHARPNESS + "_se", CRITICAL_STEP,
                 CRITICAL_SHARPNESS_X_LR, UPDATE_CURVATURE)

PROBE_STATS = ("acc_mean", "acc_std", "acc_se", "train_acc", "majority_acc", "n_train", "n_test",
               "num_classes")
PROBE_STAGES = ("probe", "random_init", "lookup")
RIDGE_STATS = ("acc_mean", "acc_se", "train_acc", "alpha")
EARLY_STOPPING_EPOCHS = "epochs"  # the probe statistic early stopping adds
# the probe statistic of a task whose labels the sentence does not determine (its ceiling)
BAYES_CEILING = "bayes_ceiling"


def ridge_stage(stage: str) -> str:
    """The ridge probe's stage beside a probe's: ``probe`` -> ``probe_ridge``."""
    return f"{stage}_ridge"


def probe_key(task: str, stat: str = "acc_mean", stage: str = "probe") -> str:
    """``<stage>/<task>/<stat>``: ``probe_key("B")`` -> ``probe/B/acc_mean``."""
    return f"{stage}/{task}/{stat}"


def probe_keys(task: str) -> tuple[str, str]:
    return probe_key(task), probe_key(task, "acc_std")


def finetune_keys(task: str) -> tuple[str, str]:
    return f"finetune/{task}/acc_mean", f"finetune/{task}/acc_std"


def lookup_key(task: str) -> str:
    return probe_key(task, "acc_mean", "lookup")


def glue_key(task: str, metric: str) -> str:
    """``glue/<task>/<metric>``: ``glue_key("cola", "matthews_correlation")``."""
    return f"glue/{task}/{metric}"
