"""A cold Generator.from_pretrained optimizes its two programs in child processes
(generation/parallel_start.py), starts from the programs and the start record they leave (this
process builds no model), and generates transformers' tokens; a child that fails costs only time."""

import warnings

import pytest
import torch

from eqsat_llm.generation import parallel_start
from eqsat_llm.generation.generator import Generator

from .conftest import private_cache_home

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(parallel_start._cores() < 2, reason="one core")
PROMPT = torch.tensor([[5, 17, 42, 8, 99, 310, 64, 7, 250, 12]])


def _save(path, layers=parallel_start.PARALLEL_MIN_LAYERS):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.3)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    return model


def test_both_programs_come_from_parallel_processes(tmp_path, monkeypatch):
    _save(tmp_path / "ckpt")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a cold start
    gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32, quantize="int8")
    assert gen.report.decode_optimized == gen.report.prefill_optimized == \
        "in a parallel process"
    assert gen.model is None  # the children built it; this process started from their record
    for program in (gen.decode_program, gen.prefill_program):
        assert program.report.program_cache == "hit"
        assert program._runtime.cache_hit  # the child compiled its C too
    assert "decode step optimized in a parallel process" in gen.report.summary()
    warm = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32, quantize="int8")
    # both cached, with the record: no child started
    assert warm.report.decode_optimized == warm.report.prefill_optimized == \
        "by an earlier start"
    assert warm.prefill_program.report.program_cache == "hit"
    monkeypatch.setenv("EQSAT_PARALLEL_START", "0")
    private_cache_home(monkeypatch, tmp_path / "cache-alone")
    alone = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32, quantize="int8")
    assert alone.report.decode_optimized == alone.report.prefill_optimized == "here"
    # int8 (its options derived again in the child): the program equals the one optimized
    # here, tokens and logits
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=6),
                       alone.generate(PROMPT, max_new_tokens=6))
    assert torch.equal(gen.next_token_logits(PROMPT), alone.next_token_logits(PROMPT))


def test_a_child_that_fails_costs_only_time(tmp_path, monkeypatch):
    model = _save(tmp_path / "ckpt")
    want = model.generate(PROMPT, max_new_tokens=6, do_sample=False)
    private_cache_home(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(parallel_start.sys, "executable", "/bin/false")  # exits 1 at once
    gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32)
    for where in (gen.report.decode_optimized, gen.report.prefill_optimized):
        assert where.startswith("here (the child exited with 1")
    assert gen.prefill_program.report.program_cache == "miss"
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=6), want)


def test_when_a_parallel_start_does_not_apply(tmp_path, monkeypatch):
    config = parallel_start.PARALLEL_MIN_LAYERS  # layers
    args = {"max_seq_len": 32, "batch_size": 1, "chunk": 16, "dtype": None}
    shallow = 2
    start = parallel_start.start_workers
    assert start(tmp_path, shallow, **args, options={}) == {}
    # options the child cannot be handed (rule objects, callables): none
    assert start(tmp_path, config, **args, options={"rules": [object()]}) == {}
    monkeypatch.setenv("EQSAT_PARALLEL_START", "0")
    assert start(tmp_path, config, **args, options={}) == {}
    monkeypatch.setenv("EQSAT_PARALLEL_START", "1")
    monkeypatch.setenv("EQSAT_PROGRAM_CACHE", "0")
    assert start(tmp_path, config, **args, options={}) == {}
