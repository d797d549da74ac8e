"""Sentences packed end to end into rows (``train.sequence_packing="rows"``, flatlm.train.rows)
give the padded update: the layout checked slot by slot against a brute-force reading, the
attention mask against a pairwise rule, a sentence blind to its row neighbours, and loss and
gradients equal to the padded path's (float64 to 1e-10, float32 to 1e-5; with dropout, equal
in distribution)."""

import contextlib
import dataclasses

import pytest
import torch

from flatlm.core.tokens import PAD_ID
from flatlm.models import build_model, parse_model
from flatlm.models.bert import row_word_logits
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.algorithms import (
    StepContext,
    build_optimizer,
    mlm_loss_sum,
    sam_step,
    standard_step,
)
from flatlm.train.compiled import loss_function
from flatlm.train.config import sequence_packing_for
from flatlm.train.data import BatchPipeline, FreshSamples, StepInputs
from flatlm.train.pack import train_pack
from flatlm.train.rows import RowBatch, into_rows, row_loss_sum
from tests.train.conftest import masked_sample

MODELS = ["d16-h2-l1-i32", "d16-h2-l2-i32-pre"]  # post-LN BERT, pre-LN RoBERTa
MASKS = {"one": {}, "rate": {"mask": 0.3, "max_predictions": 3}}


def _model(src, model, dtype=torch.float64, dropout=0.0):
    cfg = dataclasses.replace(parse_model(model), dropout=dropout)
    return build_model(cfg, src.V, src.max_length, seed=0).to(dtype)


def _sentences_in_rows(rows: RowBatch, c: int) -> dict[tuple[int, int], list[int]]:
    """Brute force: (row, segment) -> the slots of micro-batch c holding that sentence."""
    found = {}
    for r, segments in enumerate(rows.segment_ids[c].tolist()):
        for slot, segment in enumerate(segments):
            if segment >= 0:
                found.setdefault((r, segment), []).append(slot)
    return found


def test_each_sentence_lies_whole_in_one_row_with_positions_from_zero(paper):
    batch, _ = masked_sample(paper, 24, seed=1)
    rows = into_rows(batch, row_length=40, sentences=12)
    C, R, L = rows.input_ids.shape
    assert (C, L) == (2, 40)
    for c in range(C):
        placed = _sentences_in_rows(rows, c)
        assert len(placed) == 12  # every sentence once
        laid_out = []
        for (r, _), slots in placed.items():
            assert slots == list(range(slots[0], slots[0] + len(slots)))  # consecutive
            assert rows.position_ids[c, r, slots].tolist() == list(range(len(slots)))
            laid_out.append(tuple(rows.input_ids[c, r, slots].tolist()))
        originals = [tuple(ids[mask.bool()].tolist()) for ids, mask in
                     zip(batch.input_ids[12 * c:12 * c + 12],
                         batch.attention_mask[12 * c:12 * c + 12], strict=True)]
        assert sorted(laid_out) == sorted(originals)
        unused = rows.segment_ids[c] < 0
        assert (rows.input_ids[c][unused] == PAD_ID).all()
        assert int((~unused).sum()) == int(batch.attention_mask[12 * c:12 * c + 12].sum())


def test_the_attention_mask_is_block_diagonal_by_brute_force(paper):
    rows = into_rows(masked_sample(paper, 16, seed=2)[0], row_length=36, sentences=16)
    attend = rows.attend()  # (R, L, L)
    for r, segments in enumerate(rows.segment_ids[0].tolist()):
        for i, a in enumerate(segments):
            for j, b in enumerate(segments):
                same = (a >= 0 and a == b) or i == j  # an unused slot reads only itself
                assert bool(attend[r, i, j]) == same, (r, i, j)


@pytest.mark.parametrize("mask", MASKS)
def test_masked_slots_hold_the_masked_words(paper, mask):
    batch, _ = masked_sample(paper, 20, seed=3, **MASKS[mask])
    rows = into_rows(batch, row_length=64, sentences=10)
    for c in range(2):
        part = slice(10 * c, 10 * c + 10)
        n = rows.masked[c]
        slots = rows.masked_slots[c, :n]
        got = sorted(zip(rows.input_ids[c].flatten()[slots].tolist(),
                         rows.targets[c, :n].tolist(), strict=True))
        if mask == "one":
            ids = batch.input_ids[part].gather(1, batch.positions[part, None] + 1).squeeze(1)
            want = sorted(zip(ids.tolist(), batch.targets[part].tolist(), strict=True))
        else:
            ids = batch.input_ids[part, 1:-1][batch.positions[part]]
            want = sorted(zip(ids.tolist(), batch.targets[part][batch.positions[part]].tolist(),
                              strict=True))
        assert got == want  # the same (input, target) pairs: the masked words, not others
        assert (rows.targets[c, n:] == -100).all()


