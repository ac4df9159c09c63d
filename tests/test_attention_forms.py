"""Attention as users' models reach it: scaled_dot_product_attention (no mask, is_causal, boolean
and additive masks, explicit scale, enable_gqa), grouped-query attention through repeat_kv, and
the decomposed forms with and without a mask, with logit softcapping (Gemma 2) and with ALiBi
(BLOOM's baddbmm on merged heads, MPT's masked_fill with the lowest float), GPT-Neo's where
with the lowest float as a 0-d tensor, XGLM's floor at the lowest float, CPM-Ant's
probabilities masked to 0 after the softmax, and BART's eager
attention on heads merged into the batch, and attention sinks (GPT-OSS): each becomes one
`attention` kernel that reads each KV head once, and matches eager. Plus the kernel's own edge
cases: KV-head groups and rows that see no key (zero, as sdpa gives)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eqsat_llm import optimize
from eqsat_llm.codegen.c import CRuntime, emit_attention
from eqsat_llm.codegen.c.blas import openblas_dir
from eqsat_llm.ir import Graph
from eqsat_llm.ops import evaluate
from tests.conftest import NO_SINK, scalar
from tests.eager_oracle import OPS as EAGER
from tests.test_c_backend import check, const, inp, rand_inputs


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:  # transformers' spelling
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class Attn(torch.nn.Module):
    """q from x; k, v with fewer heads (GQA) repeated as transformers does, or via enable_gqa."""

    def __init__(self, form: str, heads: int = 4, kv: int = 2, d: int = 16):
        super().__init__()
        self.form, self.h, self.kv, self.d = form, heads, kv, d
        self.q = torch.nn.Linear(heads * d, heads * d, bias=False)
        self.k = torch.nn.Linear(heads * d, kv * d, bias=False)
        self.v = torch.nn.Linear(heads * d, kv * d, bias=False)
        self.sinks = torch.nn.Parameter(torch.randn(heads) + 1.0)  # the "sinks" form's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv, self.d).transpose(1, 2)
        n = self.h // self.kv
        if self.form == "sdpa-gqa-flag":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = repeat_kv(k, n), repeat_kv(v, n)
            if self.form == "sdpa":
                o = F.scaled_dot_product_attention(q, k, v)
            elif self.form == "sdpa-causal":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
            elif self.form == "sdpa-bool":
                mask = torch.ones(s, s, dtype=torch.bool).tril()
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            elif self.form == "sdpa-float":
                mask = torch.zeros(s, s).masked_fill(torch.ones(s, s).triu(1).bool(), -1e9)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            elif self.form == "decomposed-softcap":  # Gemma 2: tanh(s / cap) * cap, + mask
                bias = torch.full((s, s), float("-inf")).triu(1)
                scores = q @ k.transpose(-2, -1) * self.d ** -0.5
                o = torch.softmax(torch.tanh(scores / 0.5) * 0.5 + bias, -1) @ v
            elif self.form == "alibi-baddbmm":  # BLOOM: alibi.baddbmm on heads merged in batch
                slopes = torch.tensor([2.0 ** -(i + 1) for i in range(self.h)])
                alibi = (slopes[:, None, None] * torch.arange(s)[None, None, :]).repeat(b, 1, 1)
                scores = alibi.baddbmm(q.reshape(b * self.h, s, self.d),
                                       k.reshape(b * self.h, s, self.d).transpose(1, 2),
                                       beta=1.0, alpha=self.d ** -0.5)
                bias = torch.full((s, s), float("-inf")).triu(1)
                o = torch.softmax(scores.view(b, self.h, s, s) + bias, -1) @ v
            elif self.form == "alibi-masked-fill":  # MPT: + alibi, masked_fill(finfo.min)
                slopes = torch.tensor([2.0 ** -(i + 1) for i in range(self.h)])
                alibi = slopes[:, None, None] * torch.arange(s)[None, None, :]
                scores = q @ k.transpose(-2, -1) * self.d ** -0.5 + alibi
                hidden = torch.ones(s, s, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(hidden, torch.finfo(torch.float32).min)
                o = torch.softmax(scores, -1) @ v
            elif self.form == "sinks":  # GPT-OSS: a logit per head joins each row's softmax
                bias = torch.full((s, s), float("-inf")).triu(1)
                w = q @ k.transpose(-2, -1) * self.d ** -0.5 + bias
                sinks = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, s, -1)
                w = torch.cat([w, sinks], -1)
                w = w - w.max(-1, keepdim=True).values
                o = torch.softmax(w, -1)[..., :-1] @ v
            elif self.form == "where-lowest":  # GPT-Neo: where(keep, s, finfo.min), a 0-d tensor
                keep = torch.ones(s, s, dtype=torch.bool).tril()
                w = q @ k.transpose(-2, -1)
                w = torch.where(keep, w, torch.tensor(torch.finfo(w.dtype).min))
                o = torch.softmax(w, -1) @ v
            elif self.form == "floor-lowest":  # XGLM: maximum(s + mask, finfo.min), 0-d tensor
                mask = torch.zeros(s, s).masked_fill(torch.ones(s, s).triu(1).bool(),
                                                     torch.finfo(torch.float32).min)
                w = q @ k.transpose(-2, -1) * self.d ** -0.5 + mask
                w = torch.maximum(w, torch.tensor(torch.finfo(torch.float32).min))
                o = torch.softmax(w, -1) @ v
            elif self.form == "zeroed-probs":  # CPM-Ant: + position bias, -inf fill, 0 fill
                hidden = torch.ones(s, s, dtype=torch.bool).triu(1)
                position_bias = torch.arange(s)[:, None] - torch.arange(s)[None, :] * 0.1
                w = q @ k.transpose(-2, -1) / self.d ** 0.5 + position_bias
                w = torch.softmax(w.masked_fill(hidden, torch.scalar_tensor(float("-inf"))), -1)
                o = w.masked_fill(hidden, torch.scalar_tensor(0.0)) @ v
            elif self.form == "bmm-merged-heads":  # BART's eager attention, heads in the batch
                bias = torch.full((s, s), float("-inf")).triu(1)
                q3, k3, v3 = (t.reshape(b * self.h, s, self.d) for t in (q * self.d ** -0.5, k, v))
                w = torch.bmm(q3, k3.transpose(1, 2)).view(b, self.h, s, s) + bias
                w = torch.softmax(w.view(b * self.h, s, s), -1)
                o = torch.bmm(w, v3).view(b, self.h, s, self.d)
            elif self.form == "decomposed-no-mask":
                o = torch.softmax(q @ k.transpose(-2, -1) * self.d ** -0.5, -1) @ v
            else:
                assert self.form == "decomposed-mask"
                bias = torch.full((s, s), float("-inf")).triu(1)
                o = torch.softmax(q @ k.transpose(-2, -1) * self.d ** -0.5 + bias, -1) @ v
        return o.transpose(1, 2).reshape(b, s, self.h * self.d)


FORMS = ["sdpa", "sdpa-causal", "sdpa-bool", "sdpa-float", "sdpa-gqa-flag",
         "decomposed-no-mask", "decomposed-mask", "decomposed-softcap", "alibi-baddbmm",
         "alibi-masked-fill", "bmm-merged-heads", "sinks", "where-lowest", "floor-lowest",
         "zeroed-probs"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("seq", [1, 19])
def test_each_form_is_one_attention_kernel_reading_kv_heads_once(form, seq):
    torch.manual_seed(0)
    model, x = Attn(form).eval(), torch.randn(1, seq, 64)
    compiled = optimize(model, (x,), measure_eager=False)
    ops = compiled.report.op_counts_after
    assert compiled.report.backend == "c"
    assert ops.get("attention") == 1, ops
    assert not {"sdpa", "sdpa_masked", "softmax", "expand"} & set(ops), ops  # no repeat made
    (att,) = [n for n in compiled.graph.nodes if n.op == "attention"]
    assert compiled.graph.type_of(att.inputs[1]).shape[1] == 2  # k: the 2 KV heads
    with torch.no_grad():
        for inp_ in (x, torch.randn(1, seq, 64)):
            torch.testing.assert_close(compiled(inp_), model(inp_), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv", [(4, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("sq,sk", [(1, 37), (13, 13), (70, 70)])
def test_kernel_groups_query_heads_over_kv_heads(heads, kv, sq, sk, monkeypatch):
    g = Graph()
    q = g.add("permute", (inp(g, (2, sq, heads, 16)),), dims=[0, 2, 1, 3])
    k, v = inp(g, (2, kv, sk, 16)), inp(g, (2, kv, sk, 16))
    causal = torch.full((sq, sk), float("-inf")).triu(sk - sq + 1)
    g.outputs = [g.add("attention", (q, k, v, const(g, causal), scalar(g, NO_SINK)), scale=0.25,
                       softcap=0.0)]
    xs = rand_inputs(g)
    ref = evaluate("attention", [xs[0].permute(0, 2, 1, 3), xs[1], xs[2], causal, NO_SINK],
                   {"scale": 0.25, "softcap": 0.0})
    want = torch.stack([F.scaled_dot_product_attention(
        xs[0].permute(0, 2, 1, 3)[:, h:h + 1], xs[1][:, h // (heads // kv)][:, None],
        xs[2][:, h // (heads // kv)][:, None], attn_mask=causal, scale=0.25)[:, 0]
        for h in range(heads)], 1)
    torch.testing.assert_close(ref, want, atol=1e-5, rtol=1e-5)  # the reference itself
    check(g, xs, use_blas=False)
    monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)
    check(g, xs, use_blas=False)  # flash-style kernel
    if openblas_dir() is not None:
        check(g, xs, use_blas=True)


def _on_each_kernel_path(sq: int, sk: int, monkeypatch, *, q_scale: float = 1.0,
                         sinks: torch.Tensor | None = None, softcap: float = 0.0):
    """4 query heads over 2 KV heads under a causal mask, with the sinks and softcap given:
    the packed, BLAS and flash-style kernels against the eager spelling in torch
    (tests/eager_oracle.py); returns (the eager result, and without sinks and softcap)."""
    g = Graph()
    q, k, v = inp(g, (1, 4, sq, 16)), inp(g, (1, 2, sk, 16)), inp(g, (1, 2, sk, 16))
    causal = torch.full((sq, sk), float("-inf")).triu(sk - sq + 1)
    sink = const(g, sinks) if sinks is not None else scalar(g, NO_SINK)
    g.outputs = [g.add("attention", (q, k, v, const(g, causal), sink), scale=0.25,
                       softcap=softcap)]
    xs = rand_inputs(g)
    xs[0] = xs[0] * q_scale
    extra = [sinks] if sinks is not None else []
    want = EAGER["attention"](xs[:3] + [causal] + extra, {"scale": 0.25, "softcap": softcap})
    plain = EAGER["attention"](xs[:3] + [causal], {"scale": 0.25})
    paths = [(True, False)] + ([(True, True)] if openblas_dir() is not None else [])
    for packed, blas in paths + [(False, False)]:
        if not packed:
            monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)
        got = CRuntime(g, use_blas=blas).run(xs)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return want, plain


@pytest.mark.parametrize("sq,sk", [(1, 37), (70, 70)])
def test_softcapped_scores_on_each_kernel_path(sq, sk, monkeypatch):
    """Logit softcapping (tanh(s) * cap, then the mask) on every kernel path, against Gemma
    2's eager spelling; q is scaled so that the cap bites."""
    want, uncapped = _on_each_kernel_path(sq, sk, monkeypatch, q_scale=8.0, softcap=1.5)
    assert (want - uncapped).abs().max() > 0.1  # the cap changes the answer


