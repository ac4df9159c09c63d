"""The model matrix: transformers families as users load them (sdpa attention by default, eager
as well; grouped-query attention where the family has it; the library's masking utilities),
built offline from small configs with random weights, at prefill and one-token shapes. Each
must match eager, run on the C backend, and show its fused ops; with sdpa at prefill the same
program also runs on the Triton backend (in its interpreter) and must match eager too. The slow
set runs larger configs (`-m slow`)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from eqsat_llm import optimize
from eqsat_llm.models.model_matrix import EAGER_ONLY, ENCODERS, FAMILIES, build

pytest.importorskip("transformers")

# every family compiles whole on C, its experts' routing and GEMMs included
TORCH_ALLOWED: set[str] = set()
NORMS = ("rms_norm", "layer_norm", "gemm[rms_norm]")
# ops the Triton backend runs as torch steps: top-k (torch's own on its device: docs/moe.md)
# and the reductions and gathers around it; expert_mm, argmax and scatter_value are Triton
# kernels
MOE_TRITON_STEPS = {"topk_values", "topk_indices", "sum", "bitwise_not", "gather", "amax"}
MOE = {"mixtral", "qwen2_moe", "olmoe", "phimoe", "deepseek_v3", "gpt_oss"}
TRITON_TORCH_STEPS = dict.fromkeys(MOE, MOE_TRITON_STEPS)


def _check(family: str, attn: str, seq: int, size: str) -> None:
    model, inputs = build(family, attn=attn, seq=seq, size=size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = optimize(model, inputs, measure_eager=False)
    report = compiled.report
    fallbacks = [str(w.message) for w in caught if "Fallback" in w.category.__name__]
    assert report.backend == "c", fallbacks
    torch_ops = getattr(report, "torch_ops", {}) or {}
    if family not in TORCH_ALLOWED:
        assert not report.fallback_ops and not torch_ops, (report.fallback_ops, torch_ops)
        assert not fallbacks, fallbacks
    ops = report.op_counts_after
    layers = 2
    assert ops.get("attention") == layers, ops
    assert sum(ops.get(n, 0) for n in NORMS) >= layers, ops
    # an encoder's GEMMs keep their bias in addmm, as do gpt-oss's biased projections (its
    # one norm-prologue GEMM is the router's)
    if family not in ENCODERS | {"gpt_oss"}:
        # gemms with a prologue or epilogue (the label of a plain one is "gemm")
        assert sum(v for n, v in ops.items() if n.startswith("gemm[")) >= layers, ops
    with torch.no_grad():
        want = model(*inputs)
        for _ in range(2):  # the arena is reused across calls
            torch.testing.assert_close(compiled(*inputs), want, atol=1e-4, rtol=1e-4)
    if (attn == "sdpa" or family in EAGER_ONLY) and size == "small" and seq > 1:
        # the program as Triton kernels
        triton = compiled.on_backend("triton")
        assert set(triton.report.torch_ops) <= TRITON_TORCH_STEPS.get(family, set()), \
            triton.report.torch_ops
        with torch.no_grad(), np.errstate(all="ignore"):
            torch.testing.assert_close(triton(*inputs), want, atol=1e-4, rtol=1e-4)


# The default run stays under its time budget: eager attention for two families (GQA and
# rotary; learned positions), one-token shapes for the families whose decode differs most
# (GQA, parallel attention, learned positions, experts); every case in the slow set.
EAGER_DEFAULT = {"llama", "gpt2"}
ONE_TOKEN_DEFAULT = {"llama", "falcon", "gpt2", "mixtral", "deepseek_v3"}


def _marks(family: str, attn: str, seq: int) -> list:
    default = (attn == "sdpa" or family in EAGER_DEFAULT | EAGER_ONLY) and (
        seq > 1 or family in ONE_TOKEN_DEFAULT)
    return [] if default else [pytest.mark.slow]


CASES = [pytest.param(family, attn, seq, marks=_marks(family, attn, seq),
                      id=f"{family}-{attn}-{'prefill' if seq > 1 else 'one-token'}")
         for family in sorted(FAMILIES) for attn in ("sdpa", "eager") for seq in (16, 1)
         if not (family in EAGER_ONLY and attn == "sdpa")]


@pytest.mark.parametrize(("family", "attn", "seq"), CASES)
def test_family_compiles_fused_and_matches_eager(family, attn, seq):
    _check(family, attn, seq, "small")


@pytest.mark.slow
@pytest.mark.parametrize("seq", [64, 1], ids=["prefill", "one-token"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_medium(family, seq):
    _check(family, "sdpa", seq, "medium")
