"""The Triton attention kernels (codegen/triton/attention.py) against the op's reference
semantics, in Triton's interpreter: the flash-attention variants (no mask, bias, causal), the
split-K decode path and its combine, broadcast and non-contiguous operands, grouped-query
attention, rows that see no key, and what declines."""

from __future__ import annotations

import math

import pytest
import torch

import eqsat_llm  # noqa: F401  (sets TRITON_INTERPRET=1 before Triton is imported)
from eqsat_llm.codegen.triton import attention
from eqsat_llm.codegen.triton.attention import CAUSAL, plan_attention
from eqsat_llm.codegen.triton.launch import Operand
from eqsat_llm.ir import Node, TensorType

from .eager_oracle import OPS as EAGER
from .triton_device import run_launches

NEG = float("-inf")


def operand(node: int, x, constant: bool = False) -> Operand:
    if not isinstance(x, torch.Tensor):
        return Operand(node=node, shape=(), strides=(), dtype="float32", scalar=x)
    return Operand(node=node, shape=tuple(x.shape), strides=tuple(x.stride()),
                   dtype=str(x.dtype).removeprefix("torch."), constant=x if constant else None)


def plan(q, k, v, bias, out, scale, constant=False, softcap=0.0, sinks=NEG):
    ins = [operand(i, x, constant and i == 3) for i, x in enumerate([q, k, v, bias, sinks])]
    node = Node(id=5, op="attention", inputs=(0, 1, 2, 3, 4),
                attrs={"scale": scale, "softcap": softcap},
                type=TensorType(tuple(out.shape), str(out.dtype).removeprefix("torch.")))
    return plan_attention(node, operand(5, out), ins)


