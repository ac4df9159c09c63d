"""The model matrix: transformers model families as users load them, built offline from small
configs with random weights (no download), with the library's defaults (sdpa attention,
grouped-query attention where the family has it, its masking utilities).

    model, inputs = build("llama", attn="sdpa", seq=16)

Each builder returns ``(model, (input_ids,))``: the model wrapped so that ``forward(ids)``
returns the logits (the last hidden state for encoders), ``use_cache=False``. ``seq=1`` is the
one-token shape. ``size="small"`` is the fast test set; ``"medium"`` the slow set.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

VOCAB = 1000
SIZES = {"small": {"d": 64, "heads": 4, "kv": 2, "ffn": 128, "layers": 2},
         "medium": {"d": 256, "heads": 8, "kv": 2, "ffn": 704, "layers": 2}}


class Logits(nn.Module):
    """``forward(input_ids)`` -> the model's logits (or last hidden state), no cache."""

    def __init__(self, model: nn.Module, field: str = "logits") -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, use_cache=False) if self.field == "logits" \
            else self.model(input_ids=input_ids)
        return getattr(out, self.field)


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the network
    import transformers

    return transformers


def _family(cls: str, cfg_cls: str, fields: dict[str, Any], **kw: Any
            ) -> Callable[[dict, str], nn.Module]:
    """A builder: `cfg_cls(**fields)` (a callable field is given the size dict) and `cls` of
    it. `kw` goes to the model's constructor."""
    def make(s: dict, attn: str) -> nn.Module:
        T = _transformers()
        cfg = getattr(T, cfg_cls)(attn_implementation=attn, **{
            k: v(s) if callable(v) else v for k, v in fields.items()})
        return getattr(T, cls)(cfg, **kw)
    return make


def _d(key: str) -> Callable[[dict], int]:
    return lambda s: s[key]


# LLaMA-like configs share their field names; the others spell them their own way.
LLAMA_LIKE = {"vocab_size": VOCAB, "hidden_size": _d("d"), "intermediate_size": _d("ffn"),
              "num_hidden_layers": _d("layers"), "num_attention_heads": _d("heads"),
              "num_key_value_heads": _d("kv"), "max_position_embeddings": 256,
              "use_cache": False}
GPT_LIKE = {"vocab_size": VOCAB, "n_positions": 256, "n_embd": _d("d"), "n_layer": _d("layers"),
            "n_head": _d("heads"), "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1,
            "use_cache": False}

