"""Linear probe on frozen features (paper 2.1, A.5), and the downstream split shared by every
downstream measurement.

Features: the final-layer states of every input token, [CLS] x_1 .. x_L [SEP] and padding,
concatenated into one vector of (T + 2) d numbers per sentence (padded positions are zero); the
input is not masked. Optionally a fixed Gaussian projection to ``project_dim`` (A.5 uses 512 and
finds it changes nothing; the default is the plain probe, as reported there).

Head: a linear layer trained with AdamW on features computed once: by default as the paper's text
has it (lr 1e-3, 100 epochs, A.5), in minibatches of 64, weight decay 0.01, 50 warmup updates,
gradient-norm clip 1.0, constant rate after warmup. The features are standardised with the
training split's mean and std (the released code does not; raw features let the lookup table's
probabilities underfit and wide BERT states dominate).

``RELEASED`` holds the released probe as ``budget_bert_pretraining/run_lp.py`` runs it (its
README's command line; ``BertForSequenceClassificationL`` and ``BertPoolerC`` in
``pretraining/modeling.py``), one setting per difference:

- batch 512, 50 epochs, lr 1e-3, 50 warmup updates then "polynomial" (power 1) decay, AdamW with
  torch's defaults (weight decay 0.01, on the bias too); they suit its 10^5 sentences: on a few
  thousand they leave a few hundred updates, most of them warmup, and the probe underfits
  (tests/measure/test_probe.py shows it on separable data);
- no gradient clipping (``grad_clip=None``): its accelerate loop never clips, whatever
  ``--max_grad_norm`` says;
- raw features (``standardize=False``);
- positions 1..T (``positions="1..T"``): ``BertPoolerC`` flattens ``hidden_states[:, 1:-1]`` of
  the padded input: no [CLS], no last position; the [SEP] and padding states are included as the
  encoder computes them (``zero_padding=False``);
- dropout 0.1 on the features while the head trains (``feature_dropout=0.1``), off at evaluation;
- the encoder in train mode while the head trains (``encoder_train_mode=True``): ``model.train()``
  turns the frozen encoder's own dropout on, so every epoch sees other features (recomputed every
  epoch, ``measure.probe_batched``); evaluation in eval mode;
- the head initialised N(0, 0.02) with zero bias (``head_init_std=0.02``, BERT's
  ``_init_weights``), not ``nn.Linear``'s uniform.

Not modelled (each moves one update of a few thousand): transformers' polynomial schedule decays to
1e-7, not 0, and its warmup runs one update behind (update u at u / 50 of the peak, the first at 0).

The heads
of all ``seeds`` are trained at once as one batched linear layer [S, D, C]: seed s has its own
initialisation (``nn.Linear``'s uniform(-1/sqrt(D), 1/sqrt(D)), or N(0, ``head_init_std``)),
its own minibatch order and feature-dropout masks, the summed loss gives each head only its own
gradient, clipping is per head, and AdamW acts elementwise, so each head is the one it would be if
trained alone (tests/measure/test_probe.py).
``measure.probe_batched`` goes further and trains every task (and feature set) of a checkpoint as
one problem, the same heads up to rounding; it is what ``measure.run`` uses unless
``ProbeConfig.batched`` is off. It also offers early stopping (``ProbeConfig.patience``, off by
default: the paper's fixed epochs).

Reported with every accuracy (``linear_probe_accuracy``; keys in ``flatlm.measure``):

- ``acc_mean``, ``acc_std``: test accuracy, mean and std (ddof=1; 0 for one seed) over the seeds;
- ``acc_se``: its standard error, sqrt(se_test^2 + acc_std^2 / S), where se_test is the standard
  error over test sentences of each sentence's correctness averaged over the seeds (the binomial
  error of a finite test set, which the seed spread alone hides). Conservative: the two terms
  share some seed noise; the draw of the training split is not included;
- ``train_acc``: training accuracy (mean over seeds): underfitting or memorising shows here;
- ``majority_acc``: the reference row "always the training split's most frequent class".

Downstream data (``downstream_classes``, ``downstream_sentences``, ``split_indices``; also used
by ``measure.lookup`` and ``measure.finetune``): class ids as ``Source.sample_downstream`` gives
them; sentences whose id is -1 (undefined) are dropped; the kept sentences are split at random,
``test_fraction`` (default 20%) for testing, by ``seed`` alone, so that every model, the lookup
table and fine-tuning see the same split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.core.schedules import SCHEDULES, learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.core.tokens import encode
from flatlm.measure import probe_key
from flatlm.models.masked_lm import encoder_features, sentence_features
from flatlm.sources.base import PAD, Source, as_tokens

# The released code's probe as ProbeConfig overrides (module docstring; the README's run_lp.py
# command: --per_device_train_batch_size 512 --learning_rate 1e-3 --num_train_epochs 50
# --lr_scheduler_type polynomial --warmup_steps 50; run_lp.py and pretraining/modeling.py).
RELEASED = {"batch_size": 512, "epochs": 50, "lr": 1e-3, "weight_decay": 0.01,
            "schedule": "linear", "warmup_steps": 50, "grad_clip": None, "standardize": False,
            "positions": "1..T", "zero_padding": False, "feature_dropout": 0.1,
            "encoder_train_mode": True, "head_init_std": 0.02}
POSITIONS = ("all", "1..T")  # ProbeConfig.positions


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    """Linear-probe training; the features, labels and device are arguments."""

    epochs: int = 100  # passes over the training split; paper's text 100, released code 50
    lr: float = 1e-3  # AdamW peak learning rate; paper 1e-3
    weight_decay: float = 0.01  # AdamW decoupled weight decay; released code 0.01
    seeds: int = 5  # heads trained (each its own init and batch order); paper 5
    seed: int = 0  # base seed: the split, the projection and the heads derive from it
    project_dim: int | None = None  # fixed Gaussian projection to this size (paper: 512); None
    batch_size: int | None = 64  # examples per update (released code 512); None = all
    schedule: str = "constant"  # after warmup: "constant" or "linear" decay to 0 (released)
    warmup_steps: int = 50  # linear warmup updates (released code 50); >= 0
    grad_clip: float | None = 1.0  # clip each head's gradient norm (released code 1.0); None
    test_fraction: float = 0.2  # share of the (labelled) sentences held out for accuracy; (0, 1)
    standardize: bool = True  # z-score each feature with training-split statistics
    forward_batch_size: int = 256  # sentences per forward pass when computing model features
    # train every task (and feature set) of a checkpoint as one batched problem
    # (measure.probe_batched; the same heads up to rounding); False: task by task (train_heads)
    batched: bool = True
    # early stopping (needs batched): epochs without a better held-out accuracy before a head
    # stops, keeping its best epoch's weights; None = the fixed epochs (paper, paper-code)
    patience: int | None = None
    val_fraction: float = 0.1  # share of the training split held out by early stopping; (0, 1)
    # also the closed-form ridge probe beside each probe (measure.ridge; <stage>_ridge/* keys)
    ridge: bool = True
    # which final-layer states are concatenated: "all" = [CLS] x_1..x_T [SEP]/padding, (T+2) d
    # (the paper: "all the tokens"); "1..T" = positions 1..T, T d (released: [:, 1:-1])
    positions: str = "all"
    zero_padding: bool = True  # padded positions' states set to 0; False: as computed (released)
    feature_dropout: float = 0.0  # dropout on the features while training the head (released 0.1)
    # the encoder in train mode (its dropout on) while the head trains, features recomputed every
    # epoch (released: True); evaluation always in eval mode. Needs batched=true
    encoder_train_mode: bool = False
    # head initialisation: None = nn.Linear's uniform(+-1/sqrt(D)); a std = N(0, std) weights
    # and zero bias (released: 0.02, BERT's initializer_range)
    head_init_std: float | None = None

    def __post_init__(self):
        if self.epochs < 1 or self.seeds < 1 or self.forward_batch_size < 1:
            raise ValueError("probe.epochs, probe.seeds and probe.forward_batch_size must be >= 1")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"probe.test_fraction={self.test_fraction}: use a value in (0, 1)")
        if self.project_dim is not None and self.project_dim < 1:
            raise ValueError(f"probe.project_dim={self.project_dim}: use None or an int >= 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"probe.batch_size={self.batch_size}: use None or an int >= 1")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"probe.schedule={self.schedule!r}: use one of {SCHEDULES}")
        if self.warmup_steps < 0:
            raise ValueError(f"probe.warmup_steps={self.warmup_steps}: use an int >= 0")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"probe.grad_clip={self.grad_clip}: use None or a value > 0")
        if self.patience is not None and (self.patience < 1 or not self.batched):
            raise ValueError(f"probe.patience={self.patience}: use None, or an int >= 1 with "
                             "probe.batched=true")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"probe.val_fraction={self.val_fraction}: use a value in (0, 1)")
        self._check_released_settings()

    def _check_released_settings(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"probe.positions={self.positions!r}: use one of {POSITIONS}")
        if not 0.0 <= self.feature_dropout < 1.0:
            raise ValueError(f"probe.feature_dropout={self.feature_dropout}: use a probability "
                             "in [0, 1)")
        if self.encoder_train_mode and not self.batched:
            raise ValueError("probe.encoder_train_mode=true needs probe.batched=true (the "
                             "per-task reference probe reads fixed features)")
        if self.head_init_std is not None and not self.head_init_std > 0:
            raise ValueError(f"probe.head_init_std={self.head_init_std}: use None or a value > 0")


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) indices into n items: a seeded permutation, round(n * test_fraction) test
    items (at least one of each).

    >>> train, test = split_indices(10, 0.2, seed=0)
    >>> len(train), len(test), sorted(train.tolist() + test.tolist()) == list(range(10))
    (8, 2, True)
    """
    if n < 2:
        raise ValueError(f"need at least 2 labelled sentences to split, got {n}")
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "split")))
    return perm[n_test:], perm[:n_test]