def test_a_sentence_does_not_read_its_row_neighbours(paper):
    """Rewriting every other sentence of the rows leaves one sentence's logits as they were;
    with an all-True mask (no blocks) the same rewrite changes them: the test can fail."""
    model = _model(paper, MODELS[0], torch.float32).eval()
    rows = into_rows(masked_sample(paper, 12, seed=4)[0], row_length=64, sentences=12)
    ids, pos = rows.input_ids[0], rows.position_ids[0]
    r, kept = 0, 0  # sentence 0 of row 0
    own = rows.segment_ids[0] == kept
    own[1:] = False
    others = (rows.segment_ids[0] >= 0) & ~own
    rewritten = torch.where(others, torch.randint(4, 4 + paper.V, ids.shape,
                                                  generator=torch.Generator().manual_seed(0)),
                            ids)
    slots = own[r].nonzero().squeeze(1)  # every slot of the kept sentence (row 0)

    def logits(input_ids, attend):
        with torch.no_grad():
            return row_word_logits(model, input_ids, attend, pos, slots)

    blocks = rows.attend()
    assert torch.equal(logits(rewritten, blocks), logits(ids, blocks))
    everything = torch.ones_like(blocks)
    assert not torch.allclose(logits(rewritten, everything), logits(ids, everything))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)],
                         ids=["float64", "float32"])
def test_row_loss_and_gradients_equal_the_padded_ones(paper, model, mask, dtype, tol):
    """Dropout off: the same sum of the same per-word losses, up to float order."""
    batch, _ = masked_sample(paper, 24, seed=5, **MASKS[mask])
    padded_model, rows_model = _model(paper, model, dtype), _model(paper, model, dtype)
    padded = mlm_loss_sum(padded_model, batch)
    rows = row_loss_sum(rows_model, into_rows(batch, row_length=48, sentences=24))
    padded.backward()
    rows.backward()
    torch.testing.assert_close(rows, padded, rtol=tol, atol=0)
    for (name, a), b in zip(padded_model.named_parameters(), rows_model.parameters(),
                            strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=tol, atol=tol, msg=name)


def _context(cfg, model, loss):
    cfg = resolve(cfg)
    return StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model),
                       autocast=contextlib.nullcontext, mlm_loss=loss)


@pytest.mark.parametrize("step", [standard_step, sam_step], ids=["adamw", "sam"])
def test_a_rows_update_in_micro_batches_equals_the_padded_update(paper, step):
    """Four micro-batches (sam: two per half), float64: the updated weights agree to 1e-10."""
    algorithm = "sam" if step is sam_step else "adamw"
    cfg = TrainConfig(algorithm=algorithm, batch_size=32, micro_batch_size=8, dropout=0.0)
    batch, _ = masked_sample(paper, 32, seed=6)
    padded, rows = _model(paper, MODELS[0]), _model(paper, MODELS[0])
    step(_context(cfg, padded, mlm_loss_sum), StepInputs(batch))
    step(_context(cfg, rows, row_loss_sum), StepInputs(into_rows(batch, 64, 8)))
    for (name, a), b in zip(padded.named_parameters(), rows.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=name)


def test_with_dropout_rows_equal_padded_in_distribution(paper, monkeypatch):
    """Dropout 0.1 on: the attention keeps its dropout (SDPA called with dropout_p=0.1), draws
    differ, and the mean loss over 150 draws agrees with the padded path's within 4 standard
    errors of the difference (each side's draws are independent)."""
    batch, _ = masked_sample(paper, 16, seed=7)
    rows = into_rows(batch, row_length=64, sentences=16)
    model = _model(paper, MODELS[0], torch.float32, dropout=0.1).train()
    sdpa, seen = torch.nn.functional.scaled_dot_product_attention, []

    def recording(*args, dropout_p=0.0, **kwargs):
        seen.append(dropout_p)
        return sdpa(*args, dropout_p=dropout_p, **kwargs)

    torch.manual_seed(0)
    with torch.no_grad():
        padded = torch.stack([mlm_loss_sum(model, batch) for _ in range(150)])
        with monkeypatch.context() as m:
            m.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
            in_rows = torch.stack([row_loss_sum(model, rows) for _ in range(150)])
    assert seen and set(seen) == {0.1}
    assert in_rows.std() > 0  # the draws differ: dropout is on
    se = (padded.var() / len(padded) + in_rows.var() / len(in_rows)).sqrt()
    assert abs(float(in_rows.mean() - padded.mean())) < 4 * float(se)


