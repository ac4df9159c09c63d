"""Every causal-LM family transformers ships, built offline and small: enumerated from
transformers' own `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, each config built with its defaults and
then shrunk by one generic function (the size fields any config may spell: hidden size,
layers, heads, KV heads, head_dim, FFN, vocab, positions, experts, windows...), random weights
from a seed, sdpa attention, eval mode.

    model, inputs = build("qwen3", seq=32)      # Logits(model): forward(ids) -> logits
    refusal("mamba")                            # None, or why the family is not built

The classification against eqsat-llm (compiled / torch steps / refused / WRONG) is
`eqsat_llm.models.family_check`; the table is docs/families.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .model_matrix import Logits, _transformers

# the shrunk sizes: d 64 = 4 heads x 16, GQA 4:2, 2 layers, 4 experts of which 2 per token;
# a window of 16 so that a 32-token prompt crosses it
HIDDEN, HEADS, HEAD_DIM, FFN, MOE_FFN, LAYERS = 64, 4, 16, 128, 64, 2
VOCAB, POSITIONS, EXPERTS, TOP_K, WINDOW = 512, 128, 4, 2, 16
MAX_PARAMS = 8_000_000  # a shrunk model above this missed a size field: refused, not built


def _kv_heads(default: Any, heads: Any) -> int:
    """GQA stays GQA (2 KV heads), MQA stays MQA (1), MHA stays MHA."""
    if not isinstance(default, int) or not isinstance(heads, int) or default >= heads:
        return HEADS
    return 1 if default == 1 else HEADS // 2


def _at_most(n: int) -> Callable[[Any], Any]:
    return lambda v: min(v, n) if isinstance(v, int) else n


# field -> its shrunk value, or a function of the default value (set only where the family's
# config has the field; a None default is kept unless the field is in FILL_NONE)
SIZE_FIELDS: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "word_embed_proj_dim", "emb_dim",
                     "embedding_size", "attention_hidden_size", "backbone_hidden_size",
                     "ple_embed_dim"), HIDDEN),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers",
                     "decoder_layers", "num_decoder_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads",
                     "decoder_attention_heads", "num_decoder_attention_heads",
                     "swa_num_attention_heads", "heads_per_ngram"), HEADS),
    **dict.fromkeys(("head_dim", "attention_head_dim", "kv_channels", "swa_head_dim",
                     "dim_head"), HEAD_DIM),
    "hidden_size_per_layer_input": _at_most(HEAD_DIM),  # Gemma's per-layer inputs; 0: none
    "rotary_dim": HEAD_DIM // 2,
    **dict.fromkeys(("intermediate_size", "ffn_dim", "decoder_ffn_dim", "n_inner",
                     "ffn_hidden_size", "dense_intermediate_size", "intermediate_size_mlp",
                     "dim_ff", "dff"), FFN),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size",
                     "moe_shared_expert_intermediate_size", "shared_experts_intermediate_size",
                     "expert_ffn_hidden_size", "shared_intermediate_size"), MOE_FFN),
    **dict.fromkeys(("vocab_size", "decoder_vocab_size", "vocab_size_per_layer_input",
                     "unpadded_vocab_size"), VOCAB),
    # side vocabularies (RoCBert's glyph and pinyin embeddings)
    **dict.fromkeys(("shape_vocab_size", "pronunciation_vocab_size"), 64),
    **dict.fromkeys(("shape_embed_dim", "pronunciation_embed_dim"), HEAD_DIM),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
                    POSITIONS),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts",
                     "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token",
                     "moe_top_k"),
                    TOP_K),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                     "first_k_dense_replace", "n_group", "num_expert_group", "topk_group",
                     "num_dense_layers"), _at_most(1)),
    # multi-head latent attention (DeepSeek): the ranks and its split head dims
    "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "qk_head_dim": 24, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2, "index_topk": WINDOW,
    **dict.fromkeys(("sliding_window", "sliding_window_size", "attention_chunk_size",
                     "local_attention_window_len"), _at_most(WINDOW)),
    # linear-attention and state-space layers of the hybrids
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim",
                     "mamba_d_head", "mamba_head_dim", "mamba_d_state", "ssm_state_size",
                     "state_size"), HEAD_DIM),
    "linear_num_key_heads": 2,
    **dict.fromkeys(("linear_num_value_heads", "linear_num_heads"), HEADS),
    **dict.fromkeys(("mamba_n_heads", "mamba_num_heads"), 8),
    **dict.fromkeys(("mamba_n_groups", "n_groups"), 1),
    **dict.fromkeys(("time_step_rank", "mamba_dt_rank"), 8),
    "mamba_d_ssm": 2 * HIDDEN,  # = mamba_expand (2) x hidden = 8 heads x 16
    "num_nextn_predict_layers": 0,  # multi-token-prediction layers: unused by forward
    "num_kv_shared_layers": 0,  # KV shared across layers of a type: 2 layers have no donor
    "use_cache": False,
}
# size fields whose None default is not a choice but left for the checkpoint to fill: the
# model cannot be built without them
FILL_NONE = frozenset({"head_dim", "num_key_value_heads", "num_experts_per_tok",
                       "n_routed_experts", "n_shared_experts"})
KV_FIELDS = ("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads")
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers")
# lists of layer indices (not one entry per layer): renumbered to the kept layers
LAYER_INDEX_FIELDS = ("mlp_only_layers", "hybrid_layer_ids", "full_attn_idxs", "ple_layer_ids")
# modality towers and encoders: a composite config with one of these is refused
TOWERS = ("vision", "audio", "image", "video", "vq", "speech", "encoder", "patcher", "depth")

# Where the generic shrink cannot work: a family's own constraint between fields, or a
# default config transformers ships incomplete.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Mamba-2 heads: hidden x expand (64 x 2) = num_heads x head_dim; its num_heads are SSM heads
    "mamba2": {"num_heads": 8},
    # ZAYA routes each token to one expert only (its config refuses 2)
    "zaya": {"num_experts_per_tok": 1},
    # X-MOD's adapters are per language: a default language picks one
    "xmod": {"default_language": "en_XX"},
    # LFM2-MoE ships layer_types None (the checkpoint's list): short-conv then attention
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # Reformer's axial position embeddings factor max positions (8 x 16 = 128) and split d
    "reformer": {"axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 48],
                 "is_decoder": True},  # its LM head refuses a non-decoder config
    # ships its sparse-attention indexer unset (None) and an n-gram vocabulary of 20M rows
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                       "indexer_budget": WINDOW, "indexer_compress_ratio": 4,
                       "ngram_vocab_size_base": VOCAB, "hc_lowrank": 16},
    # ships an attention config without rope_theta and with clip_qkv None (its forward clamps)
    "dbrx": {"attn_config": {"rope_theta": 500000.0, "kv_n_heads": 2, "clip_qkv": 8.0}},
    # its SWA layers' heads are qk_nope + qk_rope (16 + 8) wide; the DSA layers' rope part too
    "dots3_note_text": {"head_dim": 24},
    # its hybrid layers share one attention block, tied from the first to the others: two
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid",
                                                            "hybrid"]},
    # Jamba derives its layer kinds from periods (attention at layer 4 of every 8): period 2,
    # offset 1 keeps a Mamba and an attention layer, as the generic shrink keeps two kinds
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # Bamba's default config has no attention layer (attn_layer_indices None); checkpoints do
    "bamba": {"attn_layer_indices": [1]},
    # RecurrentGemma cycles (recurrent, recurrent, attention): two layers would be recurrent
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # GraniteMoE-Hybrid's default config is all Mamba; checkpoints mix in attention layers
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # ships rope_parameters {}: the checkpoint gives one entry per layer type
    "cohere_compass_text": {"rope_parameters": {"full_attention": {
        "rope_type": "default", "rope_theta": 10000.0}}},
}


# Refused by name, and why: what no config choice can make a standalone causal LM.
REFUSED = {
    **dict.fromkeys(("gemma4_assistant", "gemma4_unified_assistant"),
                    "a drafter for speculative decoding: runs on its target model's hidden "
                    "states and KV cache (shared_kv_states), not on token ids alone"),
}


def families() -> dict[str, str]:
    """model_type -> causal-LM class name, as transformers maps them (sorted by model_type)."""
    _transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()))


def _config_class(family: str) -> type:
    _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[family]


def _fields(cfg: Any) -> dict[str, Any]:
    """A config's own fields (per-layer ones too: vars, not getattr)."""
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def _per_layer(fields: dict[str, Any], layers: int) -> dict[str, Any]:
    """The fields that hold one entry per layer (lists; strings only for layer patterns)."""
    return {k: v for k, v in fields.items() if len_or(v) == layers and
            (isinstance(v, (list, tuple)) or "pattern" in k and isinstance(v, str))}


