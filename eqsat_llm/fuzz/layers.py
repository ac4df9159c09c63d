"""Repeated layers for the fuzzer: the "layers" step is an `nn.ModuleList` of identical modules
(same class, parameter names and shapes; their own values), called one after another as a
decoder stack calls its layers. That is the structure the capture traces once and splices
(capture/stamping.py), and the structure equality saturation sees repeated: a template bug, or
a rule that confuses two layers' weights, shows only in a multi-layer model.

Stacks of 4 or more are traced once and spliced (stamping.MIN_LAYERS); 2 are traced in full.
A step's kwargs describe the layer: `kind` (mlp: LLaMA's gated MLP; gelu_mlp: GPT-2's; attn:
causal or full self-attention with grouped KV heads; block: attn then mlp), `count`, the
widths `d` (model), `f` (MLP), `heads`, `kv` (KV heads), `dh` (head width), `norm` (rms,
rms_by_hand, layer), `causal` and `seed` (of its parameters' values, with the model's)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("mlp", "gelu_mlp", "attn", "block")


def _values(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    bound = shape[-1] ** -0.5 if len(shape) > 1 else 1.0  # outputs of order one
    return (torch.rand(shape, generator=gen) * 2 - 1) * bound


def _linear(n_in: int, n_out: int, seed: int, bias: bool = False) -> nn.Linear:
    # a Linear module, as layers are made of (stamping groups layers of modules only)
    lin = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(_values((n_out, n_in), seed))
        if bias:
            lin.bias.copy_(_values((n_out,), seed + 1))
    return lin.requires_grad_(False)


class FuzzLayer(nn.Module):
    def __init__(self, kw: dict[str, Any], seed: int) -> None:
        super().__init__()
        self.kind, self.norm, self.causal = kw["kind"], kw["norm"], bool(kw["causal"])
        self.heads, self.kv, self.dh = kw["heads"], kw["kv"], kw["dh"]
        d, f, seed = kw["d"], kw["f"], seed * 31
        if self.kind in ("attn", "block"):
            self.ln_a = nn.Parameter(_values((d,), seed), requires_grad=False)
            self.q = _linear(d, self.heads * self.dh, seed + 2)
            self.k = _linear(d, self.kv * self.dh, seed + 4)
            self.v = _linear(d, self.kv * self.dh, seed + 6)
            self.o = _linear(self.heads * self.dh, d, seed + 8)
        if self.kind in ("mlp", "block", "gelu_mlp"):
            self.ln_m = nn.Parameter(_values((d,), seed + 10), requires_grad=False)
        if self.kind in ("mlp", "block"):
            self.gate, self.up = _linear(d, f, seed + 12), _linear(d, f, seed + 14)
            self.down = _linear(f, d, seed + 16)
        if self.kind == "gelu_mlp":
            self.ln_b = nn.Parameter(_values((d,), seed + 18), requires_grad=False)
            self.fc, self.proj = _linear(d, f, seed + 20, True), _linear(f, d, seed + 22, True)

    def _norm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None):
        if self.norm == "layer" or b is not None:
            return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)
        if self.norm == "rms_by_hand":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return F.rms_norm(x, x.shape[-1:], w, 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind in ("attn", "block"):
            x = x + self._attention(self._norm(x, self.ln_a))
        if self.kind in ("mlp", "block"):
            h = self._norm(x, self.ln_m)
            x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        if self.kind == "gelu_mlp":
            h = self._norm(x, self.ln_m, self.ln_b)
            x = x + self.proj(F.gelu(self.fc(h), approximate="tanh"))
        return x

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        b, s, _ = h.shape
        q = self.q(h).reshape(b, s, self.heads, self.dh).transpose(1, 2)
        k = self.k(h).reshape(b, s, self.kv, self.dh).transpose(1, 2)
        v = self.v(h).reshape(b, s, self.kv, self.dh).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           enable_gqa=self.kv != self.heads)
        return self.o(o.transpose(1, 2).reshape(b, s, self.heads * self.dh))


class LayerStack(nn.Module):
    def __init__(self, kw: dict[str, Any], seed: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FuzzLayer(kw, seed * 101 + k) for k in range(kw["count"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def layer_stack(kw: dict[str, Any], seed: int) -> LayerStack:
    return LayerStack(kw, seed)
