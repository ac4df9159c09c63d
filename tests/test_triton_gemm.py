"""The Triton GEMM kernel (codegen/triton/gemm.py) against the registry's references, in Triton's
interpreter on the CPU: the gemm op's prologues, weight formats, epilogues and activations,
strided and broadcast operands, the matmul ops, and what it declines. (Importing eqsat_llm,
before Triton, chooses the interpreter on a machine without CUDA.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from eqsat_llm.codegen.triton.gemm import plan_gemm, plan_matmul
from eqsat_llm.codegen.triton.launch import Operand
from eqsat_llm.formats.quant_formats import DYNAMIC, quantize
from eqsat_llm.ir import Node, TensorType
from eqsat_llm.ops import GEMM_DEFAULTS

from .eager_oracle import OPS as EAGER
from .triton_device import run_launches


def _operand(i: int, v: Any) -> Operand:
    if not isinstance(v, torch.Tensor):
        return Operand(node=i, shape=(), strides=(), dtype="float32", scalar=v)
    return Operand(node=i, shape=tuple(v.shape), strides=tuple(v.stride()),
                   dtype=str(v.dtype).removeprefix("torch."))


def _plan(planner, op: str, attrs: dict[str, Any], ins: list[Any], out: torch.Tensor):
    """planner's launches for op(ins) into `out` (a view), the node ids their indices."""
    node = Node(len(ins), op, tuple(range(len(ins))), attrs,
                TensorType(tuple(out.shape), str(out.dtype).removeprefix("torch.")))
    return planner(node, _operand(len(ins), out), [_operand(i, v) for i, v in enumerate(ins)])


def _run(planner, op: str, attrs: dict[str, Any], ins: list[Any], out: torch.Tensor
         ) -> torch.Tensor | None:
    """Plan op(ins) into `out` and run the launches: out, or None if declined."""
    launches = _plan(planner, op, attrs, ins, out)
    if launches is None:
        return None
    run_launches(launches, [*ins, out])
    return out


def _check_gemm(attrs: dict[str, Any], x: torch.Tensor, w: Any, w_scale: Any = 0.0,
                norm: Any = 0.0, addend: Any = 0.0, out: torch.Tensor | None = None,
                tol: float = 1e-4, equal_nan: bool = False) -> None:
    attrs = {**GEMM_DEFAULTS, **attrs}
    ins = [x, w, w_scale, norm, addend]
    expected = EAGER["gemm"](ins, attrs)  # torch eager, the format unpacked by the test
    if out is None:
        out = torch.full(expected.shape, float("nan"), dtype=expected.dtype)
    got = _run(plan_gemm, "gemm", attrs, ins, out)
    assert got is not None, "declined"
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol, equal_nan=equal_nan)


def _weight(fmt: str, k: int, cols: int) -> tuple[torch.Tensor, Any]:
    """(w, w_scale) of a random [k, cols] weight stored in format `fmt`."""
    w = torch.randn(k, cols) / k ** 0.5
    if fmt == "float":
        return w, 0.0
    if fmt in ("fp16", "bf16"):
        return w.to(torch.float16 if fmt == "fp16" else torch.bfloat16), 0.0
    return quantize(w, "int8" if fmt == DYNAMIC else fmt)


