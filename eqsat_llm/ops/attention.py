"""torch's scaled_dot_product_attention as captured (`sdpa`, `sdpa_masked`): no backend
generates them; the rules turn them into the fused `attention` op (fused.py) wherever the mask
and shapes allow."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .registry import COPY_IN, register


def grouped(xs: list[Any]) -> bool:
    """Grouped-query attention: k and v have fewer heads (dim -3) than q."""
    q, k = xs[0], xs[1]
    return q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3]


def kv_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    # GQA: query head h reads kv head h // (Hq / Hkv), as repeat_kv / enable_gqa do
    if q.dim() < 3 or kv.dim() < 3 or not 1 < kv.shape[-3] < q.shape[-3]:
        return kv  # the same heads, or one KV head broadcast
    return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)


register("sdpa", 3, "is_causal:bool scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             *xs, is_causal=a["is_causal"], scale=a["scale"], enable_gqa=grouped(xs)),
         category="attention", shape="sdpa", cost="attention", writer=COPY_IN)
register("sdpa_masked", 4, "scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             xs[0], xs[1], xs[2], attn_mask=xs[3], scale=a["scale"], enable_gqa=grouped(xs)),
         category="attention", shape="sdpa", cost="attention", writer=COPY_IN)