@pytest.mark.parametrize("sq,sk", [(1, 37), (70, 70), (12, 8)])
def test_sinks_on_each_kernel_path(sq, sk, monkeypatch):
    """Attention sinks (a logit per head and query row joins the softmax as a key of value
    zero) on every kernel path, against GPT-OSS's eager spelling; (12, 8): the first rows see
    no key but the sink, and are zero."""
    sinks = (torch.randn(1, 4, 1, 1) + 2.0).expand(1, 4, sq, 1)
    want, without = _on_each_kernel_path(sq, sk, monkeypatch, sinks=sinks)
    assert (want - without).abs().max() > 0.05  # the sinks change the answer


@pytest.mark.parametrize("heads,kv,sq", [(6, 2, 3), (8, 2, 1), (4, 4, 5)])
def test_flash_tiles_take_rows_from_every_head_of_a_group(heads, kv, sq, monkeypatch):
    """The flash-style kernel's tile holds the rows of all the query heads of one KV head
    (at decode, the group's heads): a bias and sinks that differ per head and row, and tiles
    that cross from one head's rows to the next (6 x 3 rows in tiles of 8), against the
    eager spelling."""
    sk = 19
    g = Graph()
    q, k, v = inp(g, (2, heads, sq, 16)), inp(g, (2, kv, sk, 16)), inp(g, (2, kv, sk, 16))
    bias = torch.randn(1, heads, sq, sk).masked_fill(torch.rand(1, heads, sq, sk) < 0.3,
                                                     float("-inf"))
    sinks = torch.randn(2, heads, sq, 1)
    g.outputs = [g.add("attention", (q, k, v, const(g, bias), const(g, sinks)), scale=0.25,
                       softcap=0.0)]
    xs = rand_inputs(g)
    want = EAGER["attention"](xs[:3] + [bias, sinks], {"scale": 0.25, "softcap": 0.0})
    monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)
    got = CRuntime(g, use_blas=False).run(xs)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq", [3, 70])
