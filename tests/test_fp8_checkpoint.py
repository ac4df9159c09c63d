"""FP8 checkpoints (quant_method "fp8": float8 weights with 128 x 128 block scales, as
DeepSeek-V3 and the *-FP8 releases store them) read by Generator.from_pretrained as transformers
reads them on a CPU: dequantized block by block (generation/fp8_checkpoint.py). The reference is
the same model with its weights dequantized as transformers' Fp8Dequantize does (float32
product, cast to the model's dtype); before this reader, the float8 values were read without
their scales and the tokens were wrong without a word."""

import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

from eqsat_llm.errors import EqsatError
from eqsat_llm.generation.checkpoint import Checkpoint
from eqsat_llm.generation.generator import Generator

from .conftest import private_cache_home

transformers = pytest.importorskip("transformers")
BLOCK = 128
PROMPT = torch.tensor([[5, 17, 42, 8, 99, 310, 64, 7, 250, 12, 3, 77]])


def _write_fp8(path, method: str = "fp8", scales: bool = True):
    """A tiny bf16 LLaMA saved as an FP8 checkpoint (every projection float8 e4m3 with its
    block scales); returns the model with the weights a reader must see."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=400, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        initializer_range=0.2, dtype="bfloat16")
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("proj.weight"):
                tensors[name] = p.detach().contiguous()
                continue
            w = p.float()
            rows, cols = w.shape
            grid = w.reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).abs().amax((1, 3))
            s = grid / 448.0
            full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
            q = (w / full).to(torch.float8_e4m3fn)
            tensors[name] = q
            if scales:
                tensors[name + "_scale_inv"] = s
            p.copy_((q.float() * full).to(torch.bfloat16))  # what transformers loads
    path.mkdir(exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    config["quantization_config"] = {"quant_method": method, "weight_block_size": [BLOCK, BLOCK],
                                     "activation_scheme": "dynamic"}
    (path / "config.json").write_text(json.dumps(config))
    return model


def test_an_fp8_checkpoint_generates_the_dequantized_models_tokens(tmp_path, monkeypatch):
    # the same tokens as the dequantized model given to Generator (the same float32 compute;
    # transformers computes a bf16 model in bf16, which drifts from it at near-ties), and the
    # first one transformers' own
    private_cache_home(monkeypatch, tmp_path / "cache")
    model = _write_fp8(tmp_path / "ckpt")
    want = Generator(model, max_seq_len=32).generate(PROMPT, max_new_tokens=8)
    gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32)
    got = gen.generate(PROMPT, max_new_tokens=8)
    assert torch.equal(got, want)
    with torch.no_grad():
        first = model(PROMPT).logits[0, -1].argmax()
    assert got[0, PROMPT.shape[1]] == first


def test_rows_of_an_fp8_weight_are_its_dequantized_rows(tmp_path):
    model = _write_fp8(tmp_path)
    ckpt = Checkpoint(tmp_path)
    key = "model.layers.0.mlp.down_proj.weight"  # [256, 384]: 2 x 3 blocks
    whole = ckpt.tensor(key)
    assert whole.dtype == torch.float32
    assert torch.equal(whole.to(torch.bfloat16), model.get_parameter(key).detach())
    for start, stop in ((0, 256), (100, 200), (127, 129), (250, 256)):
        assert torch.equal(ckpt.rows(key, start, stop), whole[start:stop])


def test_float8_without_its_scales_is_refused(tmp_path):
    _write_fp8(tmp_path, scales=False)
    with pytest.raises(EqsatError, match="float8.*no model.layers.0.self_attn.q_proj.weight"):
        Checkpoint(tmp_path).tensor("model.layers.0.self_attn.q_proj.weight")


def test_another_quantization_method_is_refused_by_name(tmp_path):
    _write_fp8(tmp_path, method="gptq")
    with pytest.raises(EqsatError, match="quantized with 'gptq'"):
        Generator.from_pretrained(tmp_path, max_seq_len=32)


def test_fp8_e4m3_g128_keeps_the_checkpoints_bytes_and_scales(tmp_path, monkeypatch):
    # the format's scale per group of 128 rows of a column holds a 128 x 128 block scale: the
    # weight as stored, exactly; quantizing the dequantized weight again would round it anew
    from eqsat_llm.formats.quant_formats import dequantize, quantize

    private_cache_home(monkeypatch, tmp_path / "cache")
    fmt = "fp8_e4m3_g128"
    model = _write_fp8(tmp_path / "ckpt")
    ckpt = Checkpoint(tmp_path / "ckpt")
    key = "model.layers.0.mlp.down_proj.weight"  # [256, 384]: x @ W reads W = its transpose
    q, s = ckpt.as_format(key, fmt)
    whole = ckpt.tensor(key)
    assert q.shape == (384, 256) and s.shape == (3, 256)
    assert torch.equal(dequantize(q, s, fmt), whole.t())
    assert not torch.equal(dequantize(*quantize(whole.t(), fmt), fmt), whole.t())
    assert ckpt.as_format("model.norm.weight", fmt) is None  # (not float8)
    assert ckpt.as_format(key, "fp8_e4m3") is None  # (per column: not the checkpoint's form)

    # the model in float32 with the checkpoint's weights, its projections dequantized (a
    # fresh one: `model`'s rotary table went through bf16); the LM head, stored bf16, is kept
    # float on both sides
    reference = type(model)(model.config).float().eval()
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(ckpt.tensor(name))
    want = Generator(reference, max_seq_len=32).next_token_logits(PROMPT)

    def logits_error() -> float:
        gen = Generator.from_pretrained(tmp_path / "ckpt", max_seq_len=32, quantize=fmt,
                                        dtype=torch.float32, keep_float=["model.lm_head"])
        got = gen.next_token_logits(PROMPT)
        return float((got - want).abs().max() / want.abs().max())

    assert logits_error() <= 1e-5
    # the same load rounding each weight again (the bytes not taken as stored) is 100x off
    monkeypatch.setattr(Checkpoint, "as_format", lambda self, key, fmt: None)
    private_cache_home(monkeypatch, tmp_path / "cache2")
    assert logits_error() > 1e-3


def test_quantizing_an_fp8_checkpoint_to_another_format_says_what_keeps_its_bytes(tmp_path):
    from eqsat_llm.generation.fp8_checkpoint import check_quantize

    _write_fp8(tmp_path)
    method = Checkpoint(tmp_path).quant_method  # (from config.json, without transformers)
    assert method == "fp8"
    with pytest.warns(UserWarning, match="rounded again; quantize='fp8_e4m3_g128' keeps"):
        check_quantize(method, "fp8", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_quantize(method, "fp8_e4m3_g128", tmp_path)
        check_quantize(method, None, tmp_path)
        check_quantize(None, "int8", tmp_path)
