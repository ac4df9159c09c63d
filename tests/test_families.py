"""Every causal-LM family transformers ships (eqsat_llm.models.families: enumerated from
transformers' own mapping, configs shrunk generically), at a 32-token prompt and at one token: none
may give a wrong answer, and each keeps the classification benchmarks/families.py recorded in
tests/families_expected.json (compiled / torch steps with these ops / refused with a reason). The
default run keeps a slice of diverse families; the slow set (`-m slow`) runs them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from eqsat_llm.models import families
from eqsat_llm.models.family_check import SEQS, check

EXPECTED = json.loads((Path(__file__).with_name("families_expected.json")).read_text())
# The default slice: forms the model matrix (tests/test_model_matrix.py) does not cover.
# Eager attention with logit softcapping (gemma2); multi-head latent attention with grouped
# expert routing (deepseek_v3); a sliding window the 32-token prompt crosses (mistral); a
# state-space model through torch steps (mamba); ALiBi in eager attention, its repeat as
# layout ops (bloom); a causal mask multiplied into the scores, keys transposed in one permute
# (openai-gpt); a config refused by name (gemma3).
DEFAULT = {"gemma2", "deepseek_v3", "mistral", "mamba", "bloom", "openai-gpt", "gemma3"}
FAMILIES = list(families.families())


def test_every_family_is_enumerated_and_classified():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert set(FAMILIES) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    missing = sorted(set(FAMILIES) - set(EXPECTED))
    import transformers

    assert not missing, (
        f"transformers {transformers.__version__} has families not classified yet (pyproject.toml "
        f"pins the version the classification was made with; after a bump, run "
        f"benchmarks/families.py --write): {missing}")


@pytest.mark.parametrize("family", [f for f in FAMILIES if families.refusal(f)])
def test_refused_by_name_says_why(family):
    with pytest.raises(families.Refused, match=r"\w+ \w+"):
        families.build(family)


@pytest.mark.parametrize("seq", SEQS)
@pytest.mark.parametrize("family", [
    pytest.param(f, marks=[] if f in DEFAULT else [pytest.mark.slow]) for f in FAMILIES])
def test_family_matches_eager_or_refuses(family, seq):
    c = check(family, seq)
    assert c.status != "WRONG", c.reason
    want = EXPECTED.get(family, {}).get(str(seq))
    if want is None:  # a family new to this transformers: right or refused is enough here
        return
    assert c.status == want["status"], (c.status, c.reason, c.torch_ops)
    if c.status == "refused":
        assert len(c.reason) > 10, c.reason
    else:
        assert set(c.torch_ops) <= set(want["torch_ops"]), c.torch_ops
        # attention fused where it was: a softmax over scores left outside the kernel
        assert c.softmax <= want.get("unfused_softmax", c.softmax), c.softmax
