"""Reference workloads for the equality-saturation optimizer.

The optimizer works on ATen graphs obtained with ``torch.export``.  These
workloads give it realistic inputs: a hand-written LLaMA decoder block whose
attention, rotary embedding and normalisation are spelled out op by op (so the
rewrite rules have something to find), and tiny Hugging Face models that show
what production modelling code exports to.

Every builder returns ``(model, inputs)`` with the model in eval mode and all
randomness drawn from an explicit seed, so runs are reproducible and
float32 comparisons at ``1e-5`` are meaningful.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

Case = tuple[nn.Module, tuple[torch.Tensor, ...]]

LLAMA_BLOCK_SHAPES = ("prefill", "decode", "decode_kv")

# LLaMA-7B's block shapes (LlamaBlock's arguments): 32 of them make the 7B model's layers
LLAMA_7B = {"d_model": 4096, "n_heads": 32, "ffn": 11008, "max_seq": 4096}


class RMSNorm(nn.Module):
    """Root-mean-square norm written out, so its pointwise ops appear in the graph."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Swap and negate the two halves of the last dim, as Hugging Face's LLaMA does."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """A LLaMA-style pre-norm decoder block in plain torch.

    Attention is written explicitly (scores, causal mask, softmax, ``@ v``)
    instead of calling ``scaled_dot_product_attention``, so the exported graph
    contains the individual ops an optimizer could fuse or reorder.
    """

    def __init__(
        self,
        d_model: int = 512,
        n_heads: int = 8,
        ffn: int = 1536,
        max_seq: int = 256,
        rope_base: float = 10000.0,
        eps: float = 1e-6,
        seed: int = 0,
        n_kv_heads: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        # device="meta": shapes without storage (a 7B model's weights cost nothing;
        # weights/meta.py); None leaves the device to the caller's default (an enclosing `with
        # torch.device`)
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self._build(d_model, n_heads, ffn, max_seq, rope_base, eps, n_kv_heads)
        if not self.q_proj.weight.is_meta:  # a meta weight has no values to draw
            self._init_weights(seed)

    def _build(self, d_model: int, n_heads: int, ffn: int, max_seq: int, rope_base: float,
               eps: float, n_kv_heads: int | None) -> None:
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        # grouped-query attention: n_kv_heads key/value heads, each read by n_heads / n_kv_heads
        # query heads (repeat_kv, as transformers' LLaMA does)
        self.n_kv_heads = n_kv_heads or n_heads
        if n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.max_seq = max_seq

        self.attn_norm = RMSNorm(d_model, eps)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        kv_dim = self.n_kv_heads * self.head_dim
        self.k_proj = nn.Linear(d_model, kv_dim, bias=False)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.gate_proj = nn.Linear(d_model, ffn, bias=False)
        self.up_proj = nn.Linear(d_model, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d_model, bias=False)

        inv_freq = 1.0 / (
            rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        # Small linear weights keep activations O(1); perturbed norm weights make
        # the norm scale non-trivial so a rewrite that drops it is caught.
        gen = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.02)
            elif isinstance(module, RMSNorm):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=gen))

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        return x.view(batch, seq, width // self.head_dim, self.head_dim).transpose(1, 2)

    def _rope(self, past: int, seq: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the positions past.. past + seq, computed in float32 (a half
        model's inv_freq widened back) and given in x's dtype, as transformers' rotary does."""
        positions = torch.arange(past, past + seq, device=x.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq.float())
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def forward(
        self,
        x: torch.Tensor,
        k_cache: torch.Tensor | None = None,
        v_cache: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the block on ``x`` of shape (batch, seq, d_model).

        Without caches returns the output only.  With ``k_cache``/``v_cache``
        of shape (batch, n_kv_heads, past, head_dim) the new tokens sit at
        positions ``past..past+seq-1`` and ``(out, k_all, v_all)`` is returned
        so the caller can feed the grown caches to the next step.
        """
        if (k_cache is None) != (v_cache is None):
            raise ValueError("k_cache and v_cache must be given together")
        _, seq, _ = x.shape
        past = 0 if k_cache is None else k_cache.shape[2]

        h = self.attn_norm(x)
        q = self._split_heads(self.q_proj(h))
        k = self._split_heads(self.k_proj(h))
        v = self._split_heads(self.v_proj(h))

        cos, sin = self._rope(past, seq, x)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        if k_cache is not None and v_cache is not None:
            k = torch.cat((k_cache, k), dim=2)
            v = torch.cat((v_cache, v), dim=2)
        total = past + seq
        if self.n_kv_heads != self.n_heads:  # the caches keep n_kv_heads; attention reads all
            group = self.n_heads // self.n_kv_heads
            k_all, v_all = k, v
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        # Query i (absolute position past + i) may attend to keys 0..past + i.
        q_pos = torch.arange(past, total, device=x.device).unsqueeze(-1)
        k_pos = torch.arange(total, device=x.device).unsqueeze(0)
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v

        attn = attn.transpose(1, 2).reshape(x.shape)
        x = x + self.o_proj(attn)

        h = self.ffn_norm(x)
        x = x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))

        if k_cache is None:
            return x
        if self.n_kv_heads != self.n_heads:
            return x, k_all, v_all
        return x, k, v


def llama_block_case(shape: str, seed: int = 0) -> Case:
    """Build a default ``LlamaBlock`` and inputs for one of ``LLAMA_BLOCK_SHAPES``.

    ``decode_kv`` uses a 127-token cache so that, with the new token, the
    attention spans 128 positions like ``prefill`` does.
    """
    if shape not in LLAMA_BLOCK_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {LLAMA_BLOCK_SHAPES}")
    model = LlamaBlock(seed=seed).eval()
    gen = torch.Generator().manual_seed(seed)
    seq = 128 if shape == "prefill" else 1
    x = torch.randn(1, seq, model.d_model, generator=gen)
    if shape != "decode_kv":
        return model, (x,)
    cache_shape = (1, model.n_heads, 127, model.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen)
    v_cache = torch.randn(cache_shape, generator=gen)
    return model, (x, k_cache, v_cache)


class StackedLlamaBlocks(nn.Module):
    """Several ``LlamaBlock``s in sequence, to test the optimizer on larger graphs."""

    def __init__(self, depth: int, seed: int = 0, **block: Any) -> None:
        super().__init__()
        # Distinct seeds per layer so repeated blocks are not numerically identical.
        self.blocks = nn.ModuleList(LlamaBlock(seed=seed + i, **block) for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def stacked_llama_blocks(depth: int, seed: int = 0, **block: Any) -> nn.Module:
    """Return ``depth`` ``LlamaBlock``s applied in sequence, in eval mode; ``block`` are the
    blocks' arguments (``**LLAMA_7B, device="meta"``: LLaMA-7B's layers without weights)."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    return StackedLlamaBlocks(depth, seed, **block).eval()


class LogitsOnly(nn.Module):
    """Wrap a Hugging Face causal LM so ``forward(input_ids)`` returns only the logits.

    Exporting the bare model would yield a ``ModelOutput`` with several
    entries; a single tensor output keeps the exported graph simple.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def _hf_case(model: nn.Module, seed: int, seq: int, vocab: int) -> Case:
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (1, seq), generator=gen)
    return LogitsOnly(model).eval(), (input_ids,)


def _import_transformers() -> ModuleType:
    # Never reach the network: every model here is built from a config with random weights.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


def gpt2_case(seed: int = 0, seq: int = 16) -> Case:
    """A 2-layer randomly initialised ``GPT2LMHeadModel`` and random token ids."""
    transformers = _import_transformers()
    vocab = 1000
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=128,
        n_embd=128,
        n_layer=2,
        n_head=4,
        # GPT-2's default special-token id (50256) lies outside the small vocabulary.
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    return _hf_case(model, seed, seq, vocab)


def llama_case(seed: int = 0, seq: int = 16) -> Case:
    """A 2-layer randomly initialised ``LlamaForCausalLM`` (no GQA) and random token ids."""
    transformers = _import_transformers()
    vocab = 1000
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    return _hf_case(model, seed, seq, vocab)


WORKLOADS: dict[str, Callable[..., Case]] = {
    "llama_block_prefill": lambda seed=0: llama_block_case("prefill", seed),
    "llama_block_decode": lambda seed=0: llama_block_case("decode", seed),
    "llama_block_decode_kv": lambda seed=0: llama_block_case("decode_kv", seed),
    "gpt2": gpt2_case,
    "llama": llama_case,
}
"""Name -> builder; each builder takes an optional ``seed`` and returns ``(model, inputs)``."""
