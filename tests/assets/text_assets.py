"""Tiny local stand-ins for real text and GLUE, built in a test's temporary directory (nothing
from the internet): a corpus of generated sentences, a WordPiece tokenizer trained on it with the
``tokenizers`` library and saved as a ``transformers`` tokenizer, and GLUE-shaped SST-2 (one
sentence; the label says whether a positive or a negative word occurs) and MRPC (pairs; the label
says whether both sentences carry the same sentiment) folders.
"""

import random
from pathlib import Path

SUBJECTS = ["the movie", "this film", "the plot", "the actor", "a story", "the music"]
VERBS = ["was", "is", "seemed", "felt", "became"]
POSITIVE = ["good", "great", "fun", "lovely", "brilliant"]
NEGATIVE = ["bad", "dull", "awful", "boring", "weak"]
FILLER = ["very", "quite", "rather", "really", "so", "and", "then", "today", "again"]


def _sentence(rng: random.Random, positive: bool) -> str:
    word = rng.choice(POSITIVE if positive else NEGATIVE)
    extra = " ".join(rng.choice(FILLER) for _ in range(rng.randint(0, 3)))
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {extra} {word} .".replace("  ", " ")


def _tokenizer(corpus: Path, out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "mask_token": "[MASK]"}
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(corpus)], trainers.WordPieceTrainer(vocab_size=200,
                                                       special_tokens=list(special.values())))
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(out)


def _tsv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(header)] + ["\t".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def make_text_assets(root: Path, *, n_docs: int = 300, n_glue: int = 240) -> dict[str, Path]:
    """Writes corpus.txt, tokenizer/ and glue/{SST-2,MRPC}/{train,dev}.tsv under ``root``."""
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(_sentence(rng, rng.random() < 0.5) for _ in range(3))
                                for _ in range(n_docs)) + "\n")
    _tokenizer(corpus, root / "tokenizer")
    for split, n in (("train", n_glue), ("dev", n_glue // 2)):
        labels = [rng.randint(0, 1) for _ in range(n)]
        _tsv(root / "glue" / "SST-2" / f"{split}.tsv", ["sentence", "label"],
             [[_sentence(rng, y == 1), y] for y in labels])
        pairs = []
        for y in labels:
            first = rng.random() < 0.5
            pairs.append([_sentence(rng, first), _sentence(rng, first == (y == 1)), y])
        _tsv(root / "glue" / "MRPC" / f"{split}.tsv", ["sentence1", "sentence2", "label"], pairs)
    return {"corpus": corpus, "tokenizer": root / "tokenizer", "glue": root / "glue"}


def text_spec(assets: dict[str, Path], length: int = 16, glue: bool = True) -> str:
    """The text source's short form for the assets."""
    spec = f"text:{assets['corpus']},tokenizer={assets['tokenizer']},length={length}"
    return spec + (f",glue={assets['glue']}" if glue else "")
