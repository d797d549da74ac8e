"""The LM source: its truth against enumeration of every sentence, computed by plain full-vocabulary
forwards of the LM (not the source's batched program), its sampler against the exact joint, its
vocabulary rules and its errors. Tiny random GPT-2 / OPT models built from configs, no download."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM, GPT2Config, OPTConfig

from flatlm.sources import SourceError, SourceSpec, load
from flatlm.sources.base import entropy_rows
from flatlm.sources.lm_model import RestrictedLM, load_causal_lm

N_TOKENS = 9  # the tiny LMs' vocabulary; id 8 is BOS (and EOS, pad)


def tiny_lm_dir(path, arch="gpt2", seed=0):
    """A random 1-layer causal LM with peaked next-token laws (initializer_range 1), saved."""
    torch.manual_seed(seed)
    common = dict(vocab_size=N_TOKENS, bos_token_id=8, eos_token_id=8, pad_token_id=8,
                  initializer_range=1.0)
    if arch == "gpt2":
        cfg = GPT2Config(n_positions=8, n_embd=8, n_layer=1, n_head=2, **common)
    else:
        cfg = OPTConfig(max_position_embeddings=8, hidden_size=8, ffn_dim=16, num_hidden_layers=1,
                        num_attention_heads=2, word_embed_proj_dim=8, **common)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["gpt2", "opt"])
def lm_dir(request, tmp_path_factory):
    return tiny_lm_dir(tmp_path_factory.mktemp(request.param) / "lm", request.param)


def lm_source(lm_dir, **fields):
    spec = {"kind": "lm", "model": lm_dir, "vocab": 4, "length": 3, "dtype": "float64",
            "rule_samples": 200, **fields}
    return load(spec)


def exact_joint(src, L=None):
    """Every sentence of L words and Pr(x) by the chain rule of full-vocabulary logits (one plain
    forward per sentence, renormalised over the source's tokens by hand)."""
    L = L or src.max_length
    lm = load_causal_lm(src.spec["model"], "float64", "cpu")
    words = torch.tensor(list(itertools.product(range(src.V), repeat=L)))  # (V^L, L)
    ids = src.ids[words]
    inputs = torch.cat([torch.full((len(ids), 1), lm.config.bos_token_id), ids], 1)
    with torch.no_grad():
        logits = lm(input_ids=inputs).logits[:, :-1].double()  # (V^L, L, N_TOKENS)
    p = logits.softmax(-1)[..., src.ids]
    p = p / p.sum(-1, keepdim=True)  # renormalised over the source's words
    return words, p.gather(-1, words[..., None])[..., 0].prod(1)  # (V^L,)


def exact_conditionals(src, words, joint, tokens, lengths):
    """Pr(x_t = c | x_{-t}) of given sentences from the enumerated joint of their length."""
    out = torch.zeros(len(tokens), tokens.shape[1], src.V, dtype=torch.float64)
    for i, L in enumerate(lengths.tolist()):
        for t in range(L):
            other = [s for s in range(L) if s != t]
            match = (words[:, other] == tokens[i, other]).all(1)
            row = torch.zeros(src.V, dtype=torch.float64).index_add_(0, words[match, t],
                                                                      joint[match])
            out[i, t] = row / row.sum()
    return out


def test_conditionals_and_joint_equal_enumeration(lm_dir):
    src = lm_source(lm_dir)
    words, joint = exact_joint(src)
    assert float(joint.sum()) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(src.log_prob(words, torch.full((len(words),), 3)), joint.log(),
                               rtol=0, atol=1e-9)
    got = src.conditionals(words, torch.full((len(words),), 3), dtype=torch.float64)
    want = exact_conditionals(src, words, joint, words, torch.full((len(words),), 3))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert float(entropy_rows(want).mean()) < 0.9 * np.log(src.V)  # a peaked, non-trivial truth
    tokens = words[[5, 17, 40, 63]].clone()
    lengths = torch.tensor([1, 2, 3, 2])  # shorter sentences: the LM's first-L-words marginal
    tokens[torch.arange(3)[None] >= lengths[:, None]] = -1
    got = src.conditionals(tokens, lengths, dtype=torch.float64)
    for L in (1, 2):
        w, j = exact_joint(src, L)
        rows = lengths == L
        want = exact_conditionals(src, w, j, tokens[rows, :L], lengths[rows])
        torch.testing.assert_close(got[rows, :L], want, rtol=0, atol=1e-6)
    assert (got[torch.arange(3)[None] >= lengths[:, None]] == 0).all()


def test_sampler_passes_goodness_of_fit_and_is_seeded(lm_dir):
    src = lm_source(lm_dir, vocab=3, batch=4096)
    words, joint = exact_joint(src)
    n = 20_000
    tokens, lengths = src.sample(n, seed=3)
    assert (lengths == 3).all() and tokens.dtype == torch.int64
    index = (tokens * torch.tensor([9, 3, 1])).sum(1)  # base-3 id = row of the enumeration
    counts = np.bincount(index.numpy(), minlength=len(joint))
    assert chisquare(counts, n * joint.numpy()).pvalue > 1e-3
    assert torch.equal(tokens[:300], lm_source(lm_dir, vocab=3, batch=7).sample(300, seed=3)[0])
    assert not torch.equal(tokens[:300], src.sample(300, seed=4)[0])


def test_entropy_and_labels_against_enumeration(lm_dir):
    src = lm_source(lm_dir, classes=2)
    words, joint = exact_joint(src)
    lengths = torch.full((len(words),), 3)
    truth = exact_conditionals(src, words, joint, words, lengths)
    exact = float((joint * entropy_rows(truth).mean(1)).sum())  # E_x (1/T) sum_t H
    mean, se = src.entropy(3000, seed=0)
    assert abs(mean - exact) < 4 * se and se < 0.03
    assert src.tasks == ("mask-1", "mask-2", "mask-3") and src.num_classes("mask-2") == 2
    for k in (1, 3):
        mass = torch.stack([truth[:, k - 1, 0::2].sum(-1), truth[:, k - 1, 1::2].sum(-1)], 1)
        assert src.labels(words, lengths, f"mask-{k}").tolist() == mass.argmax(1).tolist()
    tok, ln, classes = src.sample_downstream(50, seed=1)
    assert set(classes) == set(src.tasks) and classes["mask-2"].max() <= 1
    assert src.labels(tok[:2], torch.tensor([1, 3]), "mask-2").tolist()[0] == -1


def test_vocabulary_rules(lm_dir):
    lm = load_causal_lm(lm_dir, "float64", "cpu")
    with torch.no_grad():
        first = lm(input_ids=torch.tensor([[8]])).logits[0, -1].softmax(-1)
    first[8] = -1  # BOS / EOS / pad is never a word
    bos = lm_source(lm_dir, rule="bos", vocab=5)
    assert bos.ids.tolist() == torch.sort(first, descending=True, stable=True).indices[:5].tolist()
    # the unigram rule's estimate u(c) = mean_t Pr(x_t = c) against enumeration (T = 2)
    words = torch.tensor(list(itertools.product(range(N_TOKENS), repeat=2)))
    with torch.no_grad():
        logits = lm(input_ids=torch.cat([torch.full((81, 1), 8), words], 1)).logits.double()
    p = logits.softmax(-1)
    joint1 = p[0, 0]  # Pr(x_1)
    marg2 = (joint1[words[:, 0]][:, None] * p[:, 1]).sum(0) / N_TOKENS  # each x_1 appears 9 times
    exact = (joint1 + marg2) / 2
    u = torch.from_numpy(np.random.default_rng(0).random((4000, 2)))
    estimate = RestrictedLM(lm, None).sample(u, 4000, mean_probs=True)[1]
    torch.testing.assert_close(estimate, exact, rtol=0, atol=0.01)
    uni = lm_source(lm_dir, vocab=8)
    assert sorted(uni.ids.tolist()) == list(range(8)) and uni.V == 8
    assert uni.fingerprint() == lm_source(lm_dir, vocab=8).fingerprint()
    assert uni.fingerprint() != lm_source(lm_dir, vocab=8, dtype="float32").fingerprint()


def test_spec_round_trip_and_errors(tmp_path, lm_dir):
    spec = SourceSpec(f"lm:{lm_dir},vocab=4,length=3,dtype=float64")
    assert spec.kind == "lm" and SourceSpec(str(spec)) == spec
    assert spec.to_dict()["rule"] == "unigram" and spec.to_dict()["model"] == lm_dir
    cases = [
        ({"vocab": 9}, "'vocab' 9 exceeds the 8 non-special tokens"),
        ({"length": 8}, "'length' 8 \\+ BOS exceeds the model's 8 positions"),
        ({"rule": "top"}, "'rule' must be one of unigram, bos"),
        ({"dtype": "half"}, "'dtype' must be one of"),
        ({"classes": 1}, "'classes' must be an integer >= 2"),
        ({"classes": 5}, "'classes' 5 exceeds 'vocab' 4"),
        ({"colour": 1}, "unknown key"),
        ({"model": str(tmp_path)}, "is not a transformers causal LM"),
        ({"model": "./nowhere"}, "neither a directory nor a hub id"),
        ({"model": None}, "'model' is required"),
        ({"device": "tpu"}, "'device' must be auto, cpu, cuda or cuda:<index>"),
    ]
    for fields, message in cases:
        with pytest.raises(SourceError, match=message):
            lm_source(lm_dir, **fields)
    if not torch.cuda.is_available():  # a named GPU that is not there: an error at first use
        with pytest.raises(SourceError, match="'device'.*no CUDA device"):
            lm_source(lm_dir, device="cuda").sample(2, seed=0)


def test_restricted_head_and_float32_agree_with_the_plain_routes(lm_dir):
    src = lm_source(lm_dir, rule="bos", vocab=5, length=4)
    fast = src._lm(torch.device("cpu"))
    assert fast._head is not None  # the k-row head, checked against the full logits on load
    plain = RestrictedLM(fast.lm, src.ids)
    plain._head = None  # the full logits, sliced
    inputs = torch.randint(0, N_TOKENS, (6, 5))
    torch.testing.assert_close(fast.log_probs(inputs)[0], plain.log_probs(inputs)[0],
                               rtol=0, atol=1e-12)
    tokens, lengths = src.sample(20, seed=0)
    f64 = src.conditionals(tokens, lengths, dtype=torch.float64)
    f32 = lm_source(lm_dir, rule="bos", vocab=5, length=4, dtype="float32").conditionals(
        tokens, lengths, dtype=torch.float64)
    torch.testing.assert_close(f32, f64, rtol=0, atol=1e-5)


def test_a_trial_on_lm_text_reaches_mlflow_and_the_analysis_table(tmp_path, monkeypatch):
    """train + loss, Tr(F), probe, lookup on CPU, reported through the MLflow tracker (a sqlite
    store) and read back by the analysis layer, as a sweep's trial is."""
    from pathlib import Path

    pytest.importorskip("mlflow")
    from flatlm.core.config import apply_overrides
    from flatlm.runs.trial import TrialConfig, run_trial
    from flatlm.tracking.tracker import MlflowTracker, default_tracking_uri

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # top-level analysis/
    from analysis.runs import load_runs

    source = f"lm:{tiny_lm_dir(tmp_path / 'lm')},vocab=6,length=4,classes=2"
    cfg = apply_overrides(TrialConfig(), {
        "source": source, "model": "d16-h1-l1-i32", "train.steps": 4, "train.batch_size": 8,
        "train.warmup_steps": 1, "train.checkpoint_steps": [4], "measure.n_eval": 16,
        "measure.n_downstream": 60, "measure.tasks": ["mask-2"],
        "measure.what": ["loss", "fisher", "probe", "lookup"], "measure.probe.epochs": 2,
        "measure.probe.seeds": 2})
    uri = default_tracking_uri(tmp_path)
    with MlflowTracker(uri, tmp_path / "trial", experiment_name="lm", params=cfg) as tracker:
        metrics = run_trial(cfg, tmp_path / "trial", tracker.report)[4]
    assert 0.0 < metrics["pretrain/entropy"] < np.log(6)
    assert metrics["pretrain/loss"] == pytest.approx(
        metrics["pretrain/entropy"] + metrics["pretrain/kl"], abs=1e-6)
    keys = ("probe/mask-2/acc_mean", "lookup/mask-2/acc_mean", "random_init/mask-2/acc_mean",
            "flat/trace_fisher", "pretrain/kl")
    for key in keys:
        assert np.isfinite(metrics[key]), key
    (row,) = load_runs(uri, "lm").to_dict("records")
    assert row["step"] == 4 and row["source"] == str(SourceSpec(source))
    for key in keys:
        assert row[key] == pytest.approx(metrics[key]), key