# (prologue, weight, epilogue, act, M, K, N): every format with both prologues, every
# epilogue with both, each activation a few times; ragged M and N tails
CASES = [
    ("none", "float", "none", "none", 5, 64, 17),
    ("rms_norm", "float", "add", "gelu", 33, 96, 48),
    ("none", "float", "bias", "relu", 5, 64, 48),
    ("rms_norm", "float", "swiglu", "none", 5, 64, 17),
    ("none", "float", "swiglu", "gelu_tanh", 1, 32, 48),
    ("none", "fp16", "add", "none", 5, 64, 17),
    ("rms_norm", "fp16", "none", "silu", 1, 64, 48),
    ("rms_norm", "bf16", "bias", "none", 33, 32, 17),
    ("none", "bf16", "swiglu", "none", 5, 64, 17),
    ("none", "int8", "none", "relu", 33, 64, 17),
    ("rms_norm", "int8", "add", "none", 5, 96, 48),
    ("none", "int8", "swiglu", "silu", 5, 64, 17),
    ("rms_norm", "int8", "bias", "gelu", 1, 64, 17),
    ("none", "fp8_e4m3", "none", "relu", 33, 64, 17),
    ("rms_norm", "fp8_e4m3", "swiglu", "none", 5, 64, 48),
    ("rms_norm", "fp8_e5m2", "add", "silu", 5, 64, 17),
    ("none", "fp8_e4m3_g128", "add", "none", 5, 256, 17),
    ("rms_norm", "fp8_e4m3_g128", "swiglu", "silu", 1, 128, 48),
    ("none", "int4_g32", "add", "silu", 5, 96, 17),
    ("rms_norm", "int4_g32", "swiglu", "none", 33, 64, 48),
    ("rms_norm", "int4_g64", "none", "gelu_tanh", 5, 128, 17),
    ("none", "int4_g64", "bias", "none", 5, 64, 48),
    ("none", "int4_g128", "none", "none", 1, 128, 17),
    ("rms_norm", "int4_g128", "add", "relu", 5, 128, 48),
    ("none", DYNAMIC, "none", "none", 33, 64, 17),
    ("rms_norm", DYNAMIC, "none", "none", 5, 96, 48),
    ("none", DYNAMIC, "swiglu", "none", 5, 64, 17),
    ("rms_norm", DYNAMIC, "add", "gelu", 1, 64, 17),
]


@pytest.mark.parametrize("prologue,fmt,epilogue,act,m,k,n", CASES)
def test_gemm_descriptors(prologue: str, fmt: str, epilogue: str, act: str, m: int, k: int,
                          n: int) -> None:
    torch.manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k)
    w, w_scale = _weight(fmt, k, 2 * n if epilogue == "swiglu" else n)
    norm = 1.0 + 0.1 * torch.randn(k) if prologue == "rms_norm" else 0.0
    addend = {"add": torch.randn(m, n), "bias": torch.randn(n)}.get(epilogue, 0.0)
    # alpha and beta off 1 on a few cases (alpha 1.0 skips the multiply)
    alpha = 0.5 if (m + n) % 2 else 1.0
    beta = -2.0 if epilogue == "bias" and n == 48 else 1.0
    _check_gemm({"n": n, "alpha": alpha, "beta": beta, "eps": 1e-6, "prologue": prologue,
                 "weight": fmt, "epilogue": epilogue, "act": act},
                x, w, w_scale, norm, addend)


def test_gemm_bias_beta_zero_ignores_the_addend() -> None:
    # torch.addmm with beta 0 does not read its input: NaN there does not propagate
    x, w = torch.randn(5, 32), torch.randn(32, 17)
    _check_gemm({"n": 17, "beta": 0.0, "epilogue": "bias"}, x, w,
                addend=torch.full((17,), float("nan")))


def test_gemm_strided_3d_and_broadcast_addend() -> None:
    # x [2, 7, K] a transposed view (two row levels that do not merge), the output a slice
    # of a wider buffer, the addend [7, N] broadcast over the batch and read transposed
    torch.manual_seed(1)
    x = torch.randn(7, 2, 64).transpose(0, 1)
    w = torch.randn(64, 17)
    addend = torch.randn(17, 7).t()
    out = torch.full((2, 7, 20), float("nan"))[..., :17]
    _check_gemm({"n": 17, "epilogue": "add", "prologue": "rms_norm", "eps": 1e-5}, x, w,
                norm=torch.randn(64), addend=addend, out=out)