def test_a_rows_run_trains_like_the_padded_run(paper, tmp_path):
    """The whole loop (pipeline, float32, noreg: no dropout): the same losses and weights."""
    cfg = TrainConfig(algorithm="noreg", steps=4, batch_size=32, micro_batch_size=16,
                      warmup_steps=2, log_every=1, seed=3, sequence_packing="padded")
    padded = train(cfg, paper, MODELS[1], tmp_path / "padded", progress=False)
    rows = train(dataclasses.replace(cfg, sequence_packing="rows"), paper, MODELS[1],
                 tmp_path / "rows", progress=False)
    for (name, a), b in zip(padded.model.named_parameters(), rows.model.parameters(),
                            strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
    for a, b in zip(padded.history, rows.history, strict=True):
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-5)


def test_row_shapes_take_few_values_across_batches(paper):
    """Rounded up (``bucketed``): 12 batches of 256 sentences at a rate give at most 3 row
    counts and 2 masked-slot counts (seen: 50-54 rows, 480-544 masked words), the rows at most
    1/16 above what they need."""
    cfg = TrainConfig(batch_size=256, sequence_packing="rows", mask=0.15)
    pipeline = BatchPipeline(cfg, FreshSamples(paper, 256, seed=0), torch.device("cpu"))
    row_counts, slot_counts = set(), set()
    for i in range(12):
        rows = pipeline.cpu_inputs(i).mlm
        assert isinstance(rows, RowBatch)
        used = int((rows.segment_ids >= 0).sum())
        needed = max(int(r) for r in (rows.segment_ids[0] >= 0).any(1).nonzero()) + 1
        assert used <= needed * cfg.row_length
        assert needed <= rows.input_ids.shape[1] <= needed * 17 / 16
        row_counts.add(rows.input_ids.shape[1])
        slot_counts.add(rows.masked_slots.shape[1])
    assert len(row_counts) <= 3 and len(slot_counts) <= 2


def test_the_setting_names_its_field_and_fix(paper, tmp_path):
    assert [sequence_packing_for(TrainConfig(), d) for d in ("cpu", "cuda")] == \
        ["padded", "unpadded"]  # auto: as before the setting existed
    assert sequence_packing_for(TrainConfig(unpad=True), "cpu") == "unpadded"
    assert sequence_packing_for(TrainConfig(sequence_packing="rows"), "cpu") == "rows"
    assert loss_function(TrainConfig(sequence_packing="rows"), "cpu") is row_loss_sum
    with pytest.raises(ValueError, match=r"train\.sequence_packing='pack'.*padded, unpadded"):
        TrainConfig(sequence_packing="pack")
    with pytest.raises(ValueError, match=r"train\.unpad=True.*leave train\.unpad at auto"):
        TrainConfig(sequence_packing="rows", unpad=True)
    with pytest.raises(ValueError, match=r"train\.sequence_packing='rows'.*world_size=1"):
        TrainConfig(sequence_packing="rows", world_size=2, batch_size=8)
    with pytest.raises(ValueError, match=r"train\.row_length=2"):
        TrainConfig(row_length=2)
    short = TrainConfig(steps=1, batch_size=8, sequence_packing="rows", row_length=12)
    with pytest.raises(ValueError, match=r"train\.row_length=12.*>= 18"):
        train(short, paper, MODELS[0], tmp_path / "a", progress=False)
    lstm = TrainConfig(steps=1, batch_size=8, sequence_packing="rows")
    with pytest.raises(ValueError, match=r"model\.arch='lstm'.*rows are for BERT"):
        train(lstm, paper, "lstm-h8-l1", tmp_path / "b", progress=False)


def test_a_trial_pack_refuses_rows(paper, tmp_path):
    cfgs = [TrainConfig(steps=1, batch_size=8, sequence_packing="rows", seed=s) for s in (0, 1)]
    with pytest.raises(ValueError, match=r"pack: train\.sequence_packing='rows'"):
        train_pack(cfgs, paper, MODELS[0], [tmp_path / "a", tmp_path / "b"], progress=False)
