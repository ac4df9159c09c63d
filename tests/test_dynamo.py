"""torch.compile(model, backend="eqsat_llm")."""

import torch

from eqsat_llm.api import Compiled
from eqsat_llm.workloads import llama_block_case


def test_backend_is_registered():
    import eqsat_llm  # noqa: F401

    assert "eqsat_llm" in torch._dynamo.list_backends()


def test_torch_compile_runs_the_block(monkeypatch):
    calls = []
    original = Compiled.__call__

    def counting_call(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Compiled, "__call__", counting_call)
    torch._dynamo.reset()
    model, inputs = llama_block_case("decode")
    compiled = torch.compile(model, backend="eqsat_llm")
    with torch.no_grad():
        got, expected = compiled(*inputs), model(*inputs)
    assert calls, "the eqsat_llm program did not run"
    assert (got - expected).abs().max().item() <= 1e-5
    torch._dynamo.reset()