def test_gemm_three_levels_use_the_batch_axis() -> None:
    # x [3, 4, 5, K] a view whose leading dims do not merge: rows 2 levels, batch 1
    torch.manual_seed(2)
    x = torch.randn(4, 3, 5, 32).transpose(0, 1)
    w, w_scale = quantize(torch.randn(32, 48), "int4_g32")
    addend = torch.randn(4, 1, 48).expand(4, 5, 48)  # zero strides
    attrs = {"n": 48, "weight": "int4_g32", "epilogue": "add", "act": "silu"}
    launches = _plan(plan_gemm, "gemm", {**GEMM_DEFAULTS, **attrs},
                     [x, w, w_scale, 0.0, addend], torch.empty(3, 4, 5, 48))
    assert [launch.grid[1] for launch in launches] == [3]
    _check_gemm(attrs, x, w, w_scale, addend=addend)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_half_activations(dtype: torch.dtype) -> None:
    # x and the output in half precision; the kernel computes in float32, the reference in
    # the dtype, so they agree to the dtype's precision
    torch.manual_seed(3)
    x = torch.randn(5, 64).to(dtype)
    w = (torch.randn(64, 34) / 8).to(dtype)
    _check_gemm({"n": 17, "epilogue": "swiglu", "weight": "fp16" if dtype == torch.float16
                 else "bf16"}, x, w, tol=3e-2)


