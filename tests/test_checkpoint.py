"""Generator.from_pretrained: a checkpoint directory read one tensor at a time into the programs'
prepared weights (generation/checkpoint.py, weights/lazy_weights.py), against transformers' own run
of the same checkpoint; and every bad directory a clear EqsatError naming the file or tensor."""

import json
import shutil
import warnings

import pytest
import torch

from eqsat_llm.errors import EqsatError
from eqsat_llm.generation.generator import Generator

from .conftest import private_cache_home

transformers = pytest.importorskip("transformers")
PROMPT = torch.tensor([[5, 17, 42, 8, 99, 310, 64, 7, 250, 12, 3, 77]])


def _save(path, dtype=torch.float32, tied=True, shard="200KB"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.3, tie_word_embeddings=tied)  # wide weights: greedy tokens vary
    model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path, max_shard_size=shard)
    return model


@pytest.mark.parametrize("dtype,tied", [(torch.float32, True), (torch.bfloat16, False)])
def test_generates_transformers_tokens_from_a_sharded_checkpoint(tmp_path, dtype, tied,
                                                                monkeypatch):
    private_cache_home(monkeypatch, tmp_path / "cache")  # a first start: the model
    model = _save(tmp_path, dtype, tied)  # built (a later one starts from the start record)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1  # shards and their index
    want = model.generate(PROMPT, max_new_tokens=8, do_sample=False)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32)
    assert all(p.is_meta for p in gen.model.parameters())  # the model was never loaded
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=8), want)


def test_a_half_checkpoint_runs_as_a_float32_model(tmp_path, monkeypatch):
    """dtype=float32 from bf16 shards: each GEMM weight's panels packed straight from its
    stored bf16 bytes (the merged q, k, v part by part), tokens as transformers' widened
    model gives them."""
    private_cache_home(monkeypatch, tmp_path / "cache")
    model = _save(tmp_path, torch.bfloat16, tied=False).float()
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32, dtype=torch.float32)
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=8),
                       model.generate(PROMPT, max_new_tokens=8, do_sample=False))


def test_quantized_at_load_equals_quantizing_the_loaded_model(tmp_path):
    model = _save(tmp_path)
    want = Generator(model, 32, quantize="int8").generate(PROMPT, max_new_tokens=6)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int8")
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=6), want)