def len_or(v: Any) -> int:
    return len(v) if isinstance(v, (list, tuple, str)) else -1


def _layer_picks(fields: dict[str, Any], overrides: dict[int, Any], layers: int) -> list[int]:
    """Which of the default's layers the shrunk model keeps: the first, then the first of
    another kind (by layer_types first, then any per-layer list or per-layer override), so a
    2-layer model still mixes sliding and full attention, dense and MoE, attention and SSM."""
    lists = sorted(_per_layer(fields, layers).items(), key=lambda kv: kv[0] != "layer_types")
    kinds = [v for _, v in lists] + [[overrides.get(i) for i in range(layers)]]
    for lst in kinds:
        other = next((i for i in range(1, layers) if lst[i] != lst[0]), None)
        if other is not None:
            return [0, other]
    return list(range(LAYERS))


def _size(k: str, v: Any) -> Any:
    new = SIZE_FIELDS[k]
    if isinstance(v, (list, tuple)):  # one size per layer (already cut to the kept layers)
        return [new(x) if callable(new) else new for x in v]
    return new(v) if callable(new) else new


def shrink_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The size fields of `fields` (a config's, a per-layer override's), shrunk."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if k in SIZE_FIELDS and not isinstance(v, bool) and (v is not None or k in FILL_NONE):
            out[k] = _size(k, v)
    heads = fields.get("num_attention_heads", fields.get("swa_num_attention_heads"))
    for kv in KV_FIELDS:
        if kv in fields and (fields[kv] is not None or kv in FILL_NONE):
            out[kv] = _kv_heads(fields[kv], heads)
    rope, nope = fields.get("qk_rope_head_dim"), fields.get("qk_nope_head_dim")
    if isinstance(rope, int) and fields.get("head_dim") in (rope, (nope or 0) + rope):
        # MLA: head_dim is rope's part, or the whole query/key head; kept so
        out["head_dim"] = out["qk_rope_head_dim"] + (
            out.get("qk_nope_head_dim", 0) if fields["head_dim"] != rope else 0)
    return out


