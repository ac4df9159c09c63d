"""Weight-only quantized GEMMs (codegen/c/quant_gemm.py): the quantizers' formats, and the C
kernel eq_gemm_q (int8, int4 and half-precision weights) against torch on the weight the test
unpacks from the stored data (tests/eager_oracle.py): row counts around the GEMV threshold
and the 14-row tile, column counts around the 32-column panel and the 64-column block, every
epilogue, swiglu, strided operands; built native, portable (no AVX-512), with the other
targets' vector widths (16 floats: AVX-512's tiling through generic vectors; SSE's 4), and with
the dequantized panels for every row count."""

from __future__ import annotations

import ctypes

import pytest
import torch

from eqsat_llm.codegen.c.packed_gemm import PACKED_GEMM_C
from eqsat_llm.codegen.c.prelude import PRELUDE
from eqsat_llm.codegen.c.quant_gemm import QUANT_GEMM_C, QuantPanels
from eqsat_llm.codegen.c.tiles import QUANT_PANEL
from eqsat_llm.errors import GraphError
from eqsat_llm.formats.quant_formats import FORMATS, dequantize, format_group, quantize

from .conftest import build_c, c_build_dir, check_gemm_result, gemm_operands
from .eager_oracle import dequantized

WRAPPER = r"""
void widen(const uint16_t* h, float* f, int64_t n, int fmt) {
    for (int64_t i = 0; i < n; i += EQ_QV) {
        const eq_qf v = eq_qwidenh(h + i, fmt);
        memcpy(f + i, &v, sizeof v);
    }
}
void qgemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, int fmt, int64_t group,
           const void* wq, const float* s, float* c, int64_t ldc, float alpha,
           const float* rowscale, const eq_addend* e, int ne, int act, int swiglu, int parallel) {
    eq_gemm_q(M, N, K, a, lda, fmt, group, wq, s, c, ldc, alpha, rowscale, e, ne, act, swiglu,
              parallel);
}
"""

BUILDS = {
    "native": [],
    "portable": ["-mno-avx512f"],
    # AVX-512's tiling and GEMV threshold, through generic vectors where the CPU lacks it
    "vec16": ["-DEQ_QV=16", "-DEQ_QGEMV_M=8", "-Wno-psabi"],
    "sse": ["-mno-avx"],
    # every row count through the dequantized panels, K in blocks of 64 (128 with
    # fp8_e4m3_g128's groups): K 128 and 256 take 2-4 blocks, int4_g32's K 64 one
    "panels": ["-DEQ_QGEMV_M=0", "-DEQ_KC=64"],
}


def build(flags: list[str], d) -> ctypes.CDLL:
    """The kernel and WRAPPER as a shared object in the folder d, compiled with CFLAGS + flags."""
    dll = build_c(PRELUDE + PACKED_GEMM_C + QUANT_GEMM_C + WRAPPER, flags, d, "q")
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    dll.qgemm.argtypes = [i64, i64, i64, ptr, i64, i32, i64, ptr, ptr, ptr, i64,
                          ctypes.c_float, ptr, ptr, i32, i32, i32, i32]
    dll.qgemm.restype = None
    dll.widen.argtypes = [ptr, ptr, i64, i32]
    dll.widen.restype = None
    return dll


# (sse: in the slow set and `scripts/test-isa sse`, to keep the default run under 15 minutes)
@pytest.fixture(scope="module", params=[pytest.param(b, marks=pytest.mark.slow) if b == "sse"
                                        else b for b in BUILDS])
def lib(request, tmp_path_factory):
    return build(BUILDS[request.param], c_build_dir(request, tmp_path_factory, "quant_gemm"))


HALF = {"fp16": (torch.float16, 16), "bf16": (torch.bfloat16, 17)}  # dtype, eq_gemm_q's fmt
KERNEL_FORMATS = [*FORMATS, *HALF]


