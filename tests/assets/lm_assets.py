"""A tiny causal LM with a tokenizer of its own, and GLUE-shaped folders for it (nothing from the
internet): the WordPiece tokenizer and the SST-2 / MRPC folders of ``text_assets``, and a random
1-layer GPT-2 whose vocabulary is that tokenizer's ([CLS] its BOS, [SEP] its EOS), saved into
one directory with the tokenizer (or without it, ``tokenizer=False``)."""

from pathlib import Path

from tests.assets.text_assets import make_text_assets  # noqa: E402


def make_lm_assets(root: Path, *, n_glue: int = 60, tokenizer: bool = True) -> dict[str, Path]:
    """Writes the text assets and ``lm/`` (model + tokenizer) under ``root``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config

    assets = make_text_assets(root, n_docs=60, n_glue=n_glue)
    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                        pad_token_id=tok.pad_token_id, initializer_range=0.5)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "lm")
    if tokenizer:
        tok.save_pretrained(root / "lm")
    return {**assets, "lm": root / "lm"}


def lm_glue_spec(assets: dict[str, Path], vocab: int = 40, length: int = 12) -> str:
    """The LM source's short form with the assets' GLUE folders (the exact ``bos`` rule)."""
    return (f"lm:{assets['lm']},vocab={vocab},length={length},rule=bos,"
            f"glue={assets['glue']}")
