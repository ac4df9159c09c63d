"""A causal mask multiplied into the scores (OpenAI-GPT's `w * b + -1e4 * (1 - b)`, b a
constant of 0s and 1s): read as an additive bias only where every row keeps a key
(analysis.keep_mask, rule softmax-keep-mask-as-bias), and eager's answer either way."""

import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.egraph.encode import is_keep_mask


class MaskedScores(torch.nn.Module):
    def __init__(self, first_key: int):
        super().__init__()
        self.first_key = first_key  # the column the mask's slice starts at
        self.register_buffer("b", torch.ones(40, 40).tril().view(1, 1, 40, 40),
                             persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t, f = q.shape[2], self.first_key
        w = q @ k.transpose(-1, -2) / 4.0
        b = self.b[:, :, :t, f:f + t]
        w = w * b + -1e4 * (1 - b)
        return torch.softmax(w, -1) @ v


def _rule_used(compiled, name: str) -> bool:
    return any(r.name == name and r.used for r in compiled.report.rules)


@pytest.mark.parametrize("first_key,fires", [(0, True), (1, False)])
def test_keep_mask_becomes_a_bias_only_where_every_row_keeps_a_key(first_key, fires):
    torch.manual_seed(0)
    model = MaskedScores(first_key).eval()
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    compiled = optimize(model, (q, k, v), backend="c", measure_eager=False)
    # a slice from column 1 leaves row 0 with no kept key: eager's row is uniform there,
    # an additive bias would not be
    assert _rule_used(compiled, "softmax-keep-mask-as-bias") == fires
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), atol=1e-5, rtol=1e-5)


def test_keep_masks_are_zeros_and_ones_starting_each_row_with_a_one():
    tril = torch.ones(6, 6).tril()
    assert is_keep_mask(tril) and is_keep_mask(tril.double())
    assert not is_keep_mask(tril.flip(-1))  # row 0 starts with a 0
    assert not is_keep_mask(tril * 0.5 + 0.5 * torch.eye(6))  # a 0.5 (and rows ending in 1)
    assert not is_keep_mask(tril.bool())  # a bool mask is where(), not a product
    assert not is_keep_mask(torch.ones(6, 6, device="meta"))
