"""The expert GEMM (`expert_mm`: out[s] = x[s] @ w[ids[s]], docs/moe.md) as a Triton kernel:
one program per row and block of BLOCK_N columns reads its row's expert (checked against E:
an id out of range writes nothing and sets the launch's index-error flag, as the C kernel
and torch raise), and accumulates BLOCK_K slices of x times the expert's weight tile in
float32. Float experts are read as [E, K, N] through their strides; stored ones (int8,
fp8, int4, bf16, fp16: experts side by side, [K, E n]) as columns e n + j of that matrix,
dequantized per tile by the GEMM kernel's own `weight_tile`. A row per program: decode's
case (each of the k rows its own expert's GEMV); at prefill each expert's weight is read
once per row from cache, not grouped as the C kernel does. Also the routing's
`scatter_value` (2-D: a copy, then the scattered writes). The router's top-k stays a torch
step on this backend: torch's GPU top-k orders ties its own way, and the step gives eager's
choice on whatever device runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ...ir import Node
from .elementwise import Source, plan_copy
from .gemm import W_FLOAT, weight_format, weight_tile
from .launch import FLOATS, Launch, Operand, device


@triton.jit
def expert_mm_kernel(x, w, scale, ids, o, err, K, N, E, xs0, xs1, we, wk, wn, ss_k, ss_n,
                     os0, os1, WEIGHT: tl.constexpr, GROUP: tl.constexpr,
                     SIDE_BY_SIDE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    s = tl.program_id(0)
    lane = tl.arange(0, BLOCK_N)
    n = tl.program_id(1) * BLOCK_N + lane
    e = tl.load(ids + s + lane * 0).to(tl.int64)  # (the row's id in every lane)
    bad = (e < 0) | (e >= E)
    tl.store(err + lane * 0, 1, mask=bad & (lane == 0))
    live = (n < N) & ~bad
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x + s * xs0 + k * xs1, mask=k < K, other=0.0).to(tl.float32)
        mask = (k < K)[:, None] & live[None, :]
        if SIDE_BY_SIDE:  # expert e's column j is column e N + j of [K, E N]
            wt = weight_tile(w, scale, k, e * N + n, mask, wk, wn, ss_k, ss_n, WEIGHT, GROUP)
        else:
            wt = tl.load(w + e[None, :] * we + k[:, None] * wk + n[None, :] * wn,
                         mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(xk[:, None] * wt, axis=0)
    tl.store(o + s * os0 + n * os1, acc.to(o.dtype.element_ty), mask=live)


def plan_expert_mm(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """Float experts [E, K, N] by their strides; stored ones by gemm's weight formats
    (`weight_format` on the [K, E N] matrix); None for what neither reads."""
    x, w, w_scale, ids = ins
    fmt, N = node.attrs["weight"], node.attrs["n"]
    if any(o.is_scalar for o in (x, w, ids)) or x.dtype not in FLOATS or \
            out.dtype not in FLOATS or ids.dtype not in ("int64", "int32") or \
            len(x.shape) != 2 or len(ids.shape) != 1 or ids.strides[0] != 1:
        return None  # (the kernel reads ids[s] at s)
    S, K = x.shape
    if fmt == "float":
        if w.dtype not in FLOATS or len(w.shape) != 3:
            return None
        E, weight, group, scale = w.shape[0], W_FLOAT, 0, None
        w_strides, scale_strides = w.strides, (0, 0)
    else:
        if len(w.shape) != 2 or w.shape[1] % N:
            return None
        stored = weight_format(fmt, w, w_scale, K, w.shape[1])
        if stored is None:
            return None
        E, (weight, group, at) = w.shape[1] // N, stored
        scale, scale_strides = (None, (0, 0)) if at is None else (at[0], at[1:])
        w_strides = (0, *w.strides)
    block_n = min(128, triton.next_power_of_2(N))
    block_k = min(64, triton.next_power_of_2(K))
    err = torch.zeros(1, dtype=torch.int32, device=device())
    args = [x, w, scale, ids, out, err, K, N, E, *x.strides,
            *w_strides, *scale_strides, *out.strides]
    return [Launch("expert_mm", expert_mm_kernel, (S, triton.cdiv(N, block_n)), args,
                   {"WEIGHT": weight, "GROUP": max(group, 1), "SIDE_BY_SIDE": fmt != "float",
                    "BLOCK_K": block_k, "BLOCK_N": block_n}, index_error=err)]


@triton.jit
def scatter_value_kernel(idx, o, err, R, C, n, value, is0, is1, os0, os1,
                         ALONG_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # o[r, idx[r, c]] = value (along columns) or o[idx[r, c], c] = value (along rows)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < R * C
    r, c = i // C, i % C
    q = tl.load(idx + r * is0 + c * is1, mask=live, other=0).to(tl.int64)
    bad = live & ((q < 0) | (q >= n))
    tl.store(err + i * 0, 1, mask=bad)
    at = q * os0 + c * os1 if ALONG_ROWS else r * os0 + q * os1
    tl.store(o + at, tl.zeros((BLOCK,), dtype=tl.float32).to(o.dtype.element_ty) + value,
             mask=live & ~bad)


def plan_scatter_value(node: Node, out: Operand, ins: list[Operand], name: str,
                       source: Source, module: Callable[[], Any]) -> list[Launch] | None:
    """scatter of a number into a 2-D tensor (DeepSeek's group mask): x copied whole
    (elementwise.plan_copy), then one program per block of index elements writes the value
    where each points (an index out of range writes nothing and raises, as torch does)."""
    x, idx = ins
    if x.is_scalar or idx.is_scalar or len(x.shape) != 2 or len(idx.shape) != 2 or \
            out.dtype != x.dtype or x.dtype not in FLOATS or idx.dtype not in ("int64", "int32"):
        return None
    copy = plan_copy(f"{name}_copy", x.shape, out, out.strides, 0, x, x.strides, 0, source,
                     module)
    if copy is None:
        return None
    dim = node.attrs["dim"] % 2
    R, C = idx.shape
    err = torch.zeros(1, dtype=torch.int32, device=device())
    block = min(1024, triton.next_power_of_2(max(R * C, 1)))
    write = Launch("scatter_value", scatter_value_kernel, (triton.cdiv(R * C, block),),
                   [idx, out, err, R, C, x.shape[dim], float(node.attrs["value"]),
                    *idx.strides, *out.strides],
                   {"ALONG_ROWS": dim == 0, "BLOCK": block}, index_error=err)
    return [copy, write]
