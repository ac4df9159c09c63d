"""The kernels' narrower paths on a wide machine (codegen/c/isa.py): one program of GEMMs on
every weight format (packed float, int8, fp8 e4m3 and e5m2, int4, int8 activations, int4
with activations coded per block, fp16, bf16, 2:4 and block sparse), each at one row and at
130, built without VNNI, with AVX-512 switched off and with x86-64's baseline only, against
torch's reference. `bash scripts/test-isa ISA` runs the
whole C test set under one setting; this keeps the default run checking them in seconds."""

from __future__ import annotations

import platform

import pytest
import torch

from eqsat_llm.codegen import ReferenceRuntime
from eqsat_llm.codegen.c import CRuntime
from eqsat_llm.codegen.c.build import CFLAGS, compiler, compiler_defines
from eqsat_llm.codegen.c.isa import ISA_FLAGS, isa_flags
from eqsat_llm.extraction.machine import machine_key
from eqsat_llm.formats.quant_formats import DYNAMIC, DYNAMIC4, DYNAMIC_STORED, quantize
from eqsat_llm.formats.sparse_formats import pack
from eqsat_llm.ir import Graph
from eqsat_llm.ops.gemm import GEMM_DEFAULTS

from .conftest import assert_outputs_match, const, inp, rand_inputs, scalar

pytestmark = [
    pytest.mark.skipif(compiler() is None, reason="no C compiler (cc / $CC) found"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 flags"),
]

# each setting's flags, and a macro its build must not define (the path it switches off);
# "no-vnni" keeps AVX-512 without its byte dot product (int4_dynamic's vpmaddubsw path);
# "no-avx512" keeps AVX-VNNI where the CPU has it (Sapphire Rapids): the int8 tile's
# 256-bit vpdpbusd path, which the "avx2" setting also turns off
SETTINGS = {"no-vnni": (["-mno-avx512vnni", "-mno-avxvnni"], "__AVX512VNNI__"),
            "no-avx512": (["-mno-avx512f"], "__AVX512F__"),
            "avx2": (ISA_FLAGS["avx2"], "__AVXVNNI__"),
            "portable": (ISA_FLAGS["portable"], "__SSE4_1__")}
K, N = 64, 48


def _weight(g: Graph, fmt: str, gen: torch.Generator) -> dict:
    w = torch.randn(K, N, generator=gen)
    if fmt == "float":
        return {"w": const(g, w)}
    if fmt in ("fp16", "bf16"):
        return {"w": const(g, w.to(getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[fmt])))}
    if fmt in ("sparse24", "bsr16"):
        if fmt == "sparse24":
            w = w * (torch.arange(K) % 4 < 2)[:, None]  # two of each four along K kept
        else:
            w = w * (torch.arange(K) // 16 % 2 == 0)[:, None]  # every other block row
        values, index = pack(w, fmt)
        return {"w": const(g, values), "w_scale": const(g, index)}
    q, s = quantize(w, DYNAMIC_STORED.get(fmt, fmt))
    return {"w": const(g, q), "w_scale": const(g, s)}


def _program() -> Graph:
    """GEMMs on every weight format at 1 row (the GEMV paths) and 130 (tiles, above every
    GEMV threshold), with a bias + activation or an added epilogue."""
    gen = torch.Generator().manual_seed(0)
    g = Graph()
    xs = [inp(g, (m, K)) for m in (1, 130)]  # 130: row tails on every ISA's tile
    bias, zero = const(g, torch.randn(N, generator=gen)), scalar(g, 0.0)
    fmts = ["float", "int8", "fp8_e4m3", "fp8_e5m2", "int4_g32", DYNAMIC, DYNAMIC4, "fp16",
            "bf16", "sparse24", "bsr16"]
    for k, fmt in enumerate(fmts):
        w = _weight(g, fmt, gen)
        for x in xs:
            ep = ({"epilogue": "bias", "act": "gelu"} if k % 2 else {"epilogue": "add"})
            ins = (x, w["w"], w.get("w_scale", zero), zero, bias)  # (sparse: n is not w's)
            g.outputs.append(g.add("gemm", ins, n=N, **{**GEMM_DEFAULTS, "weight": fmt, **ep}))
    return g


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_gemm_formats_on_narrower_isas(setting):
    flags, gone = SETTINGS[setting]
    macros = compiler_defines((*CFLAGS, *flags))
    assert "__x86_64__" in macros and gone not in macros  # (the compiler ran)
    g = _program()
    xs = rand_inputs(g)
    rt = CRuntime(g, flags=[*CFLAGS, *flags], use_blas=False)
    for kernel in ("eq_gemm_packed(", "eq_gemm_q(", "eq_gemm_w8a8(", "eq_gemm_sparse("):
        assert rt.source.count(kernel) > 1, kernel  # called, beside its definition
    assert_outputs_match(ReferenceRuntime(g).run(xs), rt.run(xs), 1e-4)


def test_isa_setting_is_checked():
    assert isa_flags("native") == [] and "-mno-avx512f" in isa_flags("avx2")
    with pytest.raises(ValueError, match="EQSAT_ISA='avx3'"):
        isa_flags("avx3")


def test_a_narrowed_calibration_is_kept_apart(monkeypatch):
    monkeypatch.delenv("EQSAT_ISA", raising=False)
    native = machine_key()
    monkeypatch.setenv("EQSAT_ISA", "avx2")
    assert machine_key() == f"{native}-avx2"
