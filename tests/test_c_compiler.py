"""The C compiler as the backend drives it: the kernel shapes it has miscompiled stay right
under the backend's flags (codegen/c/build.py CFLAGS)."""

import subprocess
from pathlib import Path

import pytest
import torch

import eqsat_llm
from eqsat_llm.codegen.c.build import CFLAGS, compiler

FIXTURES = Path(__file__).parent / "c_fixtures"
pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")


def test_strided_simd_copies_keep_their_stores(tmp_path):
    """GCC 12 drops calls to such kernels unless its IPA summaries are off (lost_stores.c)."""
    exe = tmp_path / "lost_stores"
    flags = [f for f in CFLAGS if f not in ("-shared", "-fPIC")]
    subprocess.run([compiler(), *flags, str(FIXTURES / "lost_stores.c"), "-o", str(exe)],
                   check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout


def test_glm4_at_32_tokens_matches_eager():
    """The reported case: two layers of GLM-4 on 32 tokens, no rules (the program's rope and
    head copies are the kernels GCC dropped); wrong on every row before the fix."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Glm4Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=32, vocab_size=512,
                                  intermediate_size=256, pad_token_id=0)
    model = transformers.Glm4ForCausalLM(cfg).eval()
    ids = torch.randint(1, 512, (1, 32))

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).logits

    wrapped = Logits().eval()
    with torch.no_grad():
        want = wrapped(ids)
    compiled = eqsat_llm.optimize(wrapped, (ids,), rules=[], backend="c", measure_eager=False)
    for _ in range(2):
        torch.testing.assert_close(compiled(ids), want, rtol=1e-4, atol=1e-4)
