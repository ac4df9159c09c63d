"""torch's scaled_dot_product_attention as captured (`sdpa`, `sdpa_masked`): no backend
generates them; the rules turn them into the fused `attention` op (fused.py) wherever the mask
and shapes allow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import draws
from .registry import COPY_IN, register


def grouped(xs: list[Any]) -> bool:
    """Grouped-query attention: k and v have fewer heads (dim -3) than q."""
    q, k = xs[0], xs[1]
    return q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3]


def _grouped(q: Sequence[int], kv: Sequence[int]) -> bool:
    """Whether query heads share KV heads (dim -3): fewer KV heads than query heads, more than
    one (a single KV head broadcasts); query head h then reads KV head h // (Hq / Hkv), as
    repeat_kv / enable_gqa do."""
    return len(q) >= 3 and len(kv) >= 3 and 1 < kv[-3] < q[-3]


def kv_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """kv with each head repeated for the query heads that read it."""
    if not _grouped(q.shape, kv.shape):
        return kv
    return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)


def kv_group(q: Sequence[int], k: Sequence[int], v: Sequence[int]) -> int | None:
    """The query heads per KV head of an attention on these shapes (1: not grouped), for a
    kernel that reads each KV head once; None when they do not form whole groups of one
    rank."""
    if not _grouped(q, k):
        return 1
    if len(k) != len(q) or v[-3] != k[-3] or q[-3] % k[-3]:
        return None
    return q[-3] // k[-3]


register("sdpa", 3, "is_causal:bool scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             *xs, is_causal=a["is_causal"], scale=a["scale"], enable_gqa=grouped(xs)),
         category="attention", shape="sdpa", cost="attention", writer=COPY_IN,
         frontend_form=True, operands="q k v", draw=draws.attention(bool_mask=False))
register("sdpa_masked", 4, "scale:float",
         ref=lambda xs, a: F.scaled_dot_product_attention(
             xs[0], xs[1], xs[2], attn_mask=xs[3], scale=a["scale"], enable_gqa=grouped(xs)),
         category="attention", shape="sdpa", cost="attention", writer=COPY_IN,
         frontend_form=True, operands="q k v mask",
         draw=draws.attention(bool_mask=True))
