"""Text generation (eqsat_llm.Generator): greedy tokens identical to transformers' generate
across families, prompt lengths and batch sizes; ragged prompts and eos; the KV cache written
in place; sampling options; clear errors for what a Generator cannot honour."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import eqsat_llm
from eqsat_llm import EqsatError, Generator
from eqsat_llm.formats.half import FORMAT_OF
from eqsat_llm.generation.generator import _GENERATORS
from eqsat_llm.generation.kv_cache import CachedStep
from eqsat_llm.models.model_matrix import ENCODERS, FAMILIES, SIZES, build

MAX_LEN, CHUNK = 64, 8
# a prompt shorter than one chunk (padded) and one that ends mid-chunk (last chunk moved back)
PROMPTS = (5, 19)


# a LLaMA deep enough for its layers to be traced once and spliced (capture/stamping.py)
STAMPED = "llama-5-layers"


def causal_lm(family: str) -> torch.nn.Module:
    if family == STAMPED:
        torch.manual_seed(0)
        return FAMILIES["llama"]({**SIZES["small"], "layers": 5}, "sdpa").eval()
    return build(family, seq=1)[0].model


def prompt(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 7 * length + batch)
    return torch.randint(3, 999, (batch, length), generator=gen)


def quiet_generator(model: torch.nn.Module, max_len: int, **kw) -> Generator:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecations while exporting
        return Generator(model, max_len, **kw)


def reference(model: torch.nn.Module, ids: torch.Tensor, new: int, **kw) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mask = kw.pop("attention_mask", torch.ones_like(ids))
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              **kw)


@pytest.fixture(scope="module", params=["llama", "gpt2", "falcon", STAMPED])
def family_generator(request):
    model = causal_lm(request.param)
    gen = quiet_generator(model, MAX_LEN, batch_size=2, prefill_chunk=CHUNK)
    return request.param, model, gen


# a short prompt alone and a longer one in a batch of two by default; the other pairs slow
@pytest.mark.parametrize(("length", "batch"), [
    (5, 1), (19, 2), pytest.param(5, 2, marks=pytest.mark.slow),
    pytest.param(19, 1, marks=pytest.mark.slow)], ids=["5-1", "19-2", "5-2", "19-1"])
def test_greedy_tokens_are_transformers_generate(family_generator, batch, length):
    family, model, gen = family_generator
    ids = prompt(batch, length)
    got = gen.generate(ids, max_new_tokens=12)
    want = reference(model, ids, 12)
    assert got.dtype == torch.long and got.shape == (batch, length + 12)
    assert torch.equal(got, want), (family, got[:, length:], want[:, length:])


def test_both_programs_run_in_c_and_write_the_cache_in_place(family_generator):
    gen = family_generator[2]
    layers = len(gen.caches) // 2
    for program in (gen.decode_program, gen.prefill_program):
        report = program.report
        assert report.backend == "c"
        # the first layer traced, the others spliced, each writing its own cache in place
        assert report.stamped_calls == (layers - 1 if layers >= 4 else 0)
        assert report.state_in_place == 2 * layers  # every K and V write: no copy back
        # no torch step: the cache writes too run in C, in place (emit_gather.emit_row_write)
        assert report.torch_ops == {}, report.torch_ops
        assert report.op_counts_after.get("attention") == layers
        # the report format optimize() gives: each kernel with the rules that built it
        attention = [k for k in report.kernels if k["op"] == "attention"]
        assert len(attention) == layers and all(k["rules"] for k in attention)
    # the two programs hold one copy of the weights they prepare alike
    decode = {w.untyped_storage().data_ptr() for w in gen.decode_program._runtime.weights}
    prefill = {w.untyped_storage().data_ptr() for w in gen.prefill_program._runtime.weights}
    assert len(decode & prefill) >= layers
    report = gen.report
    assert 0 < report.prepared_bytes < sum(report.prepared_alone)
    caches_before = [(c.data_ptr(), c.clone()) for c in gen.caches]
    ids = prompt(1, 11, seed=3)
    gen.generate(ids, max_new_tokens=6)
    for (ptr, old), cache in zip(caches_before, gen.caches):
        assert cache.data_ptr() == ptr  # the same storage across prefill and decode steps
        assert not torch.equal(cache[0, :, :16], old[0, :, :16])  # written there
    # the prompt and all new tokens but the last are in the cache, as eager computes them
    assert bool(gen.caches[0][0, :, 11 + 5 - 1].abs().sum() > 0)


def test_the_cache_holds_kv_heads_not_repeated_ones():
    model = causal_lm("llama")
    gen = quiet_generator(model, 32, prefill_chunk=4)
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    assert gen.caches[0].shape == (1, cfg.num_key_value_heads, 32,
                                   cfg.hidden_size // cfg.num_attention_heads)
    report = gen.report
    assert report.cache_bytes == sum(c.numel() * 4 for c in gen.caches)
    text = report.summary()
    for part in ("KV cache", "prefill program (4 tokens per chunk)", "decode program (1 token)",
                 "arenas: prefill", "attention"):
        assert part in text, part
    assert set(report.to_dict()) >= {"prefill", "decode", "cache_bytes", "cache_shape"}


def test_ragged_prompts_with_left_padding_and_eos_match_transformers():
    model = causal_lm("llama")
    ids = prompt(3, 12, seed=5)
    mask = torch.ones_like(ids)
    mask[1, :4], mask[2, :7] = 0, 0
    ids = ids.masked_fill(mask == 0, 0)
    gen = quiet_generator(model, MAX_LEN, batch_size=3, prefill_chunk=CHUNK)
    want = reference(model, ids, 10, attention_mask=mask)
    assert torch.equal(gen.generate(ids, 10, attention_mask=mask), want)
    eos = int(want[0, 14])  # row 0 stops at its third new token; the others go on
    got = gen.generate(ids, 10, attention_mask=mask, eos_token_id=eos)
    want = reference(model, ids, 10, attention_mask=mask, eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(got, want)
    assert (got[0, 15:] == eos).all()


def test_generation_stops_when_every_sequence_has_ended():
    model = causal_lm("gpt2")
    gen = quiet_generator(model, 32, prefill_chunk=4)
    ids = prompt(1, 6)
    first = int(gen.generate(ids, 1)[0, -1])
    out = gen.generate(ids, 20, eos_token_id=[first, 998])
    assert out.shape == (1, 7) and int(out[0, -1]) == first
    model.generation_config.eos_token_id = first  # by default, the model's eos, as transformers
    assert torch.equal(gen.generate(ids, 20), reference(model, ids, 20))
    assert gen.generate(ids, 20).shape == (1, 7)
    assert gen.generate(ids, 20, eos_token_id=[]).shape == (1, 26)  # [] never stops


def test_one_generator_serves_two_threads_one_generation_at_a_time():
    model = causal_lm("llama")
    gen = quiet_generator(model, 32, prefill_chunk=4)
    prompts = [prompt(1, 5, seed=s) for s in range(4)]
    want = [gen.generate(p, 8) for p in prompts]
    results: dict[int, torch.Tensor] = {}

    def run(k: int) -> None:
        for _ in range(3):
            results[k] = gen.generate(prompts[k], 8)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(results[k], want[k]) for k in range(4))


def test_sampling_options():
    model = causal_lm("llama")
    gen = quiet_generator(model, 32, prefill_chunk=4)
    ids = prompt(1, 6)
    greedy = gen.generate(ids, 8)
    assert torch.equal(gen.generate(ids, 8, do_sample=True, top_k=1), greedy)
    assert torch.equal(gen.generate(ids, 8, do_sample=True, top_p=1e-6), greedy)

    def sample(seed: int) -> torch.Tensor:
        return gen.generate(ids, 8, do_sample=True, temperature=5.0, top_k=50, top_p=0.95,
                            generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(1), sample(1))  # a seeded generator repeats
    assert any(not torch.equal(sample(1), sample(s)) for s in (2, 3, 4))
    with pytest.raises(EqsatError, match="temperature"):
        gen.generate(ids, 8, do_sample=True, temperature=0.0)


def test_what_cannot_be_honoured_is_refused_clearly():
    model = causal_lm("llama")
    gen = quiet_generator(model, 16, prefill_chunk=4)
    with pytest.raises(EqsatError, match="exceeds max_seq_len=16"):
        gen.generate(prompt(1, 17), 1)
    with pytest.raises(EqsatError, match="exceeds max_seq_len=16"):
        gen.generate(prompt(1, 10), 7)
    with pytest.raises(EqsatError, match="batch_size=1"):
        gen.generate(prompt(2, 4), 2)
    with pytest.raises(EqsatError, match="integer tensor"):
        gen.generate(torch.randn(1, 4), 2)
    with pytest.raises(EqsatError, match="attention_mask"):
        gen.generate(prompt(1, 4), 2, attention_mask=torch.ones(1, 5))
    with pytest.raises(EqsatError, match="max_position_embeddings"):
        Generator(model, 100_000)
    with pytest.raises(EqsatError, match="config"):
        Generator(torch.nn.Linear(4, 4), 16)


def test_generate_builds_one_generator_per_model_and_reuses_it():
    model = causal_lm("qwen3")
    ids = prompt(1, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = eqsat_llm.generate(model, ids, max_new_tokens=5, prefill_chunk=CHUNK)
        assert torch.equal(got, reference(model, ids, 5))
        (gen,) = _GENERATORS[model].values()
        assert gen.max_seq_len == 256  # the default size: at least 256 positions
        eqsat_llm.generate(model, prompt(1, 30), max_new_tokens=9, prefill_chunk=CHUNK)
    assert list(_GENERATORS[model].values()) == [gen]  # reused: no second compile


CAUSAL = sorted(set(FAMILIES) - ENCODERS)


@pytest.mark.slow  # ~8 s per family
@pytest.mark.parametrize("family", CAUSAL)
def test_every_causal_family_of_the_matrix_generates_transformers_tokens(family):
    model = causal_lm(family)
    gen = quiet_generator(model, MAX_LEN, batch_size=2, prefill_chunk=CHUNK)
    ids = prompt(2, 11)
    assert torch.equal(gen.generate(ids, 10), reference(model, ids, 10)), family
    for program in (gen.decode_program, gen.prefill_program):
        assert program.report.backend == "c"
        assert program.report.state_in_place == len(gen.caches)


def test_partial_rotary_prefill_logits_match_eager():
    """StableLM's 4-wide partial rotary in the cached step: the planner lays the rope's output
    out with heads interleaved, where GCC 12 miscompiled the rope kernel's annotated loop
    (logits off by 3e-2; codegen/c/emit_elementwise.emit_rope)."""
    model = causal_lm("stablelm")
    step = CachedStep(model, 1, 32)
    ids = prompt(1, 8)
    mask = torch.zeros(1, 32, dtype=torch.long)
    mask[:, :8] = 1
    args = (ids, torch.tensor(0), torch.arange(8)[None], mask, torch.tensor([7]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = eqsat_llm.optimize(step, args, measure_eager=False)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits[:, -1:]
    torch.testing.assert_close(compiled(*args), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16,
                                   pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_half_precision_model_generates_with_a_float32_cache_and_half_weights(dtype):
    # computed in float32 on the C backend (formats/half.py): the cache float32 too (not widened on
    # every call), the GEMM weights in the model's dtype
    lm = causal_lm("llama").to(dtype)
    gen = quiet_generator(lm, 32, prefill_chunk=8)
    assert gen.step.caches()[0].dtype == torch.float32
    fmt = FORMAT_OF[str(dtype).removeprefix("torch.")]
    for program in (gen.decode_program, gen.prefill_program):
        assert set(program.report.weight_formats) == {fmt}, program.report.weight_formats
        ops = program.report.torch_ops  # the logits' conversion (the cache writes run in C)
        assert ops == {"to_dtype": 1}, ops
    ids = prompt(1, 11)
    out = gen.generate(ids, max_new_tokens=4, eos_token_id=[])
    assert out.shape == (1, 15) and torch.equal(out[:, :11], ids)
    for program in (gen.decode_program, gen.prefill_program):
        assert program.report.backend == "c" and program.report.computed_in_float32
    with torch.no_grad():  # the first new token: eager's in the model's dtype, or a near tie
        logits = lm(ids).logits[:, -1].float()
    top2 = logits.topk(2).values[0]
    assert int(out[0, 11]) == int(logits.argmax()) or float(top2[0] - top2[1]) < 0.05
