"""The attention op as Triton kernels: out = softmax([softcap(q @ k^T * scale) + bias, sink])
@ [v; 0] (ops/fused.py; softcap(s) = tanh(s) * softcap when softcap is nonzero, else s; the
sink, a logit per head and query row or -inf for none, starts each row's online softmax).

Covered: q [B, H, S, D], k [B', Hkv, T, D], v [B', Hkv, T, Dv] (B' = B or 1; H a multiple of
Hkv: grouped-query attention), out [B, H, S, Dv], all at any element strides and in float32,
float16 or bfloat16 (computed in float32, stored in out's dtype); a bias that broadcasts to
[B, H, S, T] at any strides, or a finite scalar (no mask: a constant shift leaves the softmax
as it is). A query row that sees no key is 0, as in the reference.

One kernel, `_attention_fwd`, in flash-attention form (online softmax over key blocks). Its
program takes a block of the rows of one (batch, kv head): the S x group query rows that read
that kv head, so that K and V are loaded once for the group. Its variants (constexprs):
  MODE   NO_MASK (no bias), BIAS (the bias tile loaded through its strides; a key block whose
         tile is -inf everywhere is skipped without loading K or V: a KV cache's unused tail),
         CAUSAL (a constant bias that is exactly the causal mask: the mask comes from indices,
         no bias is loaded, and a block's key loop stops at its last visible key)
  SPLIT  decode (S <= 4, T >= 256): split-K ("flash-decoding"), the keys cut into splits
         (num_splits) each with its own program writing partial (max, sum, acc) to scratch
         allocated at plan time; `_combine` then merges the splits into out.

Declines (None): q not 4-D, k or v not 4-D or not matching q, an empty dimension, a dtype
other than float32/float16/bfloat16 (the bias's too), a bias that does not broadcast, a
non-finite scalar bias.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from ...ir import Node
from ...ops import operands_of
from .common import tanh
from .launch import FLOATS, Launch, Operand, device, interpreting

NO_MASK, BIAS, CAUSAL = 0, 1, 2
MODE_NAMES = {NO_MASK: "nomask", BIAS: "bias", CAUSAL: "causal"}


def _pow2(n: int, lo: int, hi: int = 1 << 16) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def blocking(rows: int, keys: int, d: int, combine_rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_R): query rows and keys per attention program, rows per
    combine program.
    Compiled: GPU-sized tiles, 64 rows x 64 keys (32 x 32 past head size 128, for registers;
    rows down to 16, tl.dot's least, when a kv head has fewer), 4 rows per combine program.
    Interpreted: every block operation is a Python call over numpy (a program of this kernel
    takes tens of ms, a key iteration a good part of that) while a bigger block costs little:
    up to 128 rows x 256 keys, so that a small shape is one program per (batch, kv head) and
    one key iteration, and one combine program."""
    if interpreting():
        return _pow2(rows, 16, 128), _pow2(keys, 16, 256), _pow2(combine_rows, 2, 64)
    if d > 128:
        return _pow2(rows, 16, 32), 32, 4
    return _pow2(rows, 16, 64), 64, 4


# the tilings autotune.py measures beside the fixed one, by head size (registers):
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
TILINGS = {
    "head <= 128": [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2), (64, 32, 4, 3),
                    (32, 64, 4, 2), (16, 64, 4, 3), (16, 128, 4, 2), (16, 32, 4, 2)],
    "head > 128": [(32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2), (16, 32, 4, 2),
                   (16, 64, 4, 2), (64, 64, 8, 1)],
}


def attention_choices(rows: int, keys: int, d: int) -> list[dict[str, int]]:
    """The (BLOCK_M, BLOCK_N) tilings worth measuring for a flash-attention launch of `rows`
    query rows per (batch, kv head) over `keys` keys (autotune.py), the fixed choice
    (blocking) first: compiled, TILINGS' class of the head size, less blocks much larger
    than the rows or keys (up to 128 rows, 256 keys); interpreted, the fixed one alone.
    (Triton's defaults, 4 warps and 3 stages, go with the fixed one.)"""
    block_m, block_n, _ = blocking(rows, keys, d, 1)
    fixed = {"BLOCK_M": block_m, "BLOCK_N": block_n}
    if interpreting():
        return [fixed]
    table = TILINGS["head > 128" if d > 128 else "head <= 128"]
    fits = [t for t in table if t[:4] != (block_m, block_n, 4, 3)
            and t[0] <= _pow2(rows, 16, 128) and t[1] <= _pow2(keys, 16, 256)]
    return [fixed, *(dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), t))
                     for t in fits)]


