"""The compiled loss is one graph: ``torch.compile(..., fullgraph=True)`` raises at any graph
break, forward and backward (the aot_eager backend traces both without Inductor's compile
time). The break this guards against: the registry's hooks imported their module inside the
compiled loss (``importlib.import_module`` cannot be traced; ``architectures._Lazy`` now reads
an imported module from ``sys.modules``)."""

import dataclasses
import importlib

import pytest
import torch

from flatlm.models import build_model, parse_model
from flatlm.sources import load
from flatlm.train.algorithms import mlm_loss_sum
from flatlm.train.data import generator, mask_batch
from flatlm.train.rows import into_rows, row_loss_sum

LAYOUTS = {"padded": (mlm_loss_sum, lambda b: b),
           "rows": (row_loss_sum, lambda b: into_rows(b, row_length=64, sentences=len(b)))}


def _one_graph(fn, *args):
    torch._dynamo.reset()
    loss = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    loss.backward()
    return loss


@pytest.mark.parametrize("mask", ["one", 0.3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_compiled_loss_has_no_graph_break(layout, mask):
    src = load("pcfg:paper")
    model = build_model(dataclasses.replace(parse_model("d16-h2-l1-i32"), dropout=0.1), src.V,
                        src.max_length, seed=0)
    tokens, lengths = src.sample(12, 0)
    batch = mask_batch(tokens, lengths, mask, generator(0, "mask", 0), n_words=src.V)
    loss_sum, arrange = LAYOUTS[layout]
    assert torch.isfinite(_one_graph(loss_sum, model, arrange(batch)))
    assert all(p.grad is not None for p in model.parameters())


def test_a_planted_import_breaks_the_graph_and_is_caught():
    """The harness can fail: an import inside the compiled function is a graph break."""
    def with_import(x):
        return importlib.import_module("torch.nn.functional").relu(x).sum()

    with pytest.raises(Exception, match="import_module"):
        _one_graph(with_import, torch.randn(3, requires_grad=True))
