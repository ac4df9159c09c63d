"""The w8a8 GEMM (codegen/c/w8a8_gemm.py): eq_gemm_w8a8 against two torch references.
- The same math: A quantized per row as the kernel does it (quant_formats.code_rows, bit for bit:
  float32 scale, rint, clamp), the integer product in float64 (exact), scaled; within 1e-5
  of the magnitudes involved (|pre-activation| + |addends|; swiglu |G| |U|), and through
  conftest's check_gemm_result on the dequantized activations (1e-4 of the products'
  magnitudes; nothing written past N, no error flagged).
- The float product on the dequantized weight, float A: within the activation quantization's
  own bound, per element |alpha rowscale[m]| * s_a[m] / 2 * sum_k |W[k, n]| (each code within
  half a step of its value), times the activation's slope (<= 1.13).
Row counts around the register tile (5) and up to 200, column counts around the 16-column
panel, K not a multiple of the 4-row groups, every epilogue, swiglu, strided A and weight
views, serial and parallel, zero and NaN rows, the extreme codes (no saturation). Built
native (AVX2), portable (no AVX2: the scalar sums), and with 8-row tiles and K chunks of 64
(the int64 sum of chunks); the VNNI paths compile only (this machine has none)."""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess

import pytest
import torch

from eqsat_llm.codegen.c.build import CFLAGS, compiler
from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.tiles import W8A8_K_GROUP, W8A8_PANEL
from eqsat_llm.codegen.c.w8a8_gemm import W8A8_GEMM_C, W8A8Panels
from eqsat_llm.formats.quant_formats import code_rows

from .conftest import build_c, c_build_dir, check_gemm_result, gemm_operands

WRAPPER = r"""
void w8gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const int8_t* wq,
            const float* s, const int32_t* colsum, float* c, int64_t ldc, float alpha,
            const float* rowscale, const eq_addend* e, int ne, int act, int swiglu,
            int parallel) {
    eq_gemm_w8a8(M, N, K, a, lda, wq, s, colsum, c, ldc, alpha, rowscale, e, ne, act, swiglu,
                 parallel);
}
"""
SOURCE = PRELUDE + PACKED_GEMM_C + W8A8_GEMM_C + WRAPPER

BUILDS = {
    "native": [],
    "portable": ["-mno-avx2", "-mno-avx512f"],
    "tile8_chunks": ["-DEQ_W8MR=8", "-DEQ_W8KMAX=64"],  # rows 5-8 and the chunked K sum
}


@pytest.fixture(scope="module", params=list(BUILDS))
def lib(request, tmp_path_factory):
    dll = build_c(SOURCE, BUILDS[request.param], c_build_dir(request, tmp_path_factory, "w8a8"),
                  "w8")
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    dll.w8gemm.argtypes = [i64, i64, i64, ptr, i64, ptr, ptr, ptr, ptr, i64, ctypes.c_float,
                           ptr, ptr, i32, i32, i32, i32]
    dll.w8gemm.restype = None
    return dll


def _act(y: torch.Tensor, act: int) -> torch.Tensor:
    f = torch.nn.functional
    return [y, f.relu(y), f.silu(y), f.gelu(y, approximate="tanh"), f.gelu(y)][act]