def test_tiles_are_multiplied_half_where_x_and_w_are_and_tf32_only_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dot_kind: fp16 x fp16 tiles multiplied in fp16 (tensor cores; float32 sums), and so
    bf16 when compiled (the interpreter's bf16 dot is wrong); a float32 weight, a quantized
    or coded one keep float32 tiles; TF32 only with EQSAT_TF32=1. The TF32 kernel runs (the
    interpreter multiplies exactly)."""
    from eqsat_llm.codegen.triton.gemm import (
        DOT_HALF,
        DOT_IEEE,
        DOT_TF32,
        W_FLOAT,
        W_INT8,
        dot_kind,
    )

    assert dot_kind("float16", "float16", W_FLOAT, False) == DOT_HALF
    assert dot_kind("bfloat16", "bfloat16", W_FLOAT, False) == DOT_IEEE  # (interpreted)
    assert dot_kind("float16", "float32", W_FLOAT, False) == DOT_IEEE
    assert dot_kind("float16", "int8", W_INT8, False) == DOT_IEEE
    assert dot_kind("float32", "float32", W_FLOAT, False) == DOT_IEEE
    monkeypatch.setenv("EQSAT_TF32", "1")
    assert dot_kind("float32", "float32", W_FLOAT, False) == DOT_TF32
    assert dot_kind("float32", "float32", W_FLOAT, True) == DOT_IEEE
    x, w = torch.randn(6, 40), torch.randn(40, 24)
    attrs = {**GEMM_DEFAULTS, "n": 24}
    launches = _plan(plan_gemm, "gemm", attrs, [x, w, 0.0, 0.0, 0.0], torch.empty(6, 24))
    assert launches[0].constexprs["DOT"] == DOT_TF32
    _check_gemm({"n": 24}, x, w)


@pytest.mark.parametrize("fmt,epilogue,k", [("float", "add", 40), (DYNAMIC, "swiglu", 96)])
def test_gemm_many_programs(monkeypatch: pytest.MonkeyPatch, fmt: str, epilogue: str,
                            k: int) -> None:
    # GPU-sized tiles: several row and column blocks (grouped two by two), several K steps
    # with a ragged tail, as a compiled kernel runs them
    from eqsat_llm.codegen.triton import gemm

    monkeypatch.setattr(gemm, "gemm_tiles", lambda m, n, k: (16, 16, 32))
    monkeypatch.setattr(gemm, "GROUP_M", 2)
    torch.manual_seed(5)
    x = torch.randn(33, k)
    w, w_scale = _weight(fmt, k, 96 if epilogue == "swiglu" else 48)
    addend = torch.randn(48) if epilogue == "add" else 0.0
    _check_gemm({"n": 48, "prologue": "rms_norm", "eps": 1e-6, "weight": fmt,
                 "epilogue": epilogue, "alpha": 0.75}, x, w, w_scale, torch.randn(k), addend)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # numpy's inf - inf
def test_gemm_dynamic_special_rows() -> None:
    # int8_dynamic's zero row (decodes to zeros) and a row with inf (NaN, as code_rows says)
    x = torch.randn(3, 32)
    x[1] = 0.0
    x[2, 3] = float("inf")
    w, w_scale = quantize(torch.randn(32, 17), "int8")
    _check_gemm({"n": 17, "weight": DYNAMIC}, x, w, w_scale, equal_nan=True)


@pytest.mark.parametrize("fmt", ["sparse24", "bsr16"])
def test_gemm_declines_sparse_formats(fmt: str) -> None:
    x, w = torch.randn(5, 32), torch.randn(16, 17)
    attrs = {**GEMM_DEFAULTS, "n": 17, "weight": fmt}
    assert _run(plan_gemm, "gemm", attrs, [x, w, torch.zeros(16, 17, dtype=torch.int16),
                                           0.0, 0.0], torch.empty(5, 17)) is None


def test_gemm_declines_other_dtypes() -> None:
    x, w = torch.randn(5, 32, dtype=torch.float64), torch.randn(32, 17, dtype=torch.float64)
    attrs = {**GEMM_DEFAULTS, "n": 17}
    assert _run(plan_gemm, "gemm", attrs, [x, w, 0.0, 0.0, 0.0],
                torch.empty(5, 17, dtype=torch.float64)) is None


def test_gemm_declines_five_levels() -> None:
    # leading dims [2, 2, 2, 2, 2] that merge nowhere: more than two row and two batch levels
    x = torch.randn(2, 2, 2, 2, 2, 8).permute(4, 3, 2, 1, 0, 5)
    assert _plan(plan_gemm, "gemm", {**GEMM_DEFAULTS, "n": 16},
                 [x, torch.randn(8, 16), 0.0, 0.0, 0.0], torch.empty(2, 2, 2, 2, 2, 16)) is None


def _permuted(*shape: int) -> torch.Tensor:
    # a [B, H, S, D] view of a [B, S, H, D] tensor, as attention's heads are
    b, h, s, d = shape
    return torch.randn(b, s, h, d).transpose(1, 2)


MATMULS = [
    ("mm", {"alpha": 0.5}, lambda: [torch.randn(33, 64), torch.randn(64, 17)]),
    ("bmm", {"alpha": 1.0}, lambda: [torch.randn(3, 5, 32), torch.randn(3, 32, 17)]),
    ("matmul", {"alpha": 1.0}, lambda: [torch.randn(2, 3, 5, 32), torch.randn(32, 17)]),
    ("matmul", {"alpha": 0.125},
     lambda: [_permuted(2, 3, 5, 32), _permuted(2, 3, 17, 32).transpose(-1, -2)]),
    ("matmul", {"alpha": 1.0}, lambda: [torch.randn(2, 1, 5, 32), torch.randn(3, 32, 17)]),
    ("matmul", {"alpha": 1.0}, lambda: [torch.randn(32), torch.randn(2, 32, 17)]),
    ("matmul", {"alpha": 2.0}, lambda: [torch.randn(5, 32), torch.randn(32)]),
    ("addmm", {"beta": 0.5, "alpha": 2.0},
     lambda: [torch.randn(17), torch.randn(5, 32), torch.randn(17, 32).t()]),
    ("addmm", {"beta": 1.0, "alpha": 1.0},
     lambda: [torch.randn(33, 1), torch.randn(33, 64), torch.randn(64, 48)]),
    ("linear", {}, lambda: [torch.randn(2, 5, 32), torch.randn(17, 32)]),
    ("linear_bias", {}, lambda: [torch.randn(5, 64), torch.randn(48, 64), torch.randn(48)]),
]


@pytest.mark.parametrize("op,attrs,make", MATMULS,
                         ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(MATMULS)])
def test_matmul_ops(op: str, attrs: dict[str, Any], make) -> None:
    torch.manual_seed(4)
    ins = make()
    expected = EAGER[op](ins, attrs)
    out = torch.full(expected.shape, float("nan"))
    got = _run(plan_matmul, op, attrs, ins, out)
    assert got is not None, "declined"
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
