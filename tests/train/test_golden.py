"""A 20-step AdamW run on the tiny PCFG keeps its loss curve (tests/assets/golden_loss_adamw.json).

Regenerate after an intended change with
``FLATLM_UPDATE_GOLDEN=1 pytest tests/train/test_golden.py`` and say why in the commit.
"""

import json
import os
from pathlib import Path

from flatlm.core.config import from_dict, to_dict
from flatlm.train import TrainConfig, train

ASSET = Path(__file__).parent.parent / "assets" / "golden_loss_adamw.json"
# float32 on the CPU: different BLAS kernels may change the last bits of each step, and these
# differences grow over 20 steps; 1e-4 nats is far below what any change to the algorithm moves.
ATOL = 1e-4


def test_golden_loss_curve(src, tiny_model, tmp_path):
    # the curve was recorded with plain [MASK] masking (the default became BERT's 80/10/10)
    cfg = TrainConfig(algorithm="adamw", steps=20, batch_size=32, warmup_steps=5, log_every=1,
                      seed=0, mask_replace=(1.0, 0.0, 0.0))
    result = train(cfg, src, tiny_model, tmp_path, progress=False)
    losses = [round(r["train/loss"], 6) for r in result.history]
    if os.environ.get("FLATLM_UPDATE_GOLDEN"):
        ASSET.parent.mkdir(exist_ok=True)
        ASSET.write_text(json.dumps({"source": src.spec, "model": tiny_model,
                                     "train": to_dict(cfg), "loss": losses}, indent=1) + "\n")
    golden = json.loads(ASSET.read_text())
    assert from_dict(TrainConfig, golden["train"]) == cfg and golden["model"] == tiny_model
    assert len(losses) == len(golden["loss"]) == 20
    worst = max(abs(a - b) for a, b in zip(losses, golden["loss"], strict=True))
    assert worst <= ATOL, (losses, golden["loss"])
    assert losses[-1] < losses[0]