def num_splits(t: int) -> int:
    """Key splits of a decode step: about 256 keys or more each, so that a split's fixed cost
    (its q tile, its partial write and share of the combine) is spread over several key
    blocks; at most 64 compiled (with a few (batch, kv head) pairs, enough programs for an
    H200's 132 SMs at long T), 4 interpreted (each program costs tens of ms)."""
    return max(1, min(4 if interpreting() else 64, triton.cdiv(t, 256)))


@triton.jit
def _attend_block(q_tile, k_head, v_head, offs_n, offs_d, offs_dv, T, D, DV,
                  sk_t, sk_d, sv_t, sv_d, scale, softcap, bias_tile, m_i, l_i, acc,
                  CAPPED: tl.constexpr):
    """One key block into the running (max, sum, acc) of the rows, in float32. A row whose
    scores are all -inf so far keeps max -inf, sum 0 and acc 0 (no NaN: exp is taken
    against 0 then)."""
    n_ok = offs_n < T
    kt = tl.load(k_head + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
                 mask=n_ok[None, :] & (offs_d < D)[:, None], other=0.0).to(tl.float32)
    s = tl.dot(q_tile, kt, input_precision="ieee") * scale
    if CAPPED:
        s = tanh(s) * softcap
    s = s + bias_tile
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_use[:, None])
    alpha = tl.exp(m_i - m_use)
    vt = tl.load(v_head + offs_n[:, None] * sv_t + offs_dv[None, :] * sv_d,
                 mask=n_ok[:, None] & (offs_dv < DV)[None, :], other=0.0).to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
    return m_new, l_i * alpha + tl.sum(p, 1), acc