def test_rows_that_see_no_key_are_zero_as_in_sdpa(sq, monkeypatch):
    g = Graph()
    q, k, v = inp(g, (1, 2, sq, 8)), inp(g, (1, 2, sq, 8)), inp(g, (1, 2, sq, 8))
    mask = torch.ones(sq, sq, dtype=torch.bool).tril()
    mask[1] = False  # row 1 sees nothing (a padded query)
    bias = torch.zeros(sq, sq).masked_fill(~mask, float("-inf"))
    g.outputs = [g.add("attention", (q, k, v, const(g, bias), scalar(g, NO_SINK)), scale=0.5,
                       softcap=0.0)]
    xs = rand_inputs(g)
    want = F.scaled_dot_product_attention(*xs, attn_mask=mask, scale=0.5)
    assert torch.equal(want[:, :, 1], torch.zeros_like(want[:, :, 1]))
    for packed in (True, False):
        if not packed:
            monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)
        got = CRuntime(g, use_blas=False).run(xs)[0]
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq,sk,past", [(1, 300, 40), (16, 96, 21), (70, 300, 130)])
def test_run_time_mask_skips_the_unused_tail_of_a_kv_cache(sq, sk, past, monkeypatch):
    """A KV cache's mask is a run-time value: keys past the valid prefix are -inf for every
    row. Each kernel path finds that extent at run time, skips the tail, and still matches
    the reference, also when a row (a padded query) sees nothing. The tail holds NaN, so a
    key read there would show: the prefill paths skip exactly past the extent, the flash-style
    kernel whole blocks of BK keys."""
    g = Graph()
    q, k, v = inp(g, (1, 2, sq, 16)), inp(g, (1, 2, sk, 16)), inp(g, (1, 2, sk, 16))
    bias = inp(g, (1, 1, sq, sk))
    g.outputs = [g.add("attention", (q, k, v, bias, scalar(g, NO_SINK)), scale=0.25, softcap=0.0)]
    xs = rand_inputs(g)
    visible = torch.arange(sk)[None, :] <= past + torch.arange(sq)[:, None]
    visible[sq // 2] = False  # a query that sees no key
    xs[3] = torch.zeros(1, 1, sq, sk).masked_fill(~visible, float("-inf"))
    want = F.scaled_dot_product_attention(xs[0], xs[1][:, :, :past + sq],
                                          xs[2][:, :, :past + sq],
                                          attn_mask=visible[:, :past + sq], scale=0.25)
    paths = [(True, False)] + ([(True, True)] if openblas_dir() is not None else [])
    for packed, blas in paths + [(False, False)]:
        end = past + sq
        if not packed:
            monkeypatch.setattr(emit_attention, "PACKED_SCRATCH", 0)  # the flash-style kernel
            end = -(-end // emit_attention.BK) * emit_attention.BK
        cache = [x.clone() for x in xs]
        for t in (1, 2):
            cache[t][:, :, end:] = float("nan")  # the cache's unused tail
        rt = CRuntime(g, use_blas=blas)
        got = rt.run(cache)[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        if sq >= emit_attention.BLAS_MIN_ROWS and (packed or blas):
            assert "!= -INFINITY) { kend = j + 1; break; }" in rt.source


@pytest.mark.parametrize("form", ["decomposed-softcap", "sinks", "alibi-baddbmm"])
def test_softcap_sinks_and_alibi_forms_on_triton(form):
    # the same rules, the Triton kernels (interpreted here): one attention kernel, eager's values
    torch.manual_seed(0)
    model, x = Attn(form).eval(), torch.randn(1, 19, 64)
    compiled = optimize(model, (x,), backend="triton", measure_eager=False)
    assert compiled.report.op_counts_after.get("attention") == 1
    assert not compiled.report.torch_ops, compiled.report.torch_ops
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