def _shrink_override(override: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A per-layer override's sizes shrunk (read with the config's own fields around it)."""
    return {k: v for k, v in shrink_fields(fields | override).items() if k in override}


def shrink(default: Any) -> dict[str, Any]:
    """The constructor arguments that make `default` (a config built with its defaults) small:
    each size field it has, set; per-layer lists and per-layer overrides cut to the kept
    layers; nested sub-configs shrunk the same way; token ids inside the vocabulary."""
    fields = _fields(default)
    out: dict[str, Any] = {}
    spec = vars(default).get("_heterogeneity_spec")
    overrides = dict(spec.per_layer_overrides) if spec is not None else {}
    layers = next((fields[k] for k in LAYER_COUNTS if isinstance(fields.get(k), int)), None)
    if isinstance(layers, int) and layers > LAYERS:
        picks = _layer_picks(fields, overrides, layers)
        for k, v in _per_layer(fields, layers).items():
            kept = [v[i] for i in picks]
            out[k] = "".join(kept) if isinstance(v, str) else kept
        for k in LAYER_INDEX_FIELDS:
            if isinstance(fields.get(k), (list, tuple)):
                out[k] = [picks.index(i) for i in fields[k] if i in picks]
        overrides = {j: overrides[i] for j, i in enumerate(picks) if i in overrides}
    if overrides:  # heterogeneous layers: each layer's own sizes, shrunk the same way
        out["per_layer_config"] = {i: o | _shrink_override(o, fields)
                                   for i, o in overrides.items()}
    out |= shrink_fields(fields | {k: v for k, v in out.items() if k in fields})
    for k, v in fields.items():
        if hasattr(v, "to_dict") and k not in out:  # a nested sub-config (DBRX's attn/ffn)
            out[k] = shrink(v)
    if fields.get("is_decoder") is False:  # an encoder family's causal-LM class: causal
        out["is_decoder"] = True  # attention (transformers warns that it is needed)
    vocab = out.get("vocab_size", fields.get("vocab_size"))
    if isinstance(vocab, int):
        for k, v in fields.items():
            if k.endswith(("_token_id", "_token_ids", "_token_index")):
                out[k] = _in_vocab(v, vocab)
    return out


def _in_vocab(v: Any, vocab: int) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        return v if v < vocab else vocab - 1
    if isinstance(v, (list, tuple)):
        return [_in_vocab(x, vocab) for x in v]
    return v


# the fields every other size follows (a config derives head_dim, SSM widths... from these)
PRIMARY = frozenset({"hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer",
                     "n_layers", "num_layers", "num_attention_heads", "n_head", "n_heads",
                     "vocab_size"})


def _derived(cls: type, default: Any, kwargs: dict[str, Any]) -> set[str]:
    """The size fields the config computes itself from the primary ones (Zamba2's head dims
    from hidden and heads): left for it to compute rather than set apart from their source
    (a value passed for one overrides what it computes). Found by building the config with
    every other size field left out and seeing which moved."""
    try:
        probe = _fields(cls(**{k: v for k, v in kwargs.items()
                               if k in PRIMARY or k not in SIZE_FIELDS}))
    except Exception:  # noqa: BLE001 - a config that needs more than these: nothing derived
        return set()
    old = _fields(default)
    return {k for k in kwargs if k in SIZE_FIELDS and k not in PRIMARY and k in probe and
            not isinstance(probe[k], (list, tuple)) and probe[k] != old.get(k)}


def config(family: str, attn: str = "sdpa") -> Any:
    """The family's config, defaults shrunk (with its overrides), `attn` attention."""
    cls = _config_class(family)
    default = cls()
    kwargs = shrink(default)
    derived = _derived(cls, default, kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in derived} | OVERRIDES.get(family, {})
    cfg = cls(**kwargs)
    cfg._attn_implementation = attn
    return cfg


