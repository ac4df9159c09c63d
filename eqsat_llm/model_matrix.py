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


def _decoder(cls: str, cfg_cls: str, **fields: Any) -> Callable[[dict, str], nn.Module]:
    def make(s: dict, attn: str) -> nn.Module:
        T = _transformers()
        common = {"vocab_size": VOCAB, "hidden_size": s["d"], "intermediate_size": s["ffn"],
                      "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
                      "num_key_value_heads": s["kv"], "max_position_embeddings": 256,
                      "use_cache": False, "attn_implementation": attn}
        cfg = getattr(T, cfg_cls)(**(common | {k: v(s) if callable(v) else v
                                               for k, v in fields.items()}))
        return getattr(T, cls)(cfg)
    return make


def _gpt2(s: dict, attn: str) -> nn.Module:
    T = _transformers()
    cfg = T.GPT2Config(vocab_size=VOCAB, n_positions=256, n_embd=s["d"], n_layer=s["layers"],
                       n_head=s["heads"], bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                       use_cache=False, attn_implementation=attn)
    return T.GPT2LMHeadModel(cfg)


def _gptj(s: dict, attn: str) -> nn.Module:
    T = _transformers()
    cfg = T.GPTJConfig(vocab_size=VOCAB, n_positions=256, n_embd=s["d"], n_layer=s["layers"],
                       n_head=s["heads"], rotary_dim=s["d"] // s["heads"] // 2,
                       bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, use_cache=False,
                       attn_implementation=attn)
    return T.GPTJForCausalLM(cfg)


def _opt(s: dict, attn: str) -> nn.Module:
    T = _transformers()
    cfg = T.OPTConfig(vocab_size=VOCAB, hidden_size=s["d"], ffn_dim=s["ffn"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      word_embed_proj_dim=s["d"], max_position_embeddings=256,
                      pad_token_id=1, bos_token_id=2, eos_token_id=2, use_cache=False,
                      attn_implementation=attn)
    return T.OPTForCausalLM(cfg)


def _falcon(s: dict, attn: str) -> nn.Module:
    T = _transformers()
    cfg = T.FalconConfig(vocab_size=VOCAB, hidden_size=s["d"], num_hidden_layers=s["layers"],
                         num_attention_heads=s["heads"], num_kv_heads=s["kv"],
                         new_decoder_architecture=True, bias=False, parallel_attn=True,
                         max_position_embeddings=256, use_cache=False,
                         attn_implementation=attn)
    return T.FalconForCausalLM(cfg)


def _bert(s: dict, attn: str) -> nn.Module:
    T = _transformers()
    cfg = T.BertConfig(vocab_size=VOCAB, hidden_size=s["d"], num_hidden_layers=s["layers"],
                       num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                       max_position_embeddings=256, attn_implementation=attn)
    return T.BertModel(cfg, add_pooling_layer=False)


FAMILIES: dict[str, Callable[[dict, str], nn.Module]] = {
    "llama": _decoder("LlamaForCausalLM", "LlamaConfig"),
    "qwen3": _decoder("Qwen3ForCausalLM", "Qwen3Config", head_dim=lambda s: s["d"] // s["heads"]),
    "granite": _decoder("GraniteForCausalLM", "GraniteConfig"),
    "olmo2": _decoder("Olmo2ForCausalLM", "Olmo2Config"),
    "stablelm": _decoder("StableLmForCausalLM", "StableLmConfig"),
    "starcoder2": _decoder("Starcoder2ForCausalLM", "Starcoder2Config"),
    "mixtral": _decoder("MixtralForCausalLM", "MixtralConfig", num_local_experts=4,
                        num_experts_per_tok=2),
    "gptj": _gptj,
    "opt": _opt,
    "falcon": _falcon,
    "gpt2": _gpt2,
    "bert": _bert,
}
ENCODERS = frozenset({"bert"})


def build(family: str, *, attn: str = "sdpa", seq: int = 16, size: str = "small",
          seed: int = 0, batch: int = 1) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A family's model (random weights from `seed`) and random token ids [batch, seq]."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    torch.manual_seed(seed)
    model = FAMILIES[family](SIZES[size], attn).eval()
    field = "last_hidden_state" if family in ENCODERS else "logits"
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 1, (batch, seq), generator=gen)
    return Logits(model, field).eval(), (ids,)
