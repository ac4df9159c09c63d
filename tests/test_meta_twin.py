"""A loaded model's Generator is planned on its meta twin (meta.meta_twin) and its prepared
weights made at load from the model's own tensors (meta.ParameterSource): the same programs
and logits as folding them while optimizing, with less held beside the model."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from eqsat_llm import EqsatError, Generator
from eqsat_llm.generation import generator as generator_module
from eqsat_llm.models.model_matrix import build
from eqsat_llm.weights.meta import ParameterSource, meta_twin, plans_on_meta

from .test_generation import prompt, reference


def causal_lm(family: str) -> torch.nn.Module:
    return build(family, seq=1)[0].model


def generator(model: torch.nn.Module, **kw) -> Generator:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecations while exporting
        return Generator(model, 32, prefill_chunk=8, **kw)


def test_the_twin_holds_no_weight_bytes_and_keeps_ties():
    model = causal_lm("gpt2")  # its LM head is tied to the token embedding
    twin = meta_twin(model)
    assert all(t.is_meta for t in (*twin.parameters(), *twin.buffers()))
    assert not any(t.is_meta for t in model.parameters())  # the model untouched
    assert twin.lm_head.weight is twin.transformer.wte.weight
    own = ParameterSource(model)
    # a graph name under a wrapper resolves to the model's own tensor, not a copy
    assert own("step.model.lm_head.weight").data_ptr() == model.lm_head.weight.data_ptr()
    assert own.missing(["step.model.transformer.h.0.attn.c_attn.weight",
                        "step.model.lifted_tensor_0"]) == ["step.model.lifted_tensor_0"]
    with pytest.raises(EqsatError, match="lifted_tensor_0"):
        own("step.model.lifted_tensor_0")


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_planned_on_the_twin_it_computes_what_folding_computes_and_holds_less(
        monkeypatch, quantize):
    torch.manual_seed(0)
    equal = causal_lm("llama")
    with monkeypatch.context() as m:
        m.setattr(generator_module, "_on_meta_twin", lambda *a: False)
        folded = generator(equal, quantize=quantize)  # its constants interned, and live
    assert folded.report.weights_from == "folded"
    # a model of equal values but its own storage: its programs hold its tensors, never the
    # other live program's equal ones
    model = copy.deepcopy(equal)
    twin = generator(model, quantize=quantize)
    assert twin.report.weights_from == "model"
    assert "from the model's own tensors" in twin.report.summary()
    ids = torch.randint(3, 999, (1, 13), generator=torch.Generator().manual_seed(1))
    assert torch.equal(twin.next_token_logits(ids), folded.next_token_logits(ids))
    assert torch.equal(twin.generate(ids, 6), folded.generate(ids, 6))
    assert twin.report.prepared_bytes <= folded.report.prepared_bytes
    # a weight its kernel reads as stored is the model's own tensor, never a copy of it
    own = {p.untyped_storage().data_ptr(): p for p in (*model.parameters(), *model.buffers())}
    held = [w for program in (twin.decode_program, twin.prefill_program)
            for w in program._runtime.weights if w.numel()]
    for w in held:
        if w.untyped_storage().data_ptr() not in own:
            assert not any(p.shape == w.shape and p.dtype == w.dtype and torch.equal(p, w)
                           for p in own.values())
    assert any(w.untyped_storage().data_ptr() in own for w in held)
    # the report says which of the model's tensors are read so, and what both programs share
    report = twin.report
    read = {w.untyped_storage().data_ptr() for w in held} & own.keys()
    assert report.model_tensors_read == (len(read), sum(own[k].untyped_storage().nbytes()
                                                        for k in read))
    assert report.shared[0] > 0
    assert report.shared[1] == sum(report.prepared_alone) - report.prepared_bytes
    assert "held once for both programs" in report.summary()


def test_a_bf16_models_twin_keeps_its_weights_bf16():
    """A bf16 model's weights are half by their dtype on the twin too: bf16 GEMM weights and
    experts (not widened to float32 panels), as folding makes them."""
    gen = generator(causal_lm("mixtral").to(torch.bfloat16))
    assert gen.report.weights_from == "model"
    for program in (gen.decode_program, gen.prefill_program):
        assert {n.attrs["weight"] for n in program.graph.nodes
                if n.op in ("gemm", "expert_mm")} == {"bf16"}


@pytest.mark.parametrize("family", ["llama", pytest.param("mixtral", marks=pytest.mark.slow)])
def test_a_half_checkpoint_loaded_as_float32_is_planned_on_the_twin_and_kept_half(
        monkeypatch, family):
    """float32 weights that fit bfloat16 exactly (a bf16 checkpoint loaded as float32: only
    the values tell) are read off the loaded model (meta.exact_half_of), so the twin's
    programs choose the formats folding chooses (the mixture's bf16 experts and GEMMs), hold
    no more, and give transformers' tokens."""
    model = causal_lm(family)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    assert plans_on_meta(model)
    with monkeypatch.context() as m:
        m.setattr(generator_module, "_on_meta_twin", lambda *a: False)
        folded = generator(copy.deepcopy(model))
    gen = generator(model)
    assert gen.report.weights_from == "model" and folded.report.weights_from == "folded"

    def formats(g: Generator) -> list[set[str]]:
        return [{n.attrs["weight"] for n in p.graph.nodes if n.op in ("gemm", "expert_mm")}
                for p in (g.decode_program, g.prefill_program)]
    assert formats(gen) == formats(folded)
    if family == "mixtral":
        assert formats(gen) == [{"bf16"}, {"bf16"}]
    assert gen.report.prepared_bytes <= folded.report.prepared_bytes
    ids = prompt(1, 9)
    assert torch.equal(gen.generate(ids, 5), reference(model, ids, 5))


def test_what_the_twin_cannot_stand_in_for_is_folded_as_before():
    # a constant made in forward (falcon's, lifted by export) has values only the model has
    assert generator(causal_lm("falcon")).report.weights_from == "folded"


def test_experts_are_planned_on_the_twin_and_packed_from_the_weights_as_stored():
    # transformers dispatches its grouped expert GEMM to torch's, whose meta kernel takes
    # bf16 only: planned on the twin, the experts take transformers' fallback
    # (moe_forms.experts_for_capture), and the expert GEMM packs [E, N, K] as stored, with no
    # transposed copy of it folded and held (fold.views_read_in_place)
    model = causal_lm("mixtral")
    gen = generator(model)
    assert gen.report.weights_from == "model"
    experts = {n: p for n, p in model.named_parameters() if p.dim() == 3}
    assert experts
    transposed = {(p.shape[0], p.shape[2], p.shape[1]) for p in experts.values()}
    for program in (gen.decode_program, gen.prefill_program):
        held = [*program._runtime.weights, *program.graph.constants.values()]
        assert not any(tuple(t.shape) in transposed for t in held if t.numel() and not t.is_meta)
        assert not program.report.torch_ops
    ids = prompt(1, 9)
    assert torch.equal(gen.generate(ids, 4), reference(model, ids, 4))


def test_a_model_that_cannot_be_copied_is_planned_as_loaded():
    import threading

    model = causal_lm("llama")
    model.lock = threading.Lock()  # deepcopy refuses it: the twin cannot be made
    assert_folded_and_right(model, prompt=7, new=3, seed=3)


def assert_folded_and_right(model: torch.nn.Module, prompt: int, new: int, seed: int) -> None:
    """The model is planned as loaded (not on its twin) and generates transformers' tokens."""
    gen = generator(model)
    assert gen.report.weights_from == "folded"
    ids = torch.randint(3, 999, (1, prompt), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              do_sample=False)
    assert torch.equal(gen.generate(ids, new), want)