def refusal(family: str) -> str | None:
    """Why the family is not built (None: it is): a composite config with a vision, audio or
    encoder tower (the text-only families cover their language models)."""
    if family in REFUSED:
        return REFUSED[family]
    subs = getattr(_config_class(family), "sub_configs", None) or {}
    towers = sorted(s for s in subs if any(t in s for t in TOWERS))
    if not towers:
        return None
    why = f"multimodal or encoder-decoder: its config has {', '.join(towers)}"
    text = getattr(subs.get("text_config"), "model_type", None)
    return why + (f"; its language model is the family {text}"
                  if text in families() and text != family else "")


class Refused(Exception):
    """The family is not built, and why."""


def _takes_use_cache(model: nn.Module) -> bool:
    params = inspect.signature(model.forward).parameters
    return "use_cache" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def attention(family: str) -> str:
    """The attention the family is built with: sdpa, or eager where transformers has no sdpa
    path for it (what users get by default too)."""
    cls = getattr(_transformers(), families()[family])
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def build(family: str, *, seq: int = 32, seed: int = 0
          ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The family's shrunk causal LM (random weights from `seed`, `attention(family)`) wrapped
    so `forward(ids)` returns its logits, and random token ids [1, seq]. Raises `Refused` with
    the reason when it is not built."""
    why = refusal(family)
    if why:
        raise Refused(why)
    cfg = config(family, attention(family))
    cls = getattr(_transformers(), families()[family])
    with torch.device("meta"):  # count first: a missed size field must not allocate GBs
        n = sum(p.numel() for p in cls(cfg).parameters())
    if n > MAX_PARAMS:
        raise Refused(f"the shrunk config still has {n / 1e6:.0f}M parameters: a size field "
                      "the generic shrink does not know (add an override)")
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab - 1, (1, seq), generator=gen)
    wrapped = Logits(model) if _takes_use_cache(model) else _NoCache(model)
    return wrapped.eval(), (ids,)


class _NoCache(Logits):
    """A model whose forward takes no `use_cache`."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits
