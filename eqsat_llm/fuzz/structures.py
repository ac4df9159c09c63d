"""The fuzzer's step families for what LLM code builds around its GEMMs: attention with masks
that mask (padding from a run-time attention_mask, causal, additive), a KV cache written in
place (`index_copy_` into a buffer at run-time positions) and other state writes (rows,
slices, a step counter, a decay), stacks of identical layers,
mixture-of-experts routing (softmax, top-k, gathers by index, scatter_add / index_add) and
integer arithmetic (positions, floor division, remainder, bitwise ops, argmax), and shapes
large enough to reach the tiled and split kernels (K, T >= 256). Ops outside the registry
(topk, scatter_add, index_add, index_copy_, ...) run as torch steps between the compiled
segments: the fuzzer checks that they, and the arena around them, are right too.

Top-k only reads a softmax of exact values (inputs): a top-k of computed values could flip at
a near-tie when the compiled program rounds differently, a legitimate difference."""

from __future__ import annotations

from typing import Any

from .builder import FLOAT, Builder, Value
from .layers import KINDS

LARGE_K = (256, 320, 512)  # GEMM K: several of the C kernels' K blocks
LARGE_T = (256, 300)  # keys: several attention key blocks; Triton's split-K decode from 256


def attention(b: Builder, s: int | None = None, t: int | None = None) -> None:
    """sdpa as transformers calls it: projected heads, causal or masked, grouped KV."""
    batch, d = b.draw.choice((1, 2)), b.draw.choice((4, 8, 16))
    s = b.draw.choice((1, 3, 5, 8)) if s is None else s
    kv_heads = b.draw.choice((1, 2))
    heads = kv_heads * b.draw.choice((1, 2))
    t = (s if b.chance(70) else s + b.draw.choice((2, 7))) if t is None else t
    x = _finite_rows(b, batch, s)
    q = _heads(b, x, heads, d)
    kv_src = x if t == s else b.fresh((batch, t, x.shape[-1]), special=False)
    k, v = _heads(b, kv_src, kv_heads, d), _heads(b, kv_src, kv_heads, d)
    mask_kind = b.draw.choice(("none", "causal", "bool", "additive", "padding"))
    mask = None
    if mask_kind in ("bool", "additive"):
        value = None if mask_kind == "bool" else b.draw.choice((float("-inf"), -1e9))
        mask = b.step("causal_mask", [], s=s, t=t, value=value)
    elif mask_kind == "padding":
        mask = _padding_mask(b, batch, s, t, causal=b.chance(50))
    _sdpa(b, q, k, v, mask, causal=mask_kind == "causal" and t == s)


def _finite_rows(b: Builder, batch: int, s: int) -> Value:
    """The [batch, s, width] float32 value attention projects, without NaN or inf: torch's own
    sdpa kernels disagree on them (the CPU flash kernel gives a NaN query row zeros at some
    sizes and NaN at others, the math kernel NaN), so there is no eager answer to match."""
    return b.pick(lambda u: u.dtype == FLOAT and len(u.shape) == 3 and not u.special
                  and u.shape[:2] == (batch, s),
                  lambda: b.fresh((batch, s, b.draw.choice((8, 16))), special=False))


def _sdpa(b: Builder, q: Value, k: Value, v: Value, mask: Value | None, causal: bool) -> None:
    """sdpa of the heads (grouped KV by enable_gqa or transformers' repeat_kv), back to
    [batch, s, heads * d] most often."""
    batch, heads, s, d = q.shape
    gqa = heads != k.shape[1] and b.chance(50)
    if heads != k.shape[1] and not gqa:  # repeat_kv: expand and reshape, as transformers does
        k, v = (_repeat_kv(b, u, heads // u.shape[1]) for u in (k, v))
    kw: dict[str, Any] = {"gqa": gqa} if gqa else {}
    if b.chance(20):
        kw["scale"] = 0.25
    if causal:
        kw["causal"] = True
    out = b.step("sdpa", [q, k, v] + ([mask] if mask is not None else []), **kw)
    if b.chance(60):
        out = b.step("transpose", [out], d0=1, d1=2)
        b.step("reshape", [out], shape=[batch, s, heads * d])


def _padding_mask(b: Builder, batch: int, s: int, t: int, causal: bool) -> Value:
    """transformers' padding mask from a run-time attention_mask of 0s and 1s [batch, t]
    (real zeros: some keys hidden, now and then a whole row), as a boolean keep-mask or an
    additive bias (-inf, or the dtype's minimum as BERT and GPT-2 write it)."""
    am = b.fresh((batch, t), "int64", high=2)
    keep = b.step("reshape", [b.step("to", [am], dtype="bool")], shape=[batch, 1, 1, t])
    if causal:
        keep = b.step("logical_and", [keep, b.step("causal_mask", [], s=s, t=t)])
    form = b.draw.int(0, 2)
    if form == 1:
        return b.step("additive_mask", [keep], value=float("-inf"))
    if form == 2:  # (1 - mask) * min, on the float mask
        hidden = b.step("rsub_scalar", [b.step("to", [keep], dtype=FLOAT)], c=1.0)
        return b.step("mul_scalar", [hidden], c=-3.4028234663852886e38)
    return keep


def _heads(b: Builder, x: Value, heads: int, d: int) -> Value:
    w = b.fresh((heads * d, x.shape[-1]), param=True)
    y = b.step("linear", [x, w])
    y = b.step("reshape", [y], shape=[x.shape[0], x.shape[1], heads, d])
    return b.step("transpose", [y], d0=1, d1=2)


def _repeat_kv(b: Builder, x: Value, n: int) -> Value:
    batch, heads, t, d = x.shape
    y = b.step("unsqueeze", [x], dim=2)
    y = b.step("expand", [y], shape=[batch, heads, n, t, d])
    return b.step("reshape", [y], shape=[batch, heads * n, t, d])


def kv_cache(b: Builder, tc: int | None = None) -> None:
    """A decoder step over a static KV cache: k and v written in place into buffers at
    run-time positions (index_copy_, as transformers' StaticCache), attention over the whole
    cache with a mask from those positions (and sometimes a padding mask). Now and then the
    old cache is read too, so that the write cannot run in place."""
    batch, s, d = b.draw.choice((1, 2)), b.draw.choice((1, 2, 3, 5)), b.draw.choice((4, 8))
    tc = b.draw.choice((8, 16)) if tc is None else tc
    kv_heads = b.draw.choice((1, 2))
    heads = kv_heads * b.draw.choice((1, 2))
    x = _finite_rows(b, batch, s)
    q, k, v = _heads(b, x, heads, d), _heads(b, x, kv_heads, d), _heads(b, x, kv_heads, d)
    pos = b.step("positions", [b.fresh((1,), "int64", high=tc - s + 1)], n=s)
    caches = []
    for new in (k, v):
        cache = b.buffer((batch, kv_heads, tc, d))
        if b.chance(20):  # the old value read as well: the write makes a new buffer
            b.step("mul_scalar", [cache], c=0.5)
        caches.append(b.step("index_copy_", [cache, pos, new], dim=2))
        cache.exact = caches[-1].exact = new.exact  # it holds the computed values now
    keys = b.step("unsqueeze", [b.step("arange", [], n=tc)], dim=0)
    mask = b.step("le", [keys, b.step("unsqueeze", [pos], dim=1)])  # [s, tc]: causal
    if b.chance(30):
        pad = b.step("reshape", [b.step("to", [b.fresh((batch, tc), "int64", high=2)],
                                        dtype="bool")], shape=[batch, 1, 1, tc])
        mask = b.step("logical_and", [mask, pad])
    _sdpa(b, q, caches[0], caches[1], mask, causal=False)


def state(b: Builder) -> None:
    """Other state a model writes in place: rows at run-time indices (buf[idx] = x), a slice
    (buf[:, a:b] = x), a step counter (count += 1, read as positions), a decay (buf *= c); now
    and then the old value is read too."""
    form = b.draw.int(0, 3)
    if form == 2:
        count = b.buffer((1,), "int64", high=50)
        new = b.step("add_", [count], c=1)
        pos = b.step("add", [b.step("arange", [], n=b.draw.choice((1, 4))), new])
        b.step("to", [pos], dtype=FLOAT)
        return
    rows, width = b.draw.choice((4, 8)), b.draw.choice((3, 8))
    buf = b.buffer((rows, width))
    if b.chance(20):
        b.step("mul_scalar", [buf], c=0.5)
    if form == 3:
        written = b.step("mul_", [buf], c=b.draw.choice((0.5, -2.0)))
    else:
        n = b.draw.choice((1, 2, 3))
        src = b.pick(lambda u: u.dtype == FLOAT and u.shape == (n, width),
                     lambda: b.fresh((n, width)))
        if form == 0:
            pos = b.step("positions", [b.fresh((1,), "int64", high=rows - n + 1)], n=n)
            written = b.step("index_put_", [buf, pos, src])
        else:
            written = b.step("slice_assign_", [buf, src], dim=0,
                             start=b.draw.int(0, rows - n))
        buf.exact = written.exact = src.exact and buf.exact
    if b.chance(50):
        b.step(b.draw.choice(("sum", "amax")), [written], dim=-1, keepdim=False)


def layers(b: Builder) -> None:
    """A stack of 2, 4 or 5 identical layers (fuzz/layers.py) on a [batch, s, d] value."""
    x = b.pick(lambda u: u.dtype == FLOAT and len(u.shape) == 3 and 2 <= u.shape[-1] <= 32
               and u.shape[0] * u.shape[1] <= 16 and not u.special,  # (_finite_rows: why)
               lambda: b.fresh((b.draw.choice((1, 2)), b.draw.choice((1, 3, 5, 8)),
                                b.draw.choice((8, 16, 32))), special=False))
    kv = b.draw.choice((1, 2))
    b.step("layers", [x], kind=b.draw.choice(KINDS), count=b.draw.choice((2, 4, 5)),
           d=x.shape[-1], f=b.draw.choice((8, 16, 24)), heads=kv * b.draw.choice((1, 2)),
           kv=kv, dh=b.draw.choice((4, 8)), norm=b.draw.choice(("rms", "rms_by_hand", "layer")),
           causal=b.chance(60), seed=len(b.spec.steps))


def moe(b: Builder) -> None:
    """Mixture-of-experts routing: softmax over experts, top-k, the chosen weights
    renormalised, and the experts' outputs combined by a gather of expert weights
    (index_select + bmm), a dense routing matrix (scatter_add) or per-slot outputs summed
    into their tokens (gather + index_add with floor-divided slot numbers)."""
    x = b.pick(lambda u: u.dtype == FLOAT and len(u.shape) == 2 and u.shape[0] <= 16
               and u.shape[1] <= 32,
               lambda: b.fresh((b.draw.choice((1, 3, 5, 8)), b.draw.choice((4, 8, 16)))))
    t, dim = x.shape
    e, k, f = b.draw.choice((4, 8)), b.draw.choice((1, 2)), b.draw.choice((4, 8, 16))
    probs = b.step("softmax", [b.fresh((t, e), special=False)], dim=-1)  # router logits
    w, idx = (b.step("topk", [probs], k=k, part=part) for part in (0, 1))
    if b.chance(60):
        w = b.step("div", [w, b.step("sum", [w], dim=-1, keepdim=True)])
    experts = b.fresh((e, dim, f), param=True)
    form = b.draw.int(0, 2)
    if form == 0:
        chosen = b.step("index_select", [experts, b.step("reshape", [idx], shape=[-1])], dim=0)
        xs = b.step("expand", [b.step("unsqueeze", [x], dim=1)], shape=[t, k, dim])
        y = b.step("bmm", [b.step("reshape", [xs], shape=[t * k, 1, dim]), chosen])
        y = b.step("reshape", [y], shape=[t, k, f])
        b.step("sum", [b.step("mul", [y, b.step("unsqueeze", [w], dim=-1)])], dim=1,
               keepdim=False)
        return
    every = b.step("permute", [b.step("matmul", [b.step("unsqueeze", [x], dim=0), experts])],
                   dims=[1, 0, 2])  # [t, e, f]: every expert on every token
    if form == 1:
        dense = b.step("scatter_add", [b.step("zeros", [], shape=[t, e]), idx, w], dim=1)
        b.step("sum", [b.step("mul", [every, b.step("unsqueeze", [dense], dim=-1)])], dim=1,
               keepdim=False)
        return
    slots = b.step("expand", [b.step("unsqueeze", [idx], dim=-1)], shape=[t, k, f])
    picked = b.step("mul", [b.step("gather", [every, slots], dim=1),
                            b.step("unsqueeze", [w], dim=-1)])
    token = b.step("floor_divide", [b.step("arange", [], n=t * k)], c=k)
    b.step("index_add", [b.step("zeros", [], shape=[t, f]), token,
                         b.step("reshape", [picked], shape=[t * k, f])], dim=0)


def integers(b: Builder) -> None:
    """Integer arithmetic as model code has it: position ids from a padding mask (cumsum,
    masked_fill), floor division and remainder by a constant, bitwise ops, argmax."""
    form = b.draw.int(0, 3)
    if form == 0:  # transformers' position_ids: cumsum(mask) - 1, 0 at padding
        batch, t = b.draw.choice((1, 2)), b.draw.choice((3, 5, 8, 16))
        am = b.fresh((batch, t), "int64", high=2)
        pos = b.step("add_scalar", [b.step("cumsum", [am], dim=-1)], c=-1)
        pos = b.step("masked_fill", [pos, b.step("logical_not", [b.step("to", [am],
                                                                        dtype="bool")])],
                     value=0)
        if b.chance(50):
            b.step("embedding", [pos, b.fresh((t, b.draw.choice((4, 8))), param=True)])
        else:
            b.step("to", [pos], dtype=FLOAT)
        return
    if form == 3:  # argmax of exact values (no ties to break differently)
        x = b.float_value(exact=True)
        b.step("to", [b.step("argmax", [x], dim=b.draw.int(0, len(x.shape) - 1))], dtype=FLOAT)
        return
    x = b.pick(lambda u: u.is_int, lambda: b.fresh(b.shape(), "int64", high=20))
    if form == 1:
        y = b.step(b.draw.choice(("floor_divide", "remainder")), [x],
                   c=b.draw.choice((2, 3, 7)))
    else:
        y = b.step(b.draw.choice(("bitwise_and", "bitwise_or", "bitwise_xor")),
                   [x, b.fresh(x.shape, b.draw.choice(("int64", "int32")), high=32)])
    if b.chance(50):
        b.step("to", [y], dtype=FLOAT)


def large(b: Builder) -> None:
    """Shapes past the kernels' blocks: a GEMM with K >= 256 (with an rms_norm before it, a
    SwiGLU or a residual after it), attention over >= 256 keys (decode rows: Triton's split-K),
    a KV cache of >= 256 positions."""
    form = b.draw.int(0, 2)
    if form == 1:
        attention(b, s=b.draw.choice((1, 2, 4, 40)), t=b.draw.choice(LARGE_T))
        return
    if form == 2:
        kv_cache(b, tc=b.draw.choice(LARGE_T))
        return
    m, k = b.draw.choice((1, 4, 9, 33)), b.draw.choice(LARGE_K)
    x = b.fresh((m, k) if b.chance(50) else (1, m, k))
    if b.chance(40):
        x = b.step("rms_norm", [x, b.fresh((k,), param=True)], eps=1e-6)
    n = b.draw.choice((24, 48, 100))
    y = b.step("linear", [x, b.fresh((n, k), param=True)]
               + ([b.fresh((n,), param=True)] if b.chance(40) else []))
    if b.chance(30):
        up = b.step("linear", [x, b.fresh((n, k), param=True)])
        y = b.step("mul", [b.step("silu", [y]), up])
    if b.chance(30):
        y = b.step("add", [y, b.fresh(tuple(y.shape))])