def _random_weight(k: int, n: int, fmt: str, gen: torch.Generator):
    """Raw stored integers over their whole range (-8 and -128 included) and scales; half
    formats: the values (some tiny: float16's subnormals) and no scales."""
    if fmt in HALF:
        w = torch.randn(k, n, generator=gen) * 0.05
        w[::7] *= 1e-4
        return w.to(HALF[fmt][0]), None
    group = format_group(fmt)
    if fmt.startswith("fp8"):  # every finite float8 byte (e4m3: 0x7f is NaN; e5m2 from 0x7c)
        wq = torch.randint(0, 124 if fmt == "fp8_e5m2" else 127, (k, n), generator=gen,
                           dtype=torch.uint8)
        wq |= (torch.rand(k, n, generator=gen) < 0.5).to(torch.uint8) << 7
        s = torch.rand(*((k // group,) if group else ()), n, generator=gen) * 0.02 + 0.001
    elif group == 0:
        wq = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8)
        s = torch.rand(n, generator=gen) * 0.02 + 0.001
    else:
        wq = torch.randint(0, 256, (k // 2, n), generator=gen, dtype=torch.uint8)
        # float16 values, as quant_formats makes them (the kernel reads them so)
        s = (torch.rand(k // group, n, generator=gen) * 0.2 + 0.01).half().float()
    return wq, s


def run_case(lib, fmt: str, m: int, n: int, k: int, *, alpha: float = 1.0,
             rowscale: bool = False, addends: tuple[str, ...] = (), act: int = 0,
             swiglu: bool = False, lda_pad: int = 0, ldw_pad: int = 0, parallel: int = 1,
             seed: int = 0) -> None:
    """eq_gemm_q on random operands against torch in float64, to fp32 accumulation's error
    (1e-4 of the sum of the products' magnitudes, per element)."""
    gen = torch.Generator().manual_seed(seed)
    group = 0 if fmt in HALF else format_group(fmt)
    width = (2 if swiglu else 1) * n
    ldw = width + ldw_pad
    wq, s = _random_weight(k, ldw, fmt, gen)
    # the expected weight unpacked by the test from the documented layout (not dequantize)
    w = (wq.float() if s is None else dequantized(fmt, wq, s, k, ldw))[:, :width].double()
    ops = gemm_operands(m, n, k, gen, lda_pad=lda_pad, rowscale=rowscale, addends=addends)
    halves = 2 if swiglu else 1
    pq = QuantPanels("q", 0, wq.shape[0], n, ldw, halves).prepare({"q": wq})
    ps = None if s is None else QuantPanels.of_scales(
        "s", 0, 1 if group == 0 else k // group, n, ldw, halves, fmt).prepare({"s": s})
    code = HALF[fmt][1] if fmt in HALF else \
        {"fp8_e4m3": 9, "fp8_e5m2": 10, "fp8_e4m3_g128": 9}.get(fmt) or (8 if group == 0 else 4)
    lib.qgemm(m, n, k, ops.a_full.data_ptr(), ops.lda, code, group, pq.data_ptr(),
              None if ps is None else ps.data_ptr(), ops.c.data_ptr(), ops.ldc, alpha,
              ops.rowscale.data_ptr() if rowscale else None, ops.addends, ops.count, act,
              int(swiglu), parallel)
    check_gemm_result(lib, ops, w, n, alpha, act, swiglu, (fmt, m, n, k))


ROWS = [1, 2, 3, 4, 5, 8, 13, 14, 15, 40, 130]
COLS = [1, 17, 32, 33, 100]


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_shapes(lib, fmt):
    ks = [128, 256] + ([64] if fmt == "int4_g32" else [])
    for i, m in enumerate(ROWS):
        for j, n in enumerate(COLS):
            k = ks[(i + j) % len(ks)]
            run_case(lib, fmt, m, n, k, alpha=0.5, rowscale=(i + j) % 2 == 1, seed=i * 10 + j)


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_epilogues(lib, fmt):
    k = 128
    for m in [1, 3, 8, 9, 15]:
        for n in [33, 128, 200]:
            for act in range(5):
                run_case(lib, fmt, m, n, k, alpha=1.5, rowscale=act % 2 == 0,
                         addends=("residual", "bias", "rowvec")[: act % 4], act=act,
                         lda_pad=5, ldw_pad=3 * (act % 2), seed=act)
            run_case(lib, fmt, m, n, k, alpha=0.7, rowscale=True, swiglu=True, lda_pad=5)
            run_case(lib, fmt, m, n, k, swiglu=True, ldw_pad=64)


@pytest.mark.parametrize("fmt", [*FORMATS, *(pytest.param(f, marks=pytest.mark.slow)
                                               for f in HALF)])  # (half: shapes, epilogues)
def test_large_and_serial(lib, fmt):
    for m in [1, 4, 8, 9, 20]:
        run_case(lib, fmt, m, 2048, 512, rowscale=True, addends=("residual",), act=2)
    run_case(lib, fmt, 6, 2048 + 64 + 33, 256, swiglu=True, rowscale=True)
    run_case(lib, fmt, 2, 300, 256, parallel=0)
    run_case(lib, fmt, 30, 300, 256, parallel=0, swiglu=True)


def test_a_format_the_build_left_out_flags_an_error(tmp_path):
    """A program defines EQ_QFMT_<code> for its weights' formats and compiles only their GEMV
    tiles (quant_gemm.py: format_library): a call with another format flags an error (the
    runtime raises on it) rather than leaving C unwritten; its own format computes as in the
    full build."""
    lib = build(["-DEQ_QFMT_8"], tmp_path)
    flag = ctypes.c_int.in_dll(lib, "eq_index_error")
    run_case(lib, "int8", 1, 100, 128)  # (checks the flag is clear)
    with pytest.raises(AssertionError):
        run_case(lib, "fp8_e4m3", 1, 100, 128)
    assert flag.value == 1


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip(group):
    w = torch.randn(256, 48) * torch.logspace(-3, 2, 48)  # columns of very different sizes
    wq, s = quantize(w, f"int4_g{group}")
    assert wq.dtype == torch.uint8 and wq.shape == (128, 48)
    assert s.dtype == torch.float32 and s.shape == (256 // group, 48)
    back = dequantize(wq, s, f"int4_g{group}")
    bound = s.repeat_interleave(group, dim=0) / 2
    assert ((w - back).abs() <= bound * (1 + 1e-5)).all()


def test_int8_round_trip_and_range():
    w = torch.randn(200, 40) * torch.logspace(-3, 2, 40)
    wq, s = quantize(w, "int8")
    assert wq.dtype == torch.int8 and wq.shape == (200, 40) and s.shape == (40,)
    assert int(wq.min()) >= -127 and int(wq.max()) <= 127
    assert (wq.abs().amax(dim=0) == 127).all()  # each column's largest entry maps to +-127
    back = dequantize(wq, s, "int8")
    assert ((w - back).abs() <= s / 2 * (1 + 1e-5)).all()


def test_nibble_layout():
    # scale 1: q = w; rows 2 k2 (low nibble) and 2 k2 + 1 (high nibble) of a byte
    col = torch.tensor([(k * 5) % 15 - 7 for k in range(32)], dtype=torch.float32)
    w = torch.stack([col, -col], dim=1)
    wq, s = quantize(w, "int4_g32")
    assert torch.equal(s, torch.ones(1, 2))
    for n in range(2):
        q = (w[:, n] + 8).to(torch.int64)
        expect = q[0::2] + 16 * q[1::2]
        assert wq[:, n].tolist() == expect.tolist()
    assert wq[0, 0] == (-7 + 8) + 16 * (-2 + 8)
    assert torch.equal(dequantize(wq, s, "int4_g32"), w)


def test_zero_column_and_group():
    w = torch.randn(128, 6)
    w[:, 2] = 0
    w[64:, 4] = 0  # one group of 64 (two of 32) in column 4
    q8, s8 = quantize(w, "int8")
    assert s8[2] == 1.0 and torch.equal(dequantize(q8, s8, "int8")[:, 2], torch.zeros(128))
    for group in (32, 64):
        q4, s4 = quantize(w, f"int4_g{group}")
        back = dequantize(q4, s4, f"int4_g{group}")
        assert torch.equal(back[:, 2], torch.zeros(128))
        assert torch.equal(back[64:, 4], torch.zeros(64))
        assert (s4[64 // group:, 4] == 1.0).all()


def test_formats():
    assert [format_group(f) for f in FORMATS] == [0, 0, 0, 128, 32, 64, 128]
    with pytest.raises(GraphError, match="unknown weight format"):
        format_group("int4_g48")
    with pytest.raises(GraphError, match="cannot quantize"):
        quantize(torch.zeros(48, 2), "int4_g32")


def test_quant_panels_layout():
    # a strided view (offset 3, row stride 150) of 100 columns, as one half and as two of 50
    q = torch.randint(-128, 128, (7, 150), dtype=torch.int8)
    view = q.reshape(-1)[3:].as_strided((7, 100), (150, 1))
    one = QuantPanels("q", 3, 7, 100, 150).prepare({"q": q})
    assert one.shape == (2, 7, QUANT_PANEL) and one.dtype == torch.int8
    assert torch.equal(one[0], view[:, :64]) and torch.equal(one[1, :, :36], view[:, 64:])
    assert (one[1, :, 36:] == 0).all()
    two = QuantPanels("q", 3, 7, 50, 150, halves=2).prepare({"q": q})
    assert two.shape == (2, 7, QUANT_PANEL) and QuantPanels("q", 3, 7, 50, 150, 2).panels() == 2
    assert torch.equal(two[0, :, :50], view[:, :50]) and torch.equal(two[1, :, :50], view[:, 50:])
    assert (two[:, :, 50:] == 0).all()


@pytest.mark.parametrize("fmt", list(HALF))
def test_every_half_value_widens_exactly(lib, fmt):
    # all 65536 bit patterns (zeros, subnormals, infinities, NaNs) against torch's conversion,
    # by the build's path: F16C / a shift (native), the portable eq_h2f (sse)
    dtype, code = HALF[fmt]
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    got = torch.empty(65536)
    lib.widen(h.data_ptr(), got.data_ptr(), 65536, code)
    want = h.view(dtype).float()
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32))


def test_half_panels_carry_the_bits():
    w = torch.randn(5, 70).to(torch.bfloat16)
    p = QuantPanels("w", 0, 5, 70, 70).prepare({"w": w})
    assert p.dtype == torch.int16 and p.shape == (2, 5, QUANT_PANEL)
    assert torch.equal(p[0].view(torch.bfloat16), w[:, :64])


def _padded_panels(half: torch.Tensor) -> torch.Tensor:
    rows, n = half.shape
    padded = torch.zeros(rows, -(-n // QUANT_PANEL) * QUANT_PANEL, dtype=half.dtype)
    padded[:, :n] = half
    return padded.reshape(rows, -1, QUANT_PANEL).permute(1, 0, 2).contiguous()


def test_quant_panels_of_a_transposed_swiglu_weight():
    """A half weight's panels read from the transposed nn.Linear weight where it lies (whole
    rows of the matrix: a slice of it, not a flattened row-major copy)."""
    gate_up = torch.randn(2 * 100, 96).to(torch.bfloat16)  # nn.Linear [2N, K]
    w = gate_up.t()  # the GEMM's [K, 2N]
    got = QuantPanels("w", 0, 96, 100, 200, halves=2).prepare({"w": w})
    want = torch.cat([_padded_panels(w[:, :100]), _padded_panels(w[:, 100:])])
    assert torch.equal(got, want.view(torch.int16))
    # a part of the columns, and a view that is not whole rows (the flattened form)
    part = QuantPanels("w", 100, 96, 70, 200).prepare({"w": w})
    assert torch.equal(part, _padded_panels(w[:, 100:170]).view(torch.int16))
    odd = QuantPanels("w", 3, 5, 64, 70).prepare({"w": w})
    flat = w.reshape(-1).as_strided((5, 64), (70, 1), 3)
    assert torch.equal(odd, _padded_panels(flat).view(torch.int16))
