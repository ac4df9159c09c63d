"""An embedding table whose float32 values are all bfloat16 ones is held as bf16 bits and
widened as gathered (codegen/c/half_table.py): the same output as eager, half the bytes."""

import pytest
import torch
from torch import nn

import eqsat_llm
from eqsat_llm.codegen.c.errors import KernelIndexError


class Lookup(nn.Module):
    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.emb = nn.Embedding.from_pretrained(table)

    def forward(self, ids):
        return self.emb(ids) * 2.0


def _held(compiled, dtype, shape):
    return [w for w in compiled._runtime.weights if w.dtype == dtype and tuple(w.shape) == shape]


def test_a_bf16_valued_table_is_held_in_bf16_and_gathers_exactly():
    table = torch.randn(300, 48, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[0, 7, 299, 42, 7]])
    for exact in (True, False):
        values = table.bfloat16().float() if exact else table
        model = Lookup(values).eval()
        compiled = eqsat_llm.optimize(model, (ids,), backend="c")
        assert torch.equal(compiled(ids), model(ids))
        assert bool(_held(compiled, torch.int16, (300, 48))) == exact
        assert bool(_held(compiled, torch.float32, (300, 48))) != exact  # one form only


def test_a_bad_id_is_still_refused():
    model = Lookup(torch.randn(10, 8).bfloat16().float()).eval()
    compiled = eqsat_llm.optimize(model, (torch.tensor([[1, 2]]),), backend="c")
    with pytest.raises(KernelIndexError):
        compiled(torch.tensor([[1, 10]]))