def downstream_classes(
    source: Source, classes: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(keep [n] bool, classes [k] int64, num_classes) for ``task``: the class ids that
    ``source.sample_downstream`` gave, with the undefined ones (-1) dropped and the rest checked."""
    classes = torch.as_tensor(classes, dtype=torch.int64).cpu()
    keep = classes != PAD
    classes = classes[keep]
    num_classes = source.num_classes(task)
    if len(classes) and (int(classes.min()) < 0 or int(classes.max()) >= num_classes):
        raise ValueError(f"task {task!r}: class indices must lie in 0..{num_classes - 1}, got "
                         f"{int(classes.min())}..{int(classes.max())}")
    return keep, classes, num_classes


def downstream_sentences(
    source: Source, tokens, lengths, classes: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(tokens [k, T], lengths [k], classes [k], num_classes): the downstream sentences whose
    class for ``task`` is defined, with their class ids (``downstream_classes``)."""
    keep, classes, num_classes = downstream_classes(source, classes, task)
    tokens, lengths = as_tokens(tokens, lengths)
    keep = keep.to(tokens.device)
    return tokens[keep], lengths[keep], classes, num_classes


def initial_heads(D: int, C: int, gens: list[torch.Generator], device, dtype,
                  std: float | None = None):
    """Per-seed head initialisations stacked: W (S, D, C), b (S, C); ``nn.Linear(D, C)``'s
    uniform(+-1/sqrt(D)) for W and b, or with ``std`` N(0, std^2) weights and zero bias (BERT's
    ``_init_weights``, the released probe's head)."""
    if std is not None:
        W = torch.stack([torch.randn(D, C, generator=g) * std for g in gens])
        b = torch.zeros(len(gens), C)
    else:
        bound = 1.0 / math.sqrt(D)
        W = torch.stack([(torch.rand(D, C, generator=g) * 2 - 1) * bound for g in gens])
        b = torch.stack([(torch.rand(C, generator=g) * 2 - 1) * bound for g in gens])
    return (nn.Parameter(W.to(device, dtype)), nn.Parameter(b.to(device, dtype)))


def feature_dropout(cfg: ProbeConfig, device) -> torch.Generator | None:
    """The generator of the feature-dropout masks (``cfg.feature_dropout``), or None when off.
    Seeded by ``cfg.seed`` alone: the per-task and the batched probe draw the same masks."""
    if cfg.feature_dropout == 0:
        return None
    return torch.Generator(device=device).manual_seed(derive_seed(cfg.seed, "feature-dropout"))


def dropout_multipliers(gen: torch.Generator, shape: tuple[int, ...], p: float, device,
                        dtype) -> torch.Tensor:
    """``nn.Dropout(p)``'s multipliers for one update's features (S, B, D): 0 with probability p,
    else 1 / (1 - p); each head s its own."""
    keep = torch.rand(shape, generator=gen, device=device) >= p
    return keep.to(dtype) / (1.0 - p)


def train_heads(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, seeds: list[int], cfg: ProbeConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear heads trained on ``x`` (N, D), ``y`` (N,), one per seed: W (S, D, C), b (S, C)."""
    N, D = x.shape
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    W, b = initial_heads(D, num_classes, gens, x.device, x.dtype, cfg.head_init_std)
    drop = feature_dropout(cfg, x.device)
    opt = torch.optim.AdamW([W, b], lr=cfg.lr, weight_decay=cfg.weight_decay)
    bs = N if cfg.batch_size is None else min(cfg.batch_size, N)
    total = cfg.epochs * math.ceil(N / bs)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    step = 0
    with torch.enable_grad():
        for _ in range(cfg.epochs):
            if bs == N:  # full batch: every head sees all of x in order, no gather needed
                batches = [None]
            else:
                perms = torch.stack([torch.randperm(N, generator=g) for g in gens]).to(x.device)
                batches = [perms[:, i : i + bs] for i in range(0, N, bs)]  # each (S, B)
            for idx in batches:
                if idx is None and drop is None:
                    logits = torch.einsum("nd,sdc->snc", x, W) + b[:, None]  # (S, N, C)
                    targets, size = y.repeat(len(seeds)), N
                else:
                    xb = x[None].expand(len(seeds), N, D) if idx is None else x[idx]  # (S, B, D)
                    if drop is not None:
                        xb = xb * dropout_multipliers(drop, xb.shape, cfg.feature_dropout,
                                                      x.device, x.dtype)
                    logits = torch.baddbmm(b[:, None], xb, W)  # (S, B, C)
                    targets = (y.repeat(len(seeds)) if idx is None else y[idx].flatten())
                    size = xb.shape[1]
                # sum over heads of each head's mean loss: head s gets only its own gradient
                loss = loss_fn(logits.flatten(0, 1), targets) / size
                opt.zero_grad(set_to_none=True)
                loss.backward()
                _clip_per_head(W, b, cfg.grad_clip)
                for group in opt.param_groups:
                    group["lr"] = learning_rate(step, peak=cfg.lr, warmup_steps=cfg.warmup_steps,
                                                total_steps=total, schedule=cfg.schedule)
                opt.step()
                step += 1
    return W.detach(), b.detach()


def _clip_per_head(W: nn.Parameter, b: nn.Parameter, max_norm: float | None) -> None:
    """Scales each head's gradient (W[s], b[s]) to norm at most ``max_norm``, as clipping one
    head's parameters alone would."""
    if max_norm is None:
        return
    norm = (W.grad.square().sum((1, 2)) + b.grad.square().sum(1)).sqrt()  # (S,)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    W.grad.mul_(scale[:, None, None])
    b.grad.mul_(scale[:, None])


def _projection(D: int, k: int, seed: int, device, dtype) -> torch.Tensor:
    """A fixed Gaussian map (D, k) with N(0, 1/k) entries (Johnson-Lindenstrauss scaling)."""
    g = torch.Generator().manual_seed(derive_seed(seed, "projection"))
    return (torch.randn(D, k, generator=g) / math.sqrt(k)).to(device, dtype)


@torch.no_grad()
def linear_probe_accuracy(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, cfg: ProbeConfig
) -> dict:
    """Linear heads on ``features`` [n, D] with class ``labels`` [n] in 0..num_classes-1, over
    ``cfg.seeds`` seeds: ``acc_mean``, ``acc_std``, ``acc_se``, ``train_acc``, ``majority_acc``,
    ``n_train``, ``n_test`` and the per-seed ``accs`` (module docstring).

    Runs on the features' device. The split comes from ``cfg.seed``, head s from seed
    derive_seed(cfg.seed, "head", s). One task at a time: ``measure.probe_batched`` trains every
    task (and feature set) of a checkpoint as one problem, the same heads up to rounding.
    """
    x = features.float() if not features.is_floating_point() else features
    y = torch.as_tensor(labels, dtype=torch.int64).to(x.device)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"features must be [n, D] and labels [n]; got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must be class indices in 0..{num_classes - 1}")
    train, test = split_indices(len(y), cfg.test_fraction, cfg.seed)
    train, test = train.to(x.device), test.to(x.device)
    x = prepared_features(x, train, cfg)
    W, b = train_heads(x[train], y[train], num_classes, head_seeds(cfg), cfg)
    correct = {split: (torch.einsum("nd,sdc->snc", x[rows], W) + b[:, None]).argmax(-1)
               == y[rows] for split, rows in (("train", train), ("test", test))}  # (S, n)
    return probe_statistics(correct["train"], correct["test"], y[train], y[test], num_classes)


def head_seeds(cfg: ProbeConfig) -> list[int]:
    """The seed of each head: its initialisation and minibatch order."""
    return [derive_seed(cfg.seed, "head", s) for s in range(cfg.seeds)]


def prepared_features(x: torch.Tensor, train: torch.Tensor, cfg: ProbeConfig) -> torch.Tensor:
    """``x`` [n, D] as the heads read it: projected (``cfg.project_dim``), then standardised
    with the statistics of the ``train`` rows (``cfg.standardize``)."""
    return feature_preparation(x, train, cfg)(x)


def feature_preparation(x: torch.Tensor, train: torch.Tensor, cfg: ProbeConfig):
    """The map ``prepared_features`` applies to ``x`` [n, D], fitted on its ``train`` rows:
    it also prepares features drawn with the encoder in train mode (``encoder_train_mode``) as
    the eval-mode features they stand for are prepared."""
    P = (_projection(x.shape[1], cfg.project_dim, cfg.seed, x.device, x.dtype)
         if cfg.project_dim is not None else None)
    mu = sd = None
    if cfg.standardize:
        xt = x[train] if P is None else x[train] @ P
        mu, sd = xt.mean(0), xt.std(0)
        sd = torch.where(sd > 0, sd, torch.ones_like(sd))

    def prepare(z: torch.Tensor) -> torch.Tensor:
        if P is not None:
            z = z @ P  # (n, k)
        return z if mu is None else (z - mu) / sd

    return prepare


def probe_statistics(correct_train: torch.Tensor, correct_test: torch.Tensor,
                     y_train: torch.Tensor, y_test: torch.Tensor, num_classes: int) -> dict:
    """The reported statistics (module docstring) of heads whose predictions were right where
    ``correct_train`` (S, n_train) and ``correct_test`` (S, n_test) are True."""
    accs = correct_test.double().mean(1)  # (S,)
    std = float(accs.std()) if len(accs) > 1 else 0.0
    n_test = correct_test.shape[1]
    per_sentence = correct_test.double().mean(0)  # (n_test,): correct, averaged over seeds
    se_test = float(per_sentence.std() / math.sqrt(n_test)) if n_test > 1 else math.nan
    majority = torch.bincount(y_train, minlength=num_classes).argmax()
    return {"acc_mean": float(accs.mean()), "acc_std": std,
            "acc_se": math.sqrt(se_test**2 + std**2 / len(accs)),
            "train_acc": float(correct_train.double().mean()),
            "majority_acc": float((y_test == majority).double().mean()),
            "n_train": len(y_train), "n_test": n_test, "accs": accs.tolist()}


@torch.no_grad()
def encoder_probe_features(
    model: nn.Module,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    *,
    device: str | torch.device | None = None,
    batch_size: int = 256,
    positions: str = "all",
    zero_padding: bool = True,
    train_mode: bool = False,
) -> torch.Tensor:
    """Concatenated final-layer states of the input tokens, float32 on ``device`` (default: the
    model's, where it must already be), unmasked input: [n, (T+2) d] for ``positions="all"``
    ([CLS] x_1..x_L [SEP] and padding), [n, T d] for ``"1..T"`` (the released probe's
    ``hidden_states[:, 1:-1]``); padded positions zero unless ``zero_padding`` is off. Eval mode,
    or with ``train_mode`` train mode (dropout on, drawn from torch's global generator); the
    model's mode is put back after."""
    tokens, lengths = as_tokens(tokens, lengths)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.train(train_mode)
    parts = []
    try:
        for i in range(0, len(tokens), batch_size):
            ids, mask = encode(tokens[i : i + batch_size].to(device),
                               lengths[i : i + batch_size].to(device))  # (B, T+2)
            if positions == "all" and zero_padding:
                parts.append(sentence_features(model, ids, mask).float())  # (B, (T+2) d)
            else:
                states = encoder_features(model, ids, mask)  # (B, T+2, d)
                parts.append(probed_states(states, mask, positions, zero_padding).float())
    finally:
        model.train(was_training)
    return torch.cat(parts)


def probed_states(states: torch.Tensor, attention_mask: torch.Tensor, positions: str,
                  zero_padding: bool) -> torch.Tensor:
    """The probe's features of final-layer ``states`` (n, T+2, d): (n, (T+2) d) for
    ``positions="all"``, (n, T d) for ``"1..T"``; padded positions zero with ``zero_padding``.

    >>> h = torch.arange(1.0, 5.0).view(1, 4, 1)  # [CLS] x_1 [SEP] [PAD]: T = 2
    >>> probed_states(h, torch.tensor([[1, 1, 1, 0]]), "1..T", zero_padding=False).tolist()
    [[2.0, 3.0]]
    >>> probed_states(h, torch.tensor([[1, 1, 1, 0]]), "all", zero_padding=True).tolist()
    [[1.0, 2.0, 3.0, 0.0]]
    """
    if positions not in POSITIONS:
        raise ValueError(f"probe.positions={positions!r}: use one of {POSITIONS}")
    if zero_padding:
        states = states * attention_mask[..., None].to(states.dtype)
    if positions == "1..T":
        states = states[:, 1:-1]
    return states.flatten(1)


def train_mode_features(model: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor,
                        cfg: ProbeConfig, device: str | torch.device | None = None):
    """``(rows, epoch) -> features``: ``encoder_probe_features`` of sentences ``rows`` with the
    encoder in train mode (``cfg.encoder_train_mode``), its dropout drawn from a generator seeded
    by ``cfg.seed`` and the epoch (torch's global generators are put back after)."""
    tokens, lengths = as_tokens(tokens, lengths)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    cuda = [device.index or 0] if device.type == "cuda" else []

    def draw(rows: torch.Tensor, epoch: int) -> torch.Tensor:
        rows = rows.to(tokens.device)
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(derive_seed(cfg.seed, "encoder-dropout", epoch))
            return encoder_probe_features(
                model, tokens[rows], lengths[rows], device=device,
                batch_size=cfg.forward_batch_size, positions=cfg.positions,
                zero_padding=cfg.zero_padding, train_mode=True)

    return draw


def probe(
    model: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    classes: torch.Tensor,
    task: str,
    cfg: ProbeConfig,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """``probe/<task>/acc_mean`` and ``probe/<task>/acc_std``: the linear probe on the model's
    frozen features of the downstream sentences with their class ids (``sample_downstream``).
    One task on fixed features: the encoder in train mode needs ``measure.probe_rows``."""
    if cfg.encoder_train_mode:
        raise ValueError("probe.encoder_train_mode=true: probe one task with "
                         "measure.probe_rows.probe_rows(..., draw=train_mode_features(...))")
    tokens, lengths, classes, num_classes = downstream_sentences(source, tokens, lengths,
                                                                 classes, task)
    features = encoder_probe_features(model, tokens, lengths, device=device,
                                      batch_size=cfg.forward_batch_size,
                                      positions=cfg.positions, zero_padding=cfg.zero_padding)
    result = linear_probe_accuracy(features, classes, num_classes, cfg)
    return probe_metrics("probe", task, result, num_classes)


def participation_ratio(features: torch.Tensor, *, chunk: int = 8192) -> float:
    """Effective rank of a feature matrix [n, D]: (sum lambda)^2 / sum lambda^2 over the
    eigenvalues lambda of its covariance (D for isotropic features, 1 for a single direction).

    That is tr(S)^2 / ||S||_F^2 for the centred scatter matrix S = Xc^T Xc (or Xc Xc^T, the
    smaller: the same non-zero eigenvalues), accumulated in float64 over row chunks: no SVD and
    no float64 copy of the features, which at the paper's sizes (10^5 sentences x 18 positions
    x d) would not fit beside the model on one GPU.

    >>> round(participation_ratio(torch.eye(4)), 6)  # 4 points: 3 equal directions
    3.0
    """
    n, width = features.shape
    mean = sum(rows.double().sum(0) for rows in features.split(chunk)) / n
    if n < width:
        centred = features.double() - mean
        scatter = centred @ centred.T
    else:
        scatter = torch.zeros(width, width, dtype=torch.float64, device=features.device)
        for rows in features.split(chunk):
            centred = rows.double() - mean
            scatter += centred.T @ centred
    trace = float(scatter.diagonal().sum())
    return trace ** 2 / float(scatter.square().sum()) if trace > 0 else 0.0


def probe_metrics(stage: str, task: str, result: dict, num_classes: int) -> dict[str, float]:
    """``<stage>/<task>/<stat>`` for every statistic of a ``linear_probe_accuracy`` result, with
    the class count beside it (keys in ``flatlm.measure``)."""
    stats = {**{k: v for k, v in result.items() if k != "accs"}, "num_classes": num_classes}
    return {probe_key(task, k, stage): float(v) for k, v in stats.items()}