FAMILIES: dict[str, Callable[[dict, str], nn.Module]] = {
    "llama": _family("LlamaForCausalLM", "LlamaConfig", LLAMA_LIKE),
    "qwen3": _family("Qwen3ForCausalLM", "Qwen3Config",
                     LLAMA_LIKE | {"head_dim": lambda s: s["d"] // s["heads"]}),
    "granite": _family("GraniteForCausalLM", "GraniteConfig", LLAMA_LIKE),
    "olmo2": _family("Olmo2ForCausalLM", "Olmo2Config", LLAMA_LIKE),
    "stablelm": _family("StableLmForCausalLM", "StableLmConfig", LLAMA_LIKE),
    "starcoder2": _family("Starcoder2ForCausalLM", "Starcoder2Config", LLAMA_LIKE),
    "mixtral": _family("MixtralForCausalLM", "MixtralConfig",
                       LLAMA_LIKE | {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # mixtures of experts: 4 experts of which 2 per token (DeepSeek: 2 groups, 1 chosen)
    "qwen2_moe": _family("Qwen2MoeForCausalLM", "Qwen2MoeConfig", LLAMA_LIKE | {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 128}),
    "olmoe": _family("OlmoeForCausalLM", "OlmoeConfig", LLAMA_LIKE | {
        "num_experts": 4, "num_experts_per_tok": 2}),
    "phimoe": _family("PhimoeForCausalLM", "PhimoeConfig", LLAMA_LIKE | {
        "num_local_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": _family("DeepseekV3ForCausalLM", "DeepseekV3Config", LLAMA_LIKE | {
        "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 64, "first_k_dense_replace": 1, "n_group": 2,
        "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "head_dim": 8, "v_head_dim": 16, "rope_interleave": True,
        "num_key_value_heads": _d("heads")}),
    "gpt_oss": _family("GptOssForCausalLM", "GptOssConfig", LLAMA_LIKE | {
        "num_local_experts": 4, "num_experts_per_tok": 2,
        "head_dim": lambda s: s["d"] // s["heads"], "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"]}),
    "gptj": _family("GPTJForCausalLM", "GPTJConfig",
                    GPT_LIKE | {"rotary_dim": lambda s: s["d"] // s["heads"] // 2}),
    "gpt2": _family("GPT2LMHeadModel", "GPT2Config", GPT_LIKE),
    "opt": _family("OPTForCausalLM", "OPTConfig", {
        "vocab_size": VOCAB, "hidden_size": _d("d"), "ffn_dim": _d("ffn"),
        "num_hidden_layers": _d("layers"), "num_attention_heads": _d("heads"),
        "word_embed_proj_dim": _d("d"), "max_position_embeddings": 256, "pad_token_id": 1,
        "bos_token_id": 2, "eos_token_id": 2, "use_cache": False}),
    "falcon": _family("FalconForCausalLM", "FalconConfig", {
        "vocab_size": VOCAB, "hidden_size": _d("d"), "num_hidden_layers": _d("layers"),
        "num_attention_heads": _d("heads"), "num_kv_heads": _d("kv"),
        "new_decoder_architecture": True, "bias": False, "parallel_attn": True,
        "max_position_embeddings": 256, "use_cache": False}),
    "bert": _family("BertModel", "BertConfig", {
        "vocab_size": VOCAB, "hidden_size": _d("d"), "num_hidden_layers": _d("layers"),
        "num_attention_heads": _d("heads"), "intermediate_size": _d("ffn"),
        "max_position_embeddings": 256}, add_pooling_layer=False),
}
ENCODERS = frozenset({"bert"})
# families transformers runs with eager attention only (no sdpa path): built so whatever asked
EAGER_ONLY = frozenset({"gpt_oss"})


def build(family: str, *, attn: str = "sdpa", seq: int = 16, size: str = "small",
          seed: int = 0, batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A family's model (random weights from `seed`) and random token ids [batch, seq]."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    torch.manual_seed(seed)
    model = FAMILIES[family](SIZES[size], "eager" if family in EAGER_ONLY else attn).eval()
    field = "last_hidden_state" if family in ENCODERS else "logits"
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 1, (batch, seq), generator=gen)
    return Logits(model, field).eval(), (ids,)


# TinyLlama-1.1B's shapes (22 layers; fewer by choice), and the same structure scaled down
TINYLLAMA = {"hidden": 2048, "heads": 32, "kv": 4, "ffn": 5632, "layers": 22, "vocab": 32000}
TINYLLAMA_QUICK = {"hidden": 256, "heads": 8, "kv": 2, "ffn": 512, "layers": 1, "vocab": 2000}


def tinyllama(layers: int = 4, quick: bool = False, seed: int = 0) -> nn.Module:
    """A TinyLlama-1.1B-shaped LlamaForCausalLM with `layers` of its layers, random weights
    from `seed`, sdpa; `quick`: the scaled-down structure (a smoke test, not a measurement)."""
    T = _transformers()
    s = TINYLLAMA_QUICK if quick else TINYLLAMA | {"layers": layers}
    torch.manual_seed(seed)
    cfg = T.LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"],
                        intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
                        num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                        max_position_embeddings=2048, rms_norm_eps=1e-5, use_cache=False,
                        attn_implementation="sdpa")
    return T.LlamaForCausalLM(cfg).eval()


# a Mixtral whose expert weights dominate a token's bytes (1.7 GB fp32; 0.5 GB read a token)
MIXTRAL_LARGE = {"hidden": 1024, "heads": 16, "kv": 4, "ffn": 3584, "layers": 4,
                 "vocab": 32000, "experts": 8, "top_k": 2}


def mixtral_large(seed: int = 0) -> nn.Module:
    """A MixtralForCausalLM of MIXTRAL_LARGE's shapes, random weights from `seed`, sdpa."""
    T = _transformers()
    s = MIXTRAL_LARGE
    torch.manual_seed(seed)
    cfg = T.MixtralConfig(vocab_size=s["vocab"], hidden_size=s["hidden"],
                          intermediate_size=s["ffn"], num_hidden_layers=s["layers"],
                          num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                          num_local_experts=s["experts"], num_experts_per_tok=s["top_k"],
                          max_position_embeddings=2048, use_cache=False,
                          attn_implementation="sdpa")
    return T.MixtralForCausalLM(cfg).eval()


def causal_lm(spec: str) -> nn.Module:
    """A causal LM by name: a family of the matrix (`llama`, `gpt2:medium`), `tinyllama`
    (`tinyllama:22` for all its layers), or `package.module:function` returning the model."""
    import importlib

    name, _, arg = spec.partition(":")
    if name == "tinyllama":
        return tinyllama(int(arg) if arg else 4)
    if name == "mixtral_large":
        return mixtral_large()
    if name in FAMILIES and name not in ENCODERS:
        return build(name, seq=1, size=arg or "small")[0].model
    if arg and "." in name or arg and name not in FAMILIES:
        return getattr(importlib.import_module(name), arg)()
    causal = sorted(set(FAMILIES) - ENCODERS)
    raise KeyError(f"unknown model {spec!r}: a family ({', '.join(causal)}, with :small or "
                   ":medium), tinyllama[:layers], mixtral_large, or package.module:function")