def test_bad_checkpoints_name_the_file_or_tensor(tmp_path):
    _save(tmp_path / "good", shard="10GB")
    with pytest.raises(EqsatError, match="not a checkpoint directory"):
        Generator.from_pretrained(tmp_path / "absent", max_seq_len=32)
    no_config = shutil.copytree(tmp_path / "good", tmp_path / "no_config")
    (no_config / "config.json").unlink()
    with pytest.raises(EqsatError, match="no config.json"):
        Generator.from_pretrained(no_config, max_seq_len=32)
    truncated = shutil.copytree(tmp_path / "good", tmp_path / "truncated")
    shard = truncated / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(EqsatError, match="model.safetensors"):
        Generator.from_pretrained(truncated, max_seq_len=32)
    reshaped = shutil.copytree(tmp_path / "good", tmp_path / "reshaped")
    cfg = json.loads((reshaped / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the MLP weights on disk are 128 wide
    (reshaped / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EqsatError, match=r"mlp\.\w+_proj\.weight has shape"):
        Generator.from_pretrained(reshaped, max_seq_len=32)


def test_a_missing_shard_is_named(tmp_path):
    _save(tmp_path)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(EqsatError, match=f"{shards[-1].name}: a shard the index names"):
        Generator.from_pretrained(tmp_path, max_seq_len=32)


def test_quantized_weights_are_held_once_by_both_programs(tmp_path):
    """From a bf16 checkpoint with int4, the prefill program would pick the bf16 form of a
    weight the decode program holds as int4; a Generator shares the quantized form."""
    _save(tmp_path, torch.bfloat16, tied=False)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int4_g32")

    def large(program):
        return {w.untyped_storage().data_ptr() for w in program._runtime.weights
                if w.numel() >= 4096}

    decode, prefill = large(gen.decode_program), large(gen.prefill_program)
    assert decode and prefill == decode
    assert gen.decode_program.report.weight_formats == gen.prefill_program.report.weight_formats


def test_float32_weights_are_packed_once_for_both_programs(tmp_path):
    """The two programs fuse the RMSNorm into different GEMMs (the merged QKV at prefill; q,
    k, v, gate and up apart at decode) and merge weights differently: each packed weight is
    still held once (the norm weight applied to the activations, not folded into packed rows;
    a merged weight's panel-aligned parts shared), and nothing is held as stored beside its
    packed form."""
    model = _save(tmp_path, torch.float32, tied=False)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32)
    linear = sum(m.weight.numel() * 4 for m in model.modules()
                 if isinstance(m, torch.nn.Linear))
    embedding = model.model.embed_tokens.weight.numel() * 4
    # each linear weight packed once (panels of 32 columns: these widths need no padding),
    # the embedding table as stored, small vectors (norm weights, rotary tables) beside
    assert gen.report.prepared_bytes <= 1.05 * (linear + embedding)
    assert torch.equal(gen.generate(PROMPT, max_new_tokens=6),
                       model.generate(PROMPT, max_new_tokens=6, do_sample=False))


def test_each_weight_is_read_and_quantized_once_and_held_only_prepared(tmp_path, monkeypatch):
    """The second program takes the first's prepared weights (made from the same recipe: no
    second read or quantization), and no program holds a quantized constant beside the
    panels its kernel reads."""
    from eqsat_llm.generation.checkpoint import Checkpoint

    private_cache_home(monkeypatch, tmp_path / "cache")  # a first start
    saved = _save(tmp_path, torch.bfloat16, tied=False)
    reads: dict[str, int] = {}
    read = Checkpoint.tensor

    def counting(self, key):
        reads[key] = reads.get(key, 0) + 1
        return read(self, key)

    monkeypatch.setattr(Checkpoint, "tensor", counting)
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int4_g32")
    # every weight read once, though the programs merge q, k and v in other orders and the
    # decode step reads the SwiGLU weight's halves apart (views of the prefill's panels)
    assert set(reads.values()) == {1}
    assert gen.report.weights_read_bytes == sum(t.numel() * t.element_size()
                                                for t in saved.state_dict().values())
    prefill_storages = {w.untyped_storage().data_ptr()
                        for w in gen.prefill_program._runtime.weights}
    decode_panels = [w for w in gen.decode_program._runtime.weights
                     if w.dtype == torch.uint8 and w.numel()]
    assert decode_panels and all(w.untyped_storage().data_ptr() in prefill_storages
                                 for w in decode_panels)
    for program in (gen.decode_program, gen.prefill_program):
        quantized = [w for w in program._runtime.weights if w.dtype == torch.uint8 and w.numel()]
        assert quantized and all(w.dim() == 3 for w in quantized)  # panels, never [K / 2, N]
    ids = PROMPT[:, :6]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    want = Generator(model, 32, quantize="int4_g32").generate(ids, max_new_tokens=4)
    assert torch.equal(gen.generate(ids, max_new_tokens=4), want)


def test_next_token_logits_match_transformers(tmp_path):
    model = _save(tmp_path)
    with torch.no_grad():
        want = model(PROMPT).logits[:, -1]
    gen = Generator.from_pretrained(tmp_path, max_seq_len=32)
    got = gen.next_token_logits(PROMPT)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_a_large_weight_is_quantized_a_slice_of_its_rows_at_a_time(tmp_path, monkeypatch):
    from eqsat_llm.generation.checkpoint import Checkpoint
    from eqsat_llm.weights import lazy_weights

    _save(tmp_path, torch.bfloat16, tied=False)
    whole = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int4")
    monkeypatch.setattr(lazy_weights, "SLICE_ELEMENTS", 64 * 40)  # every GEMM weight sliced
    read = []
    rows = Checkpoint.rows
    monkeypatch.setattr(Checkpoint, "rows", lambda self, key, a, b: read.append((key, a, b))
                        or rows(self, key, a, b))
    sliced = Generator.from_pretrained(tmp_path, max_seq_len=32, quantize="int4")
    # the LM head [400, 64] read 40 rows at a time; q (merged with k, v), gate and up too
    assert [(a, b) for k, a, b in read if k == "lm_head.weight"] == \
        [(a, min(a + 40, 400)) for a in range(0, 400, 40)]
    assert {k.split(".")[-2] for k, _, _ in read} >= {"q_proj", "gate_proj", "up_proj"}
    assert torch.equal(sliced.next_token_logits(PROMPT), whole.next_token_logits(PROMPT))
    assert torch.equal(sliced.generate(PROMPT, max_new_tokens=6),
                       whole.generate(PROMPT, max_new_tokens=6))


def _matrix_checkpoint(path, family):
    """A model-matrix family's small random model saved as a checkpoint, its ids, and
    transformers' greedy tokens from it."""
    from eqsat_llm.models.model_matrix import build

    wrapped, (ids,) = build(family, seq=8)
    model = wrapped.model
    model.config.use_cache = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
        want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    return ids, want


# (falcon: the next test; the default run keeps a dense and a mixture family)
MATRIX_DEFAULT = {"gptj", "qwen2_moe"}
MATRIX = ["llama", "qwen3", "granite", "olmo2", "stablelm", "starcoder2", "mixtral",
          "qwen2_moe", "olmoe", "phimoe", "deepseek_v3", "gpt_oss", "gptj", "gpt2", "opt"]


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=[] if f in MATRIX_DEFAULT else [pytest.mark.slow]) for f in MATRIX])
def test_every_matrix_family_from_its_checkpoint_gives_transformers_tokens(
        tmp_path, monkeypatch, family):
    private_cache_home(monkeypatch, tmp_path / "cache")
    ids, want = _matrix_checkpoint(tmp_path / "ckpt", family)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback: planned from the checkpoint
        warnings.filterwarnings("ignore", module="transformers")
        gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32)
    assert torch.equal(gen.generate(ids, max_new_tokens=6, eos_token_id=[]), want)


def test_a_model_that_makes_tensors_as_it_runs_is_loaded_whole(tmp_path, monkeypatch):
    """Falcon's attention makes index tensors in forward (lifted by export): a meta model has
    no values for them and the checkpoint does not hold them, so from_pretrained says so and
    plans the model transformers loads (it used to stop with 'no parameter or buffer')."""
    private_cache_home(monkeypatch, tmp_path / "cache")
    ids, want = _matrix_checkpoint(tmp_path / "ckpt", "falcon")
    with pytest.warns(UserWarning, match="tensors as it runs that the checkpoint does not"):
        gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32)
    assert torch.equal(gen.generate(ids, max_new_tokens=6, eos_token_id=[]), want)