def run_case(lib, m: int, n: int, k: int, *, alpha: float = 1.0, rowscale: bool = False,
             addends: tuple[str, ...] = (), act: int = 0, swiglu: bool = False,
             lda_pad: int = 0, ldw_pad: int = 0, woff: int = 0, parallel: int = 1,
             seed: int = 0, a_fill=None, wq=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    halves = 2 if swiglu else 1
    width, ldw = halves * n, halves * n + ldw_pad
    if wq is None:  # raw int8 over its whole range, -128 included
        wq = torch.randint(-128, 128, (k, width), generator=gen, dtype=torch.int8)
    sw = torch.rand(width, generator=gen) * 0.02 + 0.001
    store = torch.zeros(woff + k * ldw, dtype=torch.int8)
    store[woff:].view(k, ldw)[:, :width] = wq
    sstore = torch.zeros(woff + ldw)
    sstore[woff:woff + width] = sw
    pq = W8A8Panels("q", woff, k, n, ldw, halves)
    wp = pq.prepare({"q": store})
    cs = dataclasses.replace(pq, part="colsum").prepare({"q": store})
    sp = W8A8Panels("s", woff, 1, n, 0, halves, "scale").prepare({"s": sstore})
    ops = gemm_operands(m, n, k, gen, lda_pad=lda_pad, rowscale=rowscale, addends=addends)
    if a_fill is not None:
        a_fill(ops.a_full)
        ops.a = ops.a_full[:, :k].double()
    lib.w8gemm(m, n, k, ops.a_full.data_ptr(), ops.lda, wp.data_ptr(), sp.data_ptr(),
               cs.data_ptr(), ops.c.data_ptr(), ops.ldc, alpha,
               ops.rowscale.data_ptr() if rowscale else None, ops.addends, ops.count, act,
               int(swiglu), parallel)
    what = (m, n, k, act, swiglu)
    got = ops.c[:, :n].double()
    q, sa, z = (t.double() for t in code_rows(ops.a_full[:, :k]))
    ok = ~sa.isnan()
    w = wq.double() * sw.double()
    f = alpha * (ops.rowscale.double() if rowscale else torch.ones(m, dtype=torch.float64))
    f = f[:, None]
    # the same math in float64 (the integer product exact); a NaN row as a zero one
    s_ok = torch.where(ok, sa, 0.0)[:, None]
    y = f * s_ok * ((q - z[:, None]) @ wq.double()) * sw.double()
    zero = torch.zeros(1, dtype=torch.float64)
    if swiglu:
        g, u = y[:, :n], y[:, n:]
        want, scale = torch.nn.functional.silu(g) * u, g.abs() * u.abs()
    else:
        want = _act(y + sum(ops.tensors, zero), act)
        scale = y.abs() + sum((t.abs() for t in ops.tensors), zero)
    assert got[~ok].isnan().all(), what  # a row with NaN or inf: NaN out
    got[~ok] = want[~ok]
    ops.c[:, :n] = got.float()  # (those rows as check_gemm_result expects them)
    check_gemm_result(lib, dataclasses.replace(ops, a=s_ok * (q - z[:, None])), w, n, alpha,
                      act, swiglu, what)
    err = (got - want).abs() - 1e-5 * scale
    assert err.max().item() <= 1e-12, (*what, err.max().item())
    # against float A times the dequantized weight: each code within half a step s_a / 2
    yf = f * (ops.a @ w)
    bound = f.abs() * s_ok / 2 * (w.abs().sum(0)[None]) * 1.0001
    if swiglu:
        g, u, bg, bu = yf[:, :n], yf[:, n:], bound[:, :n], bound[:, n:]
        want_f = torch.nn.functional.silu(g) * u
        tol = 1.1 * bg * (u.abs() + bu) + (torch.nn.functional.silu(g).abs() + 1.1 * bg) * bu
    else:
        want_f = _act(yf + sum(ops.tensors, zero), act)
        tol = bound * (1.13 if act else 1.0)
    err = ((got - want_f).abs() - tol - 1e-5 * (want_f.abs() + 1))[ok]
    assert err.numel() == 0 or err.max().item() <= 0, (*what, "float", err.max().item())


ROWS = [1, 2, 3, 4, 5, 6, 7, 9, 11, 16, 33, 128, 200]
COLS = [1, 15, 16, 17, 40, 100]
KS = [1, 3, 4, 7, 64, 130, 257]


def test_shapes(lib):
    for i, m in enumerate(ROWS):
        for j, n in enumerate(COLS):
            k = KS[(i + 2 * j) % len(KS)]
            run_case(lib, m, n, k, alpha=0.5, rowscale=(i + j) % 2 == 1, seed=i * 10 + j)


def test_epilogues(lib):
    for m in [1, 6, 13]:
        for n in [17, 48]:
            for act in range(5):
                run_case(lib, m, n, 67, alpha=1.5, rowscale=act % 2 == 0,
                         addends=("residual", "bias", "rowvec")[: act % 4], act=act,
                         lda_pad=5, ldw_pad=3 * (act % 2), woff=7 * (act % 3), seed=act)
            run_case(lib, m, n, 130, alpha=0.7, rowscale=True, swiglu=True, lda_pad=5, woff=3)
            run_case(lib, m, n, 64, swiglu=True, ldw_pad=64)


def test_large_and_serial(lib):
    run_case(lib, 130, 300, 1024, rowscale=True, addends=("residual",), act=2)
    run_case(lib, 37, 2 * W8A8_PANEL + 5, 512, swiglu=True, rowscale=True)
    run_case(lib, 2, 300, 256, parallel=0)
    run_case(lib, 30, 50, 256, parallel=0, swiglu=True)


def test_special_rows(lib):
    """Zero rows (codes 0, scale 0: the output is the addends alone), a row of one sign, a
    NaN row and an inf row (their outputs NaN, the other rows unaffected)."""
    def fill(a):
        a[0] = 0.0
        a[1] = a[1].abs() + 0.1
        a[2] = -a[2].abs()
        a[3, 5] = float("nan")
        a[4, 0] = float("inf")
    run_case(lib, 9, 20, 40, a_fill=fill, addends=("bias",))
    run_case(lib, 6, 20, 40, a_fill=fill, swiglu=True)


def test_extreme_codes_no_saturation(lib):
    """Codes 127 against weights -128 and 127: vpmaddubsw's pair sums reach -32512 and 32258,
    inside int16 (8-bit codes, 255 * 127 * 2, would saturate)."""
    k, n = 260, 40
    wq = torch.full((k, n), -128, dtype=torch.int8)
    wq[:, ::2] = 127
    wq[:, 1::4] = -127

    def fill(a):
        a[:] = 1.0  # all codes 127, zero point 0
        a[1, ::2] = -1.0  # codes 0 and 127, zero point 64
    run_case(lib, 5, n, k, a_fill=fill, wq=wq)


def test_panels_layout():
    q = torch.randint(-128, 128, (7, 150), dtype=torch.int8)
    view = q.reshape(-1)[3:].as_strided((7, 100), (150, 1))
    one = W8A8Panels("q", 3, 7, 100, 150)
    p = one.prepare({"q": q})
    assert p.shape == one.shape() == (7, 2, W8A8_PANEL, W8A8_K_GROUP) and p.dtype == torch.int8
    for pan, g, j, i in [(0, 0, 0, 0), (1, 1, 3, 2), (6, 0, 3, 3), (5, 1, 15, 1)]:
        assert p[pan, g, j, i] == view[W8A8_K_GROUP * g + i, W8A8_PANEL * pan + j]
    assert (p[:, 1, :, 3] == 0).all()  # the K tail (row 7)
    assert (p[6, :, 4:] == 0).all()  # the column tail (100 = 6 * 16 + 4)
    two = W8A8Panels("q", 3, 7, 50, 150, halves=2)
    p2 = two.prepare({"q": q})
    assert two.panels() == 8 and p2[4, 0, 0, 0] == view[0, 50] and (p2[3, :, 2:] == 0).all()
    cs = dataclasses.replace(two, part="colsum").prepare({"q": q})
    assert cs.dtype == torch.int32 and cs.shape == (8, W8A8_PANEL)
    assert cs[4, 1] == view[:, 51].to(torch.int32).sum() and (cs[3, 2:] == 0).all()
    s = torch.rand(150)
    sp = W8A8Panels("s", 3, 1, 50, 0, 2, "scale").prepare({"s": s})
    assert sp.dtype == torch.float32 and sp[4, 1] == s[3 + 51] and (sp[7, 2:] == 0).all()
    with pytest.raises(ValueError, match="not int8"):
        W8A8Panels("s", 0, 1, 50, 0).prepare({"s": s})


@pytest.mark.parametrize("flags", [["-mavxvnni"], ["-mavx512f", "-mavx512vl", "-mavx512vnni"]])
def test_vnni_compiles(flags, tmp_path):
    """The VNNI paths are compile-only here (no VNNI on this machine): they build, and the
    tiles use vpdpbusd."""
    if compiler() is None:
        pytest.skip("no C compiler (cc / $CC) found")
    src = tmp_path / "w8.c"
    src.write_text(SOURCE)
    out = subprocess.run([compiler(), *CFLAGS, *flags, "-S", str(src), "-o", "-"], check=True,
                         capture_output=True, text=True).stdout
    assert "vpdpbusd" in out and "vpmaddubsw" not in out