def check(q, k, v, bias, *, constant=False, out=None, tol=1e-4, softcap=0.0, sinks=NEG):
    """Plan, run every launch in order, compare with the reference; the launches' names."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = torch.full(q.shape[:3] + v.shape[-1:], float("nan"), dtype=q.dtype)
    launches = plan(q, k, v, bias, out, scale, constant, softcap, sinks)
    assert launches is not None
    run_launches(launches, [q, k, v, bias, sinks, out])
    ref = EAGER["attention"]([x.float() if isinstance(x, torch.Tensor) else x
                              for x in (q, k, v, bias, sinks)],
                             {"scale": scale, "softcap": softcap})  # sdpa or the eager form
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    return [launch.name for launch in launches]


def qkv(b=2, h=4, hkv=2, s=37, t=37, d=16, dv=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(b * 1000 + h * 100 + hkv * 10 + s + t + d)
    return [torch.randn(shape, generator=g).to(dtype) for shape in
            ((b, h, s, d), (b, hkv, t, d), (b, hkv, t, dv or d))]


def causal_mask(s, t):
    i, j = torch.arange(s)[:, None], torch.arange(t)[None, :]
    return torch.zeros(s, t).masked_fill(j > i + (t - s), NEG)


@pytest.fixture(params=["interpreted", "compiled"])
def blocks(request, monkeypatch):
    """Both block choices under the interpreter: its own (one block for a small shape) and
    the GPU's (64 x 64 tiles, more splits), which take the multi-block paths: the online
    softmax across key blocks, the causal loop bound, bias tiles skipped."""
    if request.param == "compiled":
        monkeypatch.setattr(attention, "interpreting", lambda: False)
    return request.param


@pytest.mark.parametrize("s,t", [(37, 37), (37, 100), (100, 100), (37, 20)])
def test_causal_constant_mask(blocks, s, t):
    # (37, 20): more queries than keys, rows 0..16 see none
    if blocks == "interpreted" and (s, t) == (100, 100):
        pytest.skip("one block either way: covered by (37, 100)")
    mask = causal_mask(s, t)[None, None]
    names = check(*qkv(s=s, t=t), mask, constant=True)
    assert names == ["flash_attention_causal"]


def test_causal_variant_reads_no_bias():
    q, k, v = qkv(s=5, t=9)
    launches = plan(q, k, v, causal_mask(5, 9), torch.empty(2, 4, 5, 16), 0.25, constant=True)
    assert launches[0].constexprs["MODE"] == CAUSAL
    assert launches[0].args[3].node == 0  # q stands in for the bias it never loads


def test_non_causal_constant_mask(blocks):
    # a sliding window of 8 keys: constant, but not the causal mask; rows 0..3 see nothing
    q, k, v = qkv(s=37, t=100)
    i, j = torch.arange(37)[:, None], torch.arange(100)[None, :] - 63
    mask = torch.zeros(37, 100).masked_fill((j > i) | (j <= i - 8), NEG)
    mask[:4] = NEG
    assert check(q, k, v, mask, constant=True) == ["flash_attention_bias"]


def test_runtime_padding_mask_with_blind_rows(blocks):
    q, k, v = qkv(hkv=4, s=37, t=100)
    mask = torch.zeros(2, 1, 37, 100)
    mask[0, ..., 60:] = NEG  # batch 0: 60 valid keys, the last key tile all -inf
    mask[1, :, 30:] = NEG  # batch 1: rows 30.. see no key
    assert check(q, k, v, mask) == ["flash_attention_bias"]


@pytest.mark.parametrize("shape", [(1, 1, 37, 37), (2, 1, 1, 37), (37,), ()])
def test_broadcast_bias(shape):
    g = torch.Generator().manual_seed(len(shape))
    mask = torch.randn(shape, generator=g)
    if len(shape) == 4:
        mask = mask.masked_fill(torch.rand(shape, generator=g) < 0.3, NEG)
    assert check(*qkv(), mask) == ["flash_attention_bias"]


@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_grouped_query_heads(hkv):
    assert check(*qkv(hkv=hkv, s=3, t=37, d=32, dv=16), 0.0) == ["flash_attention_nomask"]


def test_kv_shared_across_batch():
    q, k, v = qkv(hkv=1, s=3, t=37)
    check(q, k[:1], v[:1], 0.0)


def test_non_contiguous_operands():
    q, k, v = qkv(b=1, s=37, t=37, d=32)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a [B, S, H, D] buffer read as BHSD
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    v = torch.cat([v, v], -1)[..., ::2]  # a column stride of 2
    out = torch.empty(1, 37, 4, 32).transpose(1, 2)
    mask = causal_mask(37, 37).t().contiguous().t()  # column-major bias
    check(q, k, v, mask, out=out)
    assert not q.is_contiguous() and not out.is_contiguous()


@pytest.mark.parametrize("s,hkv", [(1, 4), (3, 2), (1, 1)])
def test_decode_split_k(blocks, s, hkv):
    # a KV cache of 300 slots, each batch its own valid length; batch 1 sees nothing
    q, k, v = qkv(hkv=hkv, s=s, t=300, d=32)
    lengths = [200, 0]
    mask = torch.zeros(2, 1, 1, 300)
    for b, n in enumerate(lengths):
        mask[b, ..., n:] = NEG
    assert check(q, k, v, mask) == ["flash_decoding_bias", "flash_decoding_combine"]


def test_decode_split_k_causal():
    q, k, v = qkv(s=3, t=300)
    assert check(q, k, v, causal_mask(3, 300), constant=True) == [
        "flash_decoding_causal", "flash_decoding_combine"]


def test_num_splits():
    assert attention.num_splits(300) == 2 and attention.num_splits(256) == 1
    assert attention.num_splits(1 << 20) == (4 if attention.interpreting() else 64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    q, k, v = qkv(s=37, t=37, dtype=dtype)
    tol = 2e-3 if dtype == torch.float16 else 1e-2  # the output's rounding
    check(q, k, v, causal_mask(37, 37).to(dtype), constant=True, tol=tol)
    check(*qkv(s=1, t=300, dtype=dtype), torch.zeros(1, 300, dtype=dtype), tol=tol)


def test_declines():
    q, k, v = qkv()
    out = torch.empty(2, 4, 37, 16)
    assert plan(q[0], k[0], v[0], 0.0, out[0], 0.25) is None  # 3-D
    assert plan(q.double(), k, v, 0.0, out, 0.25) is None
    assert plan(q, k, v, NEG, out, 0.25) is None  # a non-finite scalar bias
    assert plan(q, k, v, torch.zeros(3, 37), out, 0.25) is None  # does not broadcast
    assert plan(q, k, v, torch.zeros(37, 37, dtype=torch.bool), out, 0.25) is None
    assert plan(q, k[:, :, :, :8], v, 0.0, out, 0.25) is None  # head sizes differ
    assert plan(q, *qkv(hkv=3)[1:], 0.0, out, 0.25) is None  # 4 heads over 3


def test_masked_cache_tail_is_not_read(blocks):
    # key tiles that the run-time mask hides entirely are skipped, K and V unread: NaN there
    # (an arena's garbage) changes nothing, where the plain formula would give NaN
    q, k, v = qkv(s=1, t=300)
    mask = torch.zeros(1, 300).index_fill_(1, torch.arange(100, 300), NEG)
    out = torch.empty(2, 4, 1, 16)
    expected = EAGER["attention"]([q, k, v, mask], {"scale": 0.25})
    k[:, :, 256:], v[:, :, 256:] = float("nan"), float("nan")
    run_launches(plan(q, k, v, mask, out, 0.25), [q, k, v, mask, NEG, out])
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("s,t", [(37, 37), (1, 300)])
def test_softcapped_scores(blocks, s, t):
    """Gemma 2's logit softcapping (tanh(s) * cap before the mask), on the flash kernel and
    on the split-K decode path, against Gemma's eager spelling; scores are scaled up so that
    the cap bites (tanh far from linear)."""
    q, k, v = qkv(s=s, t=t)
    names = check(q * 8.0, k, v, causal_mask(s, t)[None, None], constant=True, softcap=2.0)
    assert any("flash_decoding" in n for n in names) == (s == 1)


@pytest.mark.parametrize("s,t", [(37, 37), (1, 300), (37, 20)])
def test_sinks(blocks, s, t):
    """Attention sinks (GPT-OSS: a logit per head joins each row's softmax as a key of value
    zero), on the flash kernel and the split-K decode path (the sink counted in one split
    only), against GPT-OSS's eager spelling; (37, 20): rows that see no key but the sink are
    zero. Large sinks, so that they take a good part of each row's weight."""
    q, k, v = qkv(s=s, t=t)
    sinks = (torch.randn(1, 4, 1, 1) * 2 + 2).expand(2, 4, s, 1)
    names = check(q, k, v, causal_mask(s, t)[None, None], constant=True, sinks=sinks)
    assert any("flash_decoding" in n for n in names) == (s == 1)
