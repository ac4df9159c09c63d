"""Torch eager's answer for an IR graph, independent of the registry: each op runs as the torch
call it stands for, written here from torch's own functions, and a gemm's stored weight is
unpacked from its format's documented layout (docs/quantization.md, docs/sparsity.md), not by
the project's `dequantize` / `unpack`. A kernel test that compares with `ReferenceRuntime`
compares with the registry's reference semantics (`eqsat_llm.ops`), which a bug in the
reference shares; this does not.

`run_eager(graph, inputs)` -> the outputs. `dequantized(fmt, w, w_scale, k, n)` -> the float32
weight [K, N] a gemm of weight format `fmt` multiplies by; `code_rows(x)` -> an int8_dynamic
gemm's activations as its kernel codes and decodes them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from eqsat_llm.capture.converter import run_fallback  # a fallback node is a captured torch call
from eqsat_llm.ir import Graph

BLOCK = 16  # bsr16's block edge


def _number(x: Any) -> Any:
    # a Python number as a 0-dim tensor: promotes as the number does (torch.maximum and
    # friends take tensors only)
    return torch.tensor(x) if isinstance(x, (bool, int, float)) else x


def _binary(fn: Callable[..., Any]) -> Callable[[list[Any], dict], Any]:
    return lambda xs, a: fn(_number(xs[0]), _number(xs[1]))


def _unary(fn: Callable[..., Any]) -> Callable[[list[Any], dict], Any]:
    return lambda xs, a: fn(xs[0])


def _slice(x: torch.Tensor, dim: int, start: int, end: int, step: int) -> torch.Tensor:
    dim = dim % x.dim()
    return x[(slice(None),) * dim + (slice(start, end, step),)]


def _index(xs: list[Any], positions: list[int]) -> torch.Tensor:
    where: list[Any] = [slice(None)] * (max(positions) + 1)
    for p, t in zip(positions, xs[1:]):
        where[p] = t
    return xs[0][tuple(where)]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _source(a: dict) -> Any:
    kind = a["kind"]
    return {"float": float, "int": int, "bool": bool}[kind](a["value"])


def _number_of(v: float, dtype: str) -> Any:
    return v if _dtype(dtype).is_floating_point else int(v)


def _attention(xs: list[Any], a: dict) -> torch.Tensor:
    # the op is sdpa with an additive mask (grouped KV heads, as enable_gqa reads them); with
    # logit softcapping or sinks, the eager attention of the models that have them (sdpa has
    # neither)
    q, k, v, bias, sinks = xs if len(xs) == 5 else (*xs, float("-inf"))
    if a.get("softcap") or isinstance(sinks, torch.Tensor):
        return _eager_attention(q, k, v, bias, sinks, a["scale"], a.get("softcap", 0.0))
    mask = bias if isinstance(bias, torch.Tensor) else None
    if mask is None and bias != 0.0:
        mask = torch.tensor(float(bias))
    if mask is not None and mask.dim() < 2:  # (sdpa broadcasts a mask of 2 dims or more)
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    gqa = q.dim() >= 3 and k.shape[-3] != q.shape[-3]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a["scale"],
                                          enable_gqa=gqa)


def _eager_attention(q, k, v, bias, sinks, scale: float, cap: float) -> torch.Tensor:
    # transformers' eager_attention_forward of Gemma 2 and GPT-OSS: repeat_kv, scores *
    # scaling (Gemma's / cap folded into the op's scale), tanh(s) * cap, + mask; with sinks,
    # GPT-OSS's cat of the sink column, minus the row max, softmax, the column dropped; a row
    # that sees no key (and no sink) is 0, as sdpa gives
    n = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
    k, v = k.repeat_interleave(n, -3), v.repeat_interleave(n, -3)
    s = q @ k.transpose(-2, -1) * scale
    s = (torch.tanh(s) * cap if cap else s) + bias
    if isinstance(sinks, torch.Tensor):
        s = torch.cat([s, sinks.expand(s.shape[:-1] + (1,))], -1)
        probs = torch.softmax(s - s.max(-1, keepdim=True).values, -1)[..., :-1]
    else:
        probs = torch.softmax(s, -1)
    return (probs @ v).masked_fill((s == float("-inf")).all(-1, keepdim=True), 0.0)


def _rope(xs: list[Any], a: dict) -> torch.Tensor:
    # transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin
    x, cos, sin = xs
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


ACTS = {"none": lambda y: y, "relu": F.relu, "silu": F.silu, "gelu": F.gelu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}


# --- weight formats, from their documented layouts -------------------------------------------
def dequantized(fmt: str, w: torch.Tensor, w_scale: Any, k: int, n: int) -> torch.Tensor:
    """The float32 [K, N] weight that a gemm of weight format `fmt` reads from (w, w_scale)."""
    if fmt == "float":
        return w.float()
    if fmt in ("fp16", "bf16"):  # the values themselves, held in a half dtype
        return w.float()
    if fmt in ("int8", "int8_dynamic"):  # q [K, N] int8, one scale per output channel
        return w.float() * w_scale.float()[None, :]
    if fmt in ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3_g128"):  # float8 bytes [K, N]: a sign, e
        # exponent bits of bias b, m mantissa bits (e4m3: 4, 7, 3; e5m2: 5, 15, 2), one scale
        # per channel (fp8_e4m3_g128: per group of 128 rows of a channel)
        e, m = (5, 2) if fmt == "fp8_e5m2" else (4, 3)
        bias = 2 ** (e - 1) - 1
        sign = 1.0 - 2.0 * (w >> 7).float()
        exponent, mantissa = ((w >> m) & (2 ** e - 1)).float(), (w & (2 ** m - 1)).float()
        value = torch.where(exponent > 0, (1 + mantissa / 2 ** m) * 2 ** (exponent - bias),
                            mantissa / 2 ** m * 2.0 ** (1 - bias))
        rows_scale = w_scale.float()[torch.arange(k) // 128] if w_scale.dim() == 2 else \
            w_scale.float()[None, :]
        return sign * value * rows_scale
    if fmt.startswith("int4_g") or fmt == "int4_dynamic":  # nibbles: row 2i low, 2i + 1
        group = 32 if fmt == "int4_dynamic" else int(fmt[len("int4_g"):])  # high, q + 8
        out = torch.empty(k, n)
        out[0::2] = (w & 0x0F).float() - 8
        out[1::2] = (w >> 4).float() - 8
        return out * w_scale.float()[torch.arange(k) // group]
    if fmt == "sparse24":  # in each group of 4 rows: 2 values and their 2-bit positions
        out = torch.zeros(k, n)
        cols = torch.arange(n)
        for g in range(k // 4):
            for j in range(2):
                row = 4 * g + ((w_scale[g].long() >> (2 * j)) & 3)
                out[row, cols] = w[2 * g + j].float()
        return out
    if fmt == "bsr16":  # column pointers, then each stored block's block row
        out = torch.zeros(k, n)
        nj = n // BLOCK
        pointers, rows = w_scale[:nj + 1].tolist(), w_scale[nj + 1:].tolist()
        for j in range(nj):
            for b in range(pointers[j], pointers[j + 1]):
                i = rows[b]
                out[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = w[b].float()
        return out
    raise KeyError(f"eager oracle: no layout for weight format {fmt!r}")


def code_rows(x: torch.Tensor) -> torch.Tensor:
    """int8_dynamic's activations as its kernel sees them (codegen/c/w8a8_gemm.py: each row
    coded in 7 bits with a zero point, q = clamp(rint(a / s) + z, 0, 127), s = (max(a, 0) -
    min(a, 0)) / 127, z = rint(-min(a, 0) / s), the division by s a multiply by its float32
    reciprocal), decoded as s (q - z)."""
    rows = x.reshape(-1, x.shape[-1]).float()
    mn, mx = rows.amin(1, keepdim=True).clamp(max=0), rows.amax(1, keepdim=True).clamp(min=0)
    s = (mx - mn) / 127  # float32 throughout, as the kernel computes
    ok = rows.isfinite().all(1, keepdim=True) & (s >= 1e-30)
    inv = 1.0 / torch.where(ok, s, torch.ones_like(s))
    z = torch.round(-mn * inv).clamp(0, 127)
    q = (torch.round(rows * inv) + z).clamp(0, 127)
    out = torch.where(ok, s * (q - z), torch.zeros_like(rows))
    out = torch.where(rows.isfinite().all(1, keepdim=True), out, float("nan"))
    return out.reshape(x.shape).to(x.dtype)


def code_blocks(x: torch.Tensor) -> torch.Tensor:
    """int4_dynamic's activations as its kernel sees them (codegen/c/quant_gemm.py: each block
    of 32 along K coded q = clamp(rint(a / s), -127, 127), s = max |a| / 127, the division a
    multiply by its float32 reciprocal), decoded as s q."""
    rows = x.reshape(-1, x.shape[-1] // 32, 32).float()
    s = rows.abs().amax(-1, keepdim=True) / 127
    ok = rows.isfinite().all(-1, keepdim=True) & (s >= 1e-30)
    inv = 1.0 / torch.where(ok, s, torch.ones_like(s))
    q = torch.round(rows * inv).clamp(-127, 127)
    out = torch.where(ok, s * q, torch.zeros_like(rows))
    out = torch.where(rows.isfinite().all(-1, keepdim=True), out, float("nan"))
    return out.reshape(x.shape).to(x.dtype)


def _expert_mm(xs: list[Any], a: dict) -> torch.Tensor:
    """Each row times its expert's weight, gathered whole (bmm); stored experts are the
    columns [e n, (e + 1) n) of the dequantized [K, E n] matrix."""
    x, w, w_scale, ids = xs
    if a["weight"] != "float":
        k, n = x.shape[1], a["n"]
        full = dequantized(a["weight"], w, w_scale, k, w.shape[1])
        w = torch.stack([full[:, e * n:(e + 1) * n] for e in range(w.shape[1] // n)])
    return torch.bmm(x.unsqueeze(1), w[ids].to(x.dtype)).squeeze(1)


def _gemm(xs: list[Any], a: dict) -> torch.Tensor:
    x, w, w_scale, norm, addend = xs
    if a["prologue"] == "rms_norm":
        x = F.rms_norm(x, x.shape[-1:], norm, a["eps"])
    n, swiglu = a["n"], a["epilogue"] == "swiglu"
    weight = dequantized(a["weight"], w, w_scale, x.shape[-1], 2 * n if swiglu else n)
    if a["weight"] == "int8_dynamic":
        x = code_rows(x)
    if a["weight"] == "int4_dynamic":
        x = code_blocks(x)
    weight = weight.to(x.dtype)
    if a["epilogue"] == "bias":
        y = torch.addmm(addend, x, weight, beta=a["beta"], alpha=a["alpha"])
    elif swiglu:
        y = F.silu((x @ weight[:, :n]) * a["alpha"]) * ((x @ weight[:, n:]) * a["alpha"])
    else:
        y = (x @ weight) * a["alpha"]
        if a["epilogue"] == "add":
            y = y + addend
    return ACTS[a["act"]](y)


def _quantized(xs: list[Any], a: dict, part: int) -> torch.Tensor:
    # the format from its definition: int8 scale = max|W| / 127 per column; int4 per group
    # of G rows, max|W| / 7 rounded to float16, stored q + 8 two rows a byte
    w, fmt = xs[0].float(), a["fmt"]
    if fmt == "int8":
        s = w.abs().amax(0) / 127
        s = torch.where(s > 0, s, torch.ones_like(s))
        return (w / s).round().clamp(-127, 127).to(torch.int8) if part == 0 else s
    group = int(fmt[len("int4_g"):])
    k, n = w.shape
    s = (w.reshape(k // group, group, n).abs().amax(1) / 7).half().float()
    s = torch.where(s > 0, s, torch.ones_like(s))
    if part == 1:
        return s
    q = ((w / s[torch.arange(k) // group]).round().clamp(-8, 7) + 8).to(torch.uint8)
    return q[0::2] | (q[1::2] << 4)


def _reduce(fn: Callable[..., Any]) -> Callable[[list[Any], dict], Any]:
    return lambda xs, a: fn(xs[0], a["dims"], keepdim=a["keepdim"])


def _any(xs: list[Any], a: dict) -> torch.Tensor:
    if a["dims"]:
        return torch.any(xs[0], a["dims"], keepdim=a["keepdim"])
    return torch.any(xs[0]).reshape([1] * xs[0].dim() if a["keepdim"] else [])


OPS: dict[str, Callable[[list[Any], dict], Any]] = {
    **{name: _binary(fn) for name, fn in {
        "add": operator.add, "sub": operator.sub, "mul": operator.mul,
        "div": operator.truediv, "pow": operator.pow, "maximum": torch.maximum,
        "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
        "le": torch.le, "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
        "logical_or": torch.logical_or, "bitwise_and": torch.bitwise_and,
        "bitwise_or": torch.bitwise_or}.items()},
    **{name: _unary(fn) for name, fn in {
        "neg": torch.neg, "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "exp": torch.exp,
        "log": torch.log, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": F.silu,
        "relu": F.relu, "reciprocal": torch.reciprocal, "abs": torch.abs, "cos": torch.cos,
        "sin": torch.sin, "erf": torch.erf, "expm1": torch.expm1, "log1p": torch.log1p,
        "floor": torch.floor, "logical_not": torch.logical_not,
        "bitwise_not": torch.bitwise_not, "clone": torch.clone}.items()},
    "where": lambda xs, a: torch.where(xs[0], _number(xs[1]), _number(xs[2])),
    "gelu": lambda xs, a: F.gelu(xs[0], approximate=a["approximate"]),
    "triu": lambda xs, a: xs[0].triu(a["diagonal"]),
    "tril": lambda xs, a: xs[0].tril(a["diagonal"]),
    "view": lambda xs, a: xs[0].reshape(a["shape"]),
    "permute": lambda xs, a: xs[0].permute(a["dims"]),
    "transpose": lambda xs, a: xs[0].transpose(a["dim0"], a["dim1"]),
    "expand": lambda xs, a: xs[0].expand(a["shape"]),
    "unsqueeze": lambda xs, a: xs[0].unsqueeze(a["dim"]),
    "to_dtype": lambda xs, a: xs[0].to(_dtype(a["dtype"])),
    "slice": lambda xs, a: _slice(xs[0], a["dim"], a["start"], a["end"], a["step"]),
    "select": lambda xs, a: xs[0].select(a["dim"], a["index"]),
    "cat": lambda xs, a: torch.cat(xs, a["dim"]),
    "getitem": lambda xs, a: xs[0][a["index"]],
    "embedding": lambda xs, a: F.embedding(xs[1], xs[0]),
    "index_select": lambda xs, a: xs[0].index_select(a["dim"], xs[1]),
    "gather": lambda xs, a: xs[0].gather(a["dim"], xs[1]),
    "index": lambda xs, a: _index(xs, a["positions"]),
    "sum": _reduce(torch.sum), "mean": _reduce(torch.mean), "amax": _reduce(torch.amax),
    "amin": _reduce(torch.amin), "any": _any,
    "softmax": lambda xs, a: xs[0].softmax(a["dim"]),
    "log_softmax": lambda xs, a: xs[0].log_softmax(a["dim"]),
    "cumsum": lambda xs, a: xs[0].cumsum(a["dim"]),
    "topk_values": lambda xs, a: torch.topk(xs[0], a["k"], a["dim"], a["largest"])[0],
    "topk_indices": lambda xs, a: torch.topk(xs[0], a["k"], a["dim"], a["largest"])[1],
    "argmax": lambda xs, a: xs[0].argmax(a["dim"], keepdim=a["keepdim"]),
    "argmin": lambda xs, a: xs[0].argmin(a["dim"], keepdim=a["keepdim"]),
    "scatter_value": lambda xs, a: xs[0].clone().scatter_(a["dim"], xs[1], a["value"]),
    "expert_mm": lambda xs, a: _expert_mm(xs, a),
    "layer_norm": lambda xs, a: F.layer_norm(xs[0], a["normalized_shape"], xs[1], xs[2],
                                             a["eps"]),
    "rms_norm": lambda xs, a: F.rms_norm(xs[0], xs[0].shape[-1:], xs[1], a["eps"]),
    "scalar": lambda xs, a: _source(a),
    "full": lambda xs, a: torch.full(a["shape"], _number_of(a["value"], a["dtype"]),
                                     dtype=_dtype(a["dtype"])),
    "arange": lambda xs, a: torch.arange(*(_number_of(a[k], a["dtype"])
                                           for k in ("start", "end", "step")),
                                         dtype=_dtype(a["dtype"])),
    "mm": lambda xs, a: (xs[0] @ xs[1]) * a["alpha"],
    "bmm": lambda xs, a: torch.bmm(xs[0], xs[1]) * a["alpha"],
    "matmul": lambda xs, a: (xs[0] @ xs[1]) * a["alpha"],
    "addmm": lambda xs, a: torch.addmm(*xs, beta=a["beta"], alpha=a["alpha"]),
    "linear": lambda xs, a: F.linear(xs[0], xs[1]),
    "linear_bias": lambda xs, a: F.linear(*xs),
    "attention": _attention,
    "sdpa": lambda xs, a: F.scaled_dot_product_attention(
        *xs, is_causal=a["is_causal"], scale=a["scale"], enable_gqa=xs[1].shape[-3] !=
        xs[0].shape[-3]),
    "sdpa_masked": lambda xs, a: F.scaled_dot_product_attention(
        xs[0], xs[1], xs[2], attn_mask=xs[3], scale=a["scale"],
        enable_gqa=xs[1].shape[-3] != xs[0].shape[-3]),
    "swiglu": lambda xs, a: F.silu(xs[0]) * xs[1],
    "rope": _rope,
    "gemm": _gemm,
    "quantize_weight": lambda xs, a: _quantized(xs, a, 0),
    "weight_scales": lambda xs, a: _quantized(xs, a, 1),
}


def run_eager(graph: Graph, inputs: list[torch.Tensor],
              constants: dict[str, torch.Tensor] | None = None) -> list[Any]:
    """The graph's outputs, each op run as torch eager runs what it stands for (`constants`:
    other values for the graph's constants, by name)."""
    constants = {**graph.constants, **(constants or {})}
    values: dict[int, Any] = {}
    live = graph.live_ids()
    for node in graph.nodes:
        if node.id not in live:
            continue
        if node.op == "input":
            values[node.id] = inputs[node.attrs["index"]]
        elif node.op in ("param", "const"):
            values[node.id] = constants[node.attrs["name"]]
        else:
            xs = [values[i] for i in node.inputs]
            if node.op == "fallback":
                values[node.id] = run_fallback(node.attrs, xs)
            elif node.op in OPS:
                values[node.id] = OPS[node.op](xs, node.attrs)
            else:
                raise KeyError(f"eager oracle: no torch meaning written for op {node.op!r}")
    return [values[i] for i in graph.outputs]
