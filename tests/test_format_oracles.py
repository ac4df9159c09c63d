"""Stored weight formats against an oracle that can fail: each format's compiled program (the C
kernels on the weight the program stores) against torch eager on the weight unpacked by this
test from the stored data, by the format's documented layout (tests/eager_oracle.py
`dequantized`: not the project's dequantize/unpack), at float32's tolerance. The stored data
is checked against the model's own weight too (the scales recomputed from their definition).

Against the float model a quantized program is only within the format's error (int4: half of
the largest output), so a scale or grouping bug could hide there; against its own dequantized
weight it must agree to float32 rounding. The mutation tests show the comparison fails on a
dequantization that is slightly wrong: a column's scales off by 1%, the wrong group size,
nibbles swapped, fp8 weights a step off, activations not coded, 2:4 positions swapped, a block in
the wrong row."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from eqsat_llm import optimize
from eqsat_llm.codegen.c.build import builds_with, compiler

from .eager_oracle import dequantized, run_eager

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found")

K, F_ = 256, 128  # model width (K of gate/up: 8, 4, 2 int4 groups), MLP width (K of down)
RTOL = 1e-4  # of the largest output: float32 accumulation over K, not a format's error


class Mlp(nn.Module):
    """LLaMA's MLP with its residual: two GEMMs, gate/up merged with the SwiGLU epilogue and
    down with the residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(K, F_, bias=False), nn.Linear(K, F_, bias=False)
        self.down = nn.Linear(F_, K, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def _shape_weights(model: Mlp, fmt: str, gen: torch.Generator) -> None:
    """Weights of the structure the format stores exactly: half values, pruned 2:4 along the
    input dim, or half of the 16 x 16 blocks zero."""
    for lin in (model.gate, model.up, model.down):
        w = lin.weight.data
        w.copy_(torch.randn(w.shape, generator=gen) / w.shape[1] ** 0.5)
        if fmt in ("bf16", "fp16"):
            w.copy_(w.to(torch.bfloat16 if fmt == "bf16" else torch.float16).float())
        elif fmt == "sparse24":  # the 2 largest of each 4 along K kept
            groups = w.reshape(w.shape[0], -1, 4)
            keep = groups.abs().argsort(-1)[..., 2:]
            w.copy_(torch.zeros_like(groups).scatter(-1, keep, groups.gather(-1, keep))
                    .reshape(w.shape))
        elif fmt == "bsr16":
            blocks = torch.rand(w.shape[0] // 16, w.shape[1] // 16, generator=gen) < 0.5
            w.mul_(blocks.repeat_interleave(16, 0).repeat_interleave(16, 1))


OPTIONS = {"int8": {"quantize": "int8"}, "fp8_e4m3": {"quantize": "fp8"},
           "fp8_e5m2": {"quantize": "fp8_e5m2"}, "fp8_e4m3_g128": {"quantize": "fp8_e4m3_g128"},
           "int4_g32": {"quantize": "int4"}, "int4_g64": {"quantize": "int4_g64"},
           "int4_g128": {"quantize": "int4_g128"},
           "int8_dynamic": {"quantize": "int8_dynamic"},
           "int4_dynamic": {"quantize": "int4_dynamic"}, "bf16": {}, "fp16": {},
           "sparse24": {"sparsity": "auto"}, "bsr16": {"sparsity": "auto"}}
# (format, rows): decode's GEMV and prefill's panels; int8_dynamic multiplies integers at
# prefill only, int4_dynamic at decode only, 2:4 is taken at decode only (the cost model
# keeps the dense GEMM at prefill)
CASES = [("int8", 1), ("int8", 33), ("fp8_e4m3", 1), ("fp8_e4m3", 33), ("fp8_e5m2", 1),
         ("fp8_e5m2", 33), ("fp8_e4m3_g128", 1), ("fp8_e4m3_g128", 33), ("int4_g32", 1),
         ("int4_g64", 33),
         ("int4_g128", 1), ("int8_dynamic", 33), ("int4_dynamic", 1), ("bf16", 1), ("fp16", 33),
         ("sparse24", 1), ("bsr16", 33)] + \
    ([("int4_dynamic", 33)] if builds_with("__AVX512BW__") else [])  # (its byte GEMM's ISA)
_COMPILED: dict[tuple[str, int], tuple] = {}


def compiled_case(fmt: str, rows: int):
    """(model, x, compiled program, its gemm nodes), built once per case."""
    if (fmt, rows) not in _COMPILED:
        gen = torch.Generator().manual_seed(rows)
        model = Mlp().eval()
        _shape_weights(model, fmt, gen)
        x = torch.randn(1, rows, K, generator=gen)
        compiled = optimize(model, (x,), measure_eager=False, **OPTIONS[fmt])
        gemms = [n for n in compiled.graph.nodes if n.op == "gemm"]
        _COMPILED[fmt, rows] = model, x, compiled, gemms
    return _COMPILED[fmt, rows]


def stored(compiled, node) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gemm's weight operand and its scales / positions, as the program holds them."""
    g = compiled.graph
    w, s = (g.node(i) for i in node.inputs[1:3])
    return g.constants[w.attrs["name"]], (g.constants[s.attrs["name"]] if s.op != "scalar"
                                          else None)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def _model_weight(model: Mlp, node) -> torch.Tensor:
    """The float weight [K, N] a gemm of the Mlp multiplies by."""
    if node.attrs["epilogue"] == "swiglu":
        return torch.cat([model.gate.weight.T, model.up.weight.T], 1)
    return model.down.weight.T


@pytest.mark.parametrize("fmt,rows", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_kernel_matches_torch_on_the_stored_weight(fmt, rows):
    model, x, compiled, gemms = compiled_case(fmt, rows)
    assert compiled.report.backend == "c" and not compiled.report.torch_ops
    assert sorted(n.attrs["weight"] for n in gemms) == [fmt, fmt], compiled.report.weight_formats
    for node in gemms:
        w, s = stored(compiled, node)
        want = _model_weight(model, node).detach()
        k, n = want.shape
        deq = dequantized(fmt, w, s, k, n)
        if fmt in ("bf16", "fp16", "sparse24", "bsr16"):  # stored exactly
            assert torch.equal(deq, want)
        else:  # the scales from their definition, each weight within half a step
            group = 0 if fmt in ("int8", "int8_dynamic", "fp8_e4m3", "fp8_e5m2") else \
                32 if fmt == "int4_dynamic" else int(fmt.rsplit("g", 1)[1])
            top = want.abs().amax(0) if not group else \
                want.reshape(k // group, group, n).abs().amax(1)
            top_value, bits, least = {"fp8_e4m3": (448, 3, -6), "fp8_e5m2": (57344, 2, -14),
                                      "fp8_e4m3_g128": (448, 3, -6)}.get(fmt, (127, 0, 0))
            scale = top / 7 if fmt.startswith("int4") else top / top_value
            torch.testing.assert_close(s, scale.half().float() if fmt.startswith("int4") else
                                       scale, rtol=1e-6, atol=0)  # (int4's: float16 values)
            if fmt.startswith("fp8"):  # a step of 2^-bits of the power of two below |w / s|
                s_rows = s.repeat_interleave(group, 0) if group else s
                ulp = torch.exp2(torch.floor(torch.log2(
                    (want / s_rows).abs().clamp(min=2.0 ** least))) - bits)
                assert ((deq - want).abs() <= ulp * s_rows / 2 * (1 + 1e-5)).all()
                continue
            step = s if not group else s.repeat_interleave(group, 0)
            assert ((deq - want).abs() <= step / 2 * (1 + 1e-5)).all()
    with torch.no_grad():
        got, want = compiled(x), run_eager(compiled.graph, [x])[0]
    if fmt.endswith("_dynamic"):  # a code flips where the C and torch values upstream (silu,
        # the norm) differ in their last bits at a rounding tie: a row, a code's worth
        rows = (got - want).abs().reshape(-1, got.shape[-1]).amax(1) / float(want.abs().max())
        assert int((rows > RTOL).sum()) <= max(1, rows.numel() // 32) and \
            float(rows.max()) <= 2e-3, rows
    else:
        assert relative_error(got, want) <= RTOL


def _mutants(fmt: str, w: torch.Tensor, s: torch.Tensor | None, k: int,
             column: int) -> dict[str, tuple]:
    """Slightly wrong (w, w_scale) of the format, each the kind of bug a kernel could have."""
    out: dict[str, tuple] = {}
    if fmt.startswith(("int", "fp8")):  # the scale(s) of the column that weighs most
        s1 = s.clone()
        s1[..., column] *= 1.01
        out["a column's scale 1% off"] = (w, s1)
    if fmt.startswith("int4"):
        out["nibbles swapped"] = ((w >> 4) | (w << 4), s)
    if (fmt.startswith("int4") or fmt == "fp8_e4m3_g128") and s.shape[0] > 1:
        out["scales one group late"] = (w, torch.roll(s, 1, 0))
    if fmt == "sparse24":  # each group's two positions exchanged
        out["2:4 positions swapped"] = (w, ((s & 3) << 2) | ((s >> 2) & 3))
    if fmt == "bsr16":  # each stored block one block row down
        index = s.clone()
        index[-w.shape[0]:] = (index[-w.shape[0]:] + 1) % (k // 16)
        out["a block in the wrong row"] = (w, index)
    if fmt.startswith("fp8"):  # each weight one step off (its last mantissa bit flipped)
        out["the last mantissa bit flipped"] = (w ^ 1, s)
    if fmt in ("bf16", "fp16"):  # the bits read as the other half dtype
        other = torch.float16 if fmt == "bf16" else torch.bfloat16
        out["read as the other half dtype"] = (w.view(other), s)
    return out


@pytest.mark.parametrize("fmt,rows", [("int8", 33), ("fp8_e4m3", 1), ("fp8_e5m2", 33),
                                      ("fp8_e4m3_g128", 33), ("int4_g32", 1), ("int4_g128", 1),
                                      ("sparse24", 1), ("bsr16", 33), ("bf16", 1)])
def test_the_oracle_fails_on_a_wrong_dequantization(fmt, rows):
    _, x, compiled, gemms = compiled_case(fmt, rows)
    with torch.no_grad():
        got = compiled(x)
    node = next(n for n in gemms if n.attrs["epilogue"] != "swiglu")  # down, residual
    names = [compiled.graph.node(i).attrs.get("name") for i in node.inputs[1:3]]
    w, s = stored(compiled, node)
    column = int((got - x).abs().amax((0, 1)).argmax())  # (got - x: down's product)
    mutants = _mutants(fmt, w, s, compiled.graph.type_of(node.inputs[0]).shape[-1], column)
    assert mutants
    for what, (w1, s1) in mutants.items():
        wrong = run_eager(compiled.graph, [x], {names[0]: w1, **({names[1]: s1} if s1 is not
                                                                  None else {})})[0]
        assert relative_error(got, wrong) > 3 * RTOL, what


@pytest.mark.parametrize("fmt,rows,plain", [("int8_dynamic", 33, "int8"),
                                            ("int4_dynamic", 1, "int4_g32")])
def test_the_oracle_fails_when_dynamic_activations_are_not_coded(fmt, rows, plain):
    _, x, compiled, gemms = compiled_case(fmt, rows)
    with torch.no_grad():
        got = compiled(x)
    for node in gemms:
        node.attrs = {**node.attrs, "weight": plain}  # (the same weight, x as it is)
    try:
        assert relative_error(got, run_eager(compiled.graph, [x])[0]) > 3 * RTOL
    finally:
        for node in gemms:
            node.attrs = {**node.attrs, "weight": fmt}