@triton.jit
def _attention_fwd(q, k, v, bias, sinks, out, m_part, l_part,
                   S, T, H, HKV, GROUP, D, DV, keys_per_split, n_rows, scale, softcap,
                   sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
                   sb_b, sb_h, sb_s, sb_t, sn_b, sn_h, sn_s, sn_t, so_k, so_b, so_h, so_s, so_d,
                   MODE: tl.constexpr, SPLIT: tl.constexpr, CAPPED: tl.constexpr,
                   SINKS: tl.constexpr,
                   BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid (cdiv(S * GROUP, BLOCK_M), B * HKV, splits). Row r of a (batch, kv head) is query
    position r // GROUP of head kvh * GROUP + r % GROUP (position-major, so that a block's
    rows span consecutive positions: the causal key bound of its last row bounds them all).
    SPLIT: keys [split * keys_per_split, + keys_per_split), the unnormalized acc to out (the
    scratch [splits, B, H, S, DV]), max and sum to m_part, l_part [splits, B, H, S]."""
    pid_m, pid_bh, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kvh = pid_bh // HKV, pid_bh % HKV
    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < S * GROUP
    pos, h = r // GROUP, kvh * GROUP + r % GROUP
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q_rows = q + b * sq_b + h * sq_h + pos * sq_s
    q_tile = tl.load(q_rows[:, None] + offs_d[None, :] * sq_d,
                     mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0).to(tl.float32)
    k_head, v_head = k + b * sk_b + kvh * sk_h, v + b * sv_b + kvh * sv_h
    bias_rows = bias + b * sb_b + h * sb_h + pos * sb_s

    lo = split * keys_per_split
    hi = tl.minimum(T, lo + keys_per_split)
    if MODE == 2:  # key j is visible from position i when j <= i + T - S
        last = tl.minimum(pid_m * BLOCK_M + BLOCK_M, S * GROUP) - 1
        hi = tl.minimum(hi, last // GROUP + 1 + T - S)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:  # the sink is a key of value 0 (in the first split only)
        sink = tl.load(sinks + b * sn_b + h * sn_h + pos * sn_s, mask=row_ok,
                       other=float("-inf")).to(tl.float32)
        sink = tl.where(split == 0, sink, float("-inf"))
        m_i = tl.maximum(m_i, sink)
        l_i = tl.where(sink > float("-inf"), 1.0, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n[None, :] < hi
        if MODE == 1:  # a tile that is -inf everywhere adds nothing: K and V stay unread
            bias_tile = tl.load(bias_rows[:, None] + offs_n[None, :] * sb_t,
                                mask=row_ok[:, None] & live, other=float("-inf")).to(tl.float32)
            any_live = tl.max(bias_tile) > float("-inf")
        else:
            if MODE == 2:
                live = live & (offs_n[None, :] <= pos[:, None] + (T - S))
            bias_tile = tl.where(live, 0.0, float("-inf"))
            any_live = start < hi  # always (the loop bound saw to it)
        if any_live:
            m_i, l_i, acc = _attend_block(q_tile, k_head, v_head, offs_n, offs_d, offs_dv,
                                          T, D, DV, sk_t, sk_d, sv_t, sv_d, scale, softcap,
                                          bias_tile, m_i, l_i, acc, CAPPED)

    if SPLIT:
        stat = split * n_rows + (b * H + h) * S + pos
        tl.store(m_part + stat, m_i, mask=row_ok)
        tl.store(l_part + stat, l_i, mask=row_ok)
    else:  # a row that saw no key has sum 0 and acc 0: it stays 0
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = out + split * so_k + b * so_b + h * so_h + pos * so_s
    tl.store(o_rows[:, None] + offs_dv[None, :] * so_d, acc.to(out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv < DV)[None, :])


def _attention_launch(q: Operand, k: Operand, v: Operand, bias: Any, sinks: Any, out: Any,
                      strides: dict[str, tuple[int, ...]], scale: float, softcap: float,
                      mode: int,
                      keys_per_split: int, scratch: tuple[Any, Any] | None, BLOCK_M: int,
                      BLOCK_N: int) -> Launch:
    """The launch of _attention_fwd; out is the out Operand, or (split-K) the acc scratch
    with (m, l) scratch beside it."""
    B, H, S, D = q.shape
    HKV, T, DV = k.shape[1], k.shape[2], v.shape[3]
    group = H // HKV
    splits = triton.cdiv(T, keys_per_split)
    m_part, l_part = scratch if scratch else (0, 0)
    name = "flash_decoding" if scratch else "flash_attention"
    return Launch(
        name=f"{name}_{MODE_NAMES[mode]}", kernel=_attention_fwd,
        grid=(triton.cdiv(S * group, BLOCK_M), B * HKV, splits),
        args=[q, k, v, bias, sinks, out, m_part, l_part, S, T, H, HKV, group, D, DV,
              keys_per_split, B * H * S, scale, softcap, *strides["q"], *strides["k"],
              *strides["v"], *strides["bias"], *strides["sinks"], *strides["out"]],
        constexprs={"MODE": mode, "SPLIT": scratch is not None, "CAPPED": bool(softcap),
                    "SINKS": sinks is not q,
                    "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_D": _pow2(D, 16),
                    "BLOCK_DV": _pow2(DV, 16)})


@triton.jit
def _combine(acc_part, m_part, l_part, out, R, H, S, NSPLIT, DV, so_b, so_h, so_s, so_d,
             BLOCK_R: tl.constexpr, BLOCK_SPLIT: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid (cdiv(B * H * S, BLOCK_R),): out row r = sum_k w_k acc_k / sum_k w_k l_k with
    w_k = exp(m_k - max_k m_k), a split that saw no key (m -inf) weighing 0, a row that saw
    none at all 0."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    sp, d = tl.arange(0, BLOCK_SPLIT), tl.arange(0, BLOCK_DV)
    ok = (r < R)[:, None] & (sp < NSPLIT)[None, :]
    stat = sp[None, :] * R + r[:, None]
    m = tl.load(m_part + stat, mask=ok, other=float("-inf"))
    m_max = tl.max(m, 1)
    w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max)[:, None])
    den = tl.sum(w * tl.load(l_part + stat, mask=ok, other=0.0), 1)
    d_ok = (d < DV)[None, None, :]
    a = tl.load(acc_part + stat[:, :, None] * DV + d[None, None, :], mask=ok[:, :, None] & d_ok,
                other=0.0)
    o = tl.sum(w[:, :, None] * a, 1) / tl.where(den == 0.0, 1.0, den)[:, None]
    o_rows = out + (r // (H * S)) * so_b + (r // S % H) * so_h + (r % S) * so_s
    tl.store(o_rows[:, None] + d[None, :] * so_d, o.to(out.dtype.element_ty),
             mask=(r < R)[:, None] & (d < DV)[None, :])


def _combine_launch(out: Operand, scratch: tuple[torch.Tensor, ...], splits: int,
                    BLOCK_R: int) -> Launch:
    B, H, S, DV = out.shape
    rows = B * H * S
    acc_part, m_part, l_part = scratch
    return Launch(
        name="flash_decoding_combine", kernel=_combine, grid=(triton.cdiv(rows, BLOCK_R),),
        args=[acc_part, m_part, l_part, out, rows, H, S, splits, DV, *out.strides],
        constexprs={"BLOCK_R": BLOCK_R, "BLOCK_SPLIT": _pow2(splits, 2),
                    "BLOCK_DV": _pow2(DV, 16)})


def _read_strides(op: Operand, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """op's element strides read as `shape` (broadcast from the right: a missing or size-1
    dimension has stride 0), None when it does not broadcast to it."""
    extra = len(op.shape) - len(shape)
    if extra > 0 and any(n != 1 for n in op.shape[:extra]):
        return None
    dims = list(zip(op.shape[max(extra, 0):], op.strides[max(extra, 0):]))
    strides = [0] * max(-extra, 0)
    for n, (size, stride) in zip(shape[max(-extra, 0):], dims):
        if size != n and size != 1:
            return None
        strides.append(stride if size == n and n > 1 else 0)
    return tuple(strides)


def _mask_mode(bias: Operand, s: int, t: int) -> int | None:
    """NO_MASK, CAUSAL (a constant bias that is exactly the causal mask, key j visible from
    position i when j <= i + t - s, for every batch and head) or BIAS; None: a bias that no
    kernel reads (a non-finite scalar, a non-float tensor)."""
    if bias.is_scalar:
        return NO_MASK if math.isfinite(float(bias.scalar)) else None
    if bias.dtype not in FLOATS:
        return None
    c = bias.constant
    if c is None:
        return BIAS
    if not bool(c.any()):
        return NO_MASK
    i = torch.arange(s, device=c.device)[:, None]
    j = torch.arange(t, device=c.device)[None, :]
    causal = torch.zeros((s, t), dtype=c.dtype, device=c.device).masked_fill_(
        j > i + (t - s), float("-inf"))
    return CAUSAL if bool((c.reshape(bias.shape) == causal).all()) else BIAS


def plan_attention(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """The launches of attention(q, k, v, bias, sinks; scale, softcap) into out, or None
    (declined)."""
    x = operands_of("attention", ins)
    q, k, v, bias, sinks = x.q, x.k, x.v, x.bias, x.sinks
    if sinks.is_scalar and float(sinks.scalar) != float("-inf") or \
            not sinks.is_scalar and sinks.dtype not in FLOATS:
        return None  # a sink the same for every row: no rule makes one
    if any(len(x.shape) != 4 or x.dtype not in FLOATS for x in (q, k, v, out)):
        return None
    B, H, S, D = q.shape
    HKV, T, DV = k.shape[1], k.shape[2], v.shape[3]
    if 0 in q.shape + k.shape + v.shape or H % HKV or v.shape[1:3] != (HKV, T) or \
            k.shape[3] != D or out.shape != (B, H, S, DV):
        return None
    strides = {"q": q.strides, "out": out.strides,
               "k": _read_strides(k, (B, HKV, T, D)), "v": _read_strides(v, (B, HKV, T, DV)),
               "bias": (0,) * 4 if bias.is_scalar else _read_strides(bias, (B, H, S, T)),
               "sinks": (0,) * 4 if sinks.is_scalar else _read_strides(sinks, (B, H, S, 1))}
    mode = None if any(s is None for s in strides.values()) else _mask_mode(bias, S, T)
    if mode is None:
        return None
    if mode != BIAS:  # nothing to read
        strides["bias"] = (0,) * 4
    scale, reads = float(node.attrs["scale"]), bias if mode == BIAS else q
    softcap = float(node.attrs.get("softcap", 0.0))
    sinks = q if sinks.is_scalar else sinks  # q: a pointer the kernel never reads
    splits = num_splits(T) if S <= 4 and T >= 256 else 1
    BLOCK_M, BLOCK_N, BLOCK_R = blocking(S * (H // HKV), triton.cdiv(T, splits), D, B * H * S)
    if splits == 1:  # one launch writing out (args[5]): its tiling measured (autotune.py)
        strides["out"] = (0, *out.strides)
        launch = _attention_launch(q, k, v, reads, sinks, out, strides, scale, softcap, mode,
                                   T, None, BLOCK_M, BLOCK_N)
        tilings = attention_choices(S * (H // HKV), T, D)
        launch.choices = [((triton.cdiv(S * (H // HKV), t["BLOCK_M"]), B * HKV, 1), t)
                          for t in tilings]
        launch.writes = (5,)
        return [launch]
    # split-K decode: the key blocks set the splits and their scratch, so its tiling is fixed
    # whole key blocks per split; rounding up may leave fewer splits than asked for
    keys_per_split = triton.cdiv(triton.cdiv(T, splits), BLOCK_N) * BLOCK_N
    splits = triton.cdiv(T, keys_per_split)

    dev = device()
    acc_part = torch.empty((splits, B, H, S, DV), dtype=torch.float32, device=dev)
    m_part = torch.empty((splits, B, H, S), dtype=torch.float32, device=dev)
    l_part = torch.empty_like(m_part)
    strides["out"] = acc_part.stride()
    return [_attention_launch(q, k, v, reads, sinks, acc_part, strides, scale, softcap, mode,
                              keys_per_split,
                              (m_part, l_part), BLOCK_M, BLOCK_N),
            _combine_launch(out, (acc_part, m_part, l_part), splits, BLOCK_R)]
