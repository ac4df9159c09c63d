"""attention(q, k, v, bias, sinks; scale, softcap) = softmax([softcap(q @ k^T * scale) + bias,
sink]) @ [v; 0] (softcap(s) = tanh(s) * softcap where softcap is nonzero: Gemma 2's logit
capping; the sink, a logit per head and query row (GPT-OSS), -inf for none, is a key of value
zero: each row's softmax starts from it; k, v may have fewer heads than q: grouped-query
attention, each KV head read for its group; a row that sees no key is zero, as in sdpa),
flash-style: one pass
over blocks of keys with an online softmax (running max and sum, the accumulator rescaled once
per block), a tile of query rows sharing each key and value row it reads (scores key-major:
no key block transposed), blocks whose bias is -inf for the whole tile skipped (causal
masks). Prefill-sized query blocks take the packed GEMM's micro-kernels instead (or BLAS).

Decode, where the attention streams the KV cache: the key-major tiles replaced a transposed
key block per 64 keys (4096 scalar moves) and accumulators through memory; at 4096 keys
TinyLlama's attention (32 query heads over 4 KV heads) took 2.2x less time with AVX-512 and
1.9x with AVX2, MHA (32 over 32, a row a tile, 7/8 of the score lanes idle) 1.2x: RESULTS,
"Decode attention over a long cache"."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ir import Node
from ...ops import operands_of
from ...ops.attention import kv_group
from .loops import PARALLEL_MIN, broadcast_strides, collapse
from .packed_gemm import PACKED_GEMM
from .static_c import calling
from .values import Ref

BK = 64  # keys per block
QT = 8  # query rows per tile


def _batch_offset(var: str, shape: list[int], strides: list[int]) -> str:
    terms, div = [], 1
    for n, s in reversed(list(zip(shape, strides))):
        if s:
            terms.append(f"(({var} / {div}) % {n}) * {s}" if div > 1 or n != 1 else
                         f"({var} % {n}) * {s}")
        div *= n
    return " + ".join(terms) or "0"


BLAS_MIN_ROWS = 8  # query rows from which per-head GEMMs beat the flash kernel (prefill)
STACK_SCORES = 1 << 16  # floats of scores per block of query rows on a thread's stack (BLAS path)
PACKED_ROWS = 64  # query rows per block of scores in the packed-kernel attention
PACKED_SCRATCH = 1 << 17  # floats of per-thread stack scratch it may use (512 KiB)


def _packed_scratch_floats(sq: int, sk: int, d: int, dv: int) -> int:
    skp, dvp = -(-sk // 32) * 32, -(-dv // 32) * 32
    return skp * d + dvp * sk + min(sq, PACKED_ROWS) * sk


@dataclass(frozen=True)
class RowTerms:
    """What a row of scores gets besides q k^T * scale: logit softcapping (0: none), the bias
    (a C expression at row i, key j) and the sink (a C expression at row `{}`; "": none)."""
    bias_at: str
    softcap: float = 0.0
    sink_at: str = ""

    def capped(self, score: str) -> str:
        """A score after softcapping, as the reference computes it (tanh(s) * cap)."""
        return f"eq_tanhf({score}) * {self.softcap.hex()}f" if self.softcap else score

    def sink(self, row: str) -> str:
        return self.sink_at.format(row)


def _head_pointers(offs: list[str]) -> str:
    """Pointers to one (batch, head)'s q, k, v, out, bias (and sinks), inside a loop over
    `bi`."""
    sinks = f"""
    const float* snp = snp0 + {offs[5]};""" if len(offs) > 5 else ""
    return f"""    const float* qp = qp0 + {offs[1]};
    const float* kp = kp0 + {offs[2]};
    const float* vp = vp0 + {offs[3]};
    float* op = op0 + {offs[0]};
    const float* bp = bp0 ? bp0 + {offs[4]} : bp0;
    (void)bp;{sinks}"""


def _sink_pointer(sinks: Ref) -> str:
    return f"const float* snp0 = {sinks.ptr()};\n" if sinks.space != "scalar" else ""


def emit_attention(node: Node, out: Ref, ins: list[Ref], blas: bool = False,
                   bias_values: torch.Tensor | None = None) -> str | None:
    """bias_values: the bias's values when it is a constant (the packed kernel then skips
    the keys a causal mask hides from a whole block of query rows)."""
    x = operands_of("attention", ins)
    q, k, v, bias, sinks = x.q, x.k, x.v, x.bias, x.sinks
    if any(r.dtype != "float32" for r in (out, q, k, v)) or len(q.shape) < 2:
        return None
    if any(r.space != "scalar" and r.dtype != "float32" for r in (bias, sinks)):
        return None
    sq, d = q.shape[-2:]
    sk, dv = v.shape[-2:]
    if k.shape[-2] != sk:  # (a bias that broadcasts the scores wider than the keys)
        return None
    batch = out.shape[:-2]
    scores = batch + (sq, sk)
    group = kv_group(q.shape, k.shape, v.shape)
    if group is None:
        return None
    kv_batch = batch[:-1] + (batch[-1] // group,) if group > 1 else batch
    bst = [broadcast_strides(batch, r.shape[:-2], r.strides[:-2]) for r in (out, q)]
    bst += [broadcast_strides(kv_batch, r.shape[:-2], r.strides[:-2]) for r in (k, v)]
    if bias.space == "scalar":
        bias_st: tuple[int, ...] = (0,) * len(scores)
        bias_ptr, bias_lit = "0", bias.literal("float")
    else:
        bias_st = broadcast_strides(scores, bias.shape, bias.strides)
        bias_ptr, bias_lit = bias.ptr(), ""
    (b_rs, b_cs), bias_st = bias_st[-2:], bias_st[:-2]
    row_st = [bias_st]  # strides over the batch of what is read per row of scores
    if sinks.space != "scalar":  # a logit per (batch, head, query row): [..., S, 1]
        sink_st = broadcast_strides(scores[:-1] + (1,), sinks.shape, sinks.strides)
        s_rs, sink_st = sink_st[-2], sink_st[:-2]
        row_st.append(sink_st)
        sink_at = f"snp[({{}}) * {s_rs}]"
    else:
        sink_at = "" if sinks.value == float("-inf") else sinks.literal("float")
    if group > 1:  # heads (..., H) as (..., H / g, g): query head i reads KV head i // g
        batch = kv_batch + (group,)
        bst = [st[:-1] + (st[-1] * group, st[-1]) for st in bst[:2]] + \
            [st + (0,) for st in bst[2:]]
        row_st = [st[:-1] + (st[-1] * group, st[-1]) for st in row_st]
    bsh, bss = collapse(batch, bst + row_st)
    nb = 1
    for n in bsh:
        nb *= n
    offs = [_batch_offset("bi", bsh, s) for s in bss]
    q_rs, q_cs = q.strides[-2:]
    k_rs, k_cs = k.strides[-2:]
    v_rs, v_cs = v.strides[-2:]
    o_rs, o_cs = out.strides[-2:]
    masked = bias.space != "scalar" and b_cs != 0
    unit = q_cs == k_cs == v_cs == o_cs == 1
    terms = RowTerms(f"bp[i * {b_rs} + j * {b_cs}]" if not bias_lit else bias_lit,
                     float(node.attrs.get("softcap", 0.0)), sink_at)
    head = _sink_pointer(sinks)
    if sq >= BLAS_MIN_ROWS and unit and _packed_scratch_floats(sq, sk, d, dv) <= PACKED_SCRATCH:
        body = _packed_attention(nb, sq, sk, d, dv, offs, (q_rs, k_rs, v_rs, o_rs), bias_ptr,
                                 terms, float(node.attrs["scale"]), q, k, v, out,
                                 bias_values if masked else None,
                                 (b_rs, b_cs) if masked else (0, 0))
        return calling(head + body, PACKED_GEMM)  # (its panels: eq_panel)
    if blas and sq >= BLAS_MIN_ROWS and unit:
        return head + _blas_attention(nb, sq, sk, d, dv, offs, (q_rs, k_rs, v_rs, o_rs),
                                      bias_ptr, terms, float(node.attrs["scale"]), q, k, v, out,
                                      (b_rs, b_cs) if masked else (0, 0))
    kv_strides = bst + row_st  # out, q, k, v, bias (, sinks); the group's dim last
    return head + _flash_attention(
        FlashShape(kv_batch, group, sq, sk, d, dv), kv_strides, bias_ptr, bias_lit,
        (q_rs, k_rs, v_rs, o_rs, b_rs, b_cs, s_rs if sinks.space != "scalar" else 0), masked,
        (q_cs, k_cs, v_cs, o_cs), terms.softcap, sink_at if sinks.space == "scalar" else None,
        float(node.attrs["scale"]), q, k, v, out)


@dataclass(frozen=True)
class FlashShape:
    """The flash kernel's problem: the KV heads' batch, query heads per KV head, query rows,
    keys, and the head dims of q/k and of v."""
    kv_batch: tuple[int, ...]
    group: int
    sq: int
    sk: int
    d: int
    dv: int


def _flash_attention(shape: FlashShape, strides: list[tuple[int, ...]], bias_ptr: str,
                     bias_lit: str, row_strides: tuple[int, ...], masked: bool,
                     col_strides: tuple[int, ...], softcap: float, sink_lit: str | None,
                     scale: float, q: Ref, k: Ref, v: Ref, out: Ref) -> str:
    """One pass over blocks of keys with an online softmax. A task is one KV head and a tile
    of up to QT query rows drawn from all the query heads of its group (at decode the
    group's heads are the rows), so that each key and value row is read once for the group,
    not once per query head (_key_major_blocks). strides: over the batch of out, q, k, v,
    bias (and sinks), the group's dim last when group > 1 (k's and v's stride 0 there);
    sink_lit: the sink as a literal ("" for none), None when the sinks are a tensor."""
    kv_batch, group, sq, sk, d, dv = (shape.kv_batch, shape.group, shape.sq, shape.sk,
                                      shape.d, shape.dv)
    q_rs, k_rs, v_rs, o_rs, b_rs, b_cs, s_rs = row_strides
    q_cs, k_cs, v_cs, o_cs = col_strides
    if group > 1:  # a query head's offset: its KV head's, plus g steps within the group
        g_st = [st[-1] for st in strides]
        strides = [st[:-1] for st in strides]
    else:
        g_st = [0] * len(strides)
    bsh, bss = collapse(kv_batch, strides)
    nkv = 1
    for n in bsh:
        nkv *= n
    offs = [_batch_offset("bk", bsh, st) for st in bss]
    rows = group * sq  # (g, i) pairs, g-major
    tiles = (rows + QT - 1) // QT
    par = nkv * rows * sk * (d + dv) >= PARALLEL_MIN * 4 and nkv * tiles >= 2
    terms = RowTerms("", softcap)  # (its softcap only: the bias and sinks are read per row)
    row_ptrs = (f"""        qrow[r] = qp0 + {offs[1]} + g * {g_st[1]} + i * {q_rs};
        orow[r] = op0 + {offs[0]} + g * {g_st[0]} + i * {o_rs};
        brow[r] = bp0 ? bp0 + {offs[4]} + g * {g_st[4]} + i * {b_rs} : bp0;""" +
                (f"\n        srow[r] = snp0 + {offs[5]} + g * {g_st[5]} + i * {s_rs};"
                 if sink_lit is None else ""))
    bval = f"brow[r][(j0 + j) * {b_cs}]" if not bias_lit else bias_lit
    skip = ""
    if masked:
        skip = f"""
        int live = 0;  /* (no early exit: it made the scan scalar, 4x the time of a decode
                          seeing 128 keys of a 4096-position cache) */
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < nk; j++)
                live |= brow[r][(j0 + j) * {b_cs}] != -INFINITY;
        if (!live) continue;"""
    sink_start = ("m[r] = srow[r][0]; l[r] = m[r] == -INFINITY ? 0.0f : 1.0f;"
                  if sink_lit is None else
                  f"m[r] = {sink_lit}; l[r] = m[r] == -INFINITY ? 0.0f : 1.0f;" if sink_lit
                  else "m[r] = -INFINITY; l[r] = 0.0f;")
    sinks = f"\n    const float* srow[{QT}];" if sink_lit is None else ""
    return f"""const float* qp0 = {q.ptr()};
const float* kp0 = {k.ptr()};
const float* vp0 = {v.ptr()};
float* op0 = {out.ptr(const=False)};
const float* bp0 = {bias_ptr if bias_ptr != "0" else "(const float*)0"};
#pragma omp parallel for schedule(static, 1) if({int(par)})
for (int64_t task = 0; task < {nkv * tiles}; task++) {{
    const int64_t bk = task / {tiles}, r0 = (task % {tiles}) * {QT};
    const int nr = {rows} - r0 < {QT} ? (int)({rows} - r0) : {QT};
    const float* kp = kp0 + {offs[2]};
    const float* vp = vp0 + {offs[3]};
    const float* qrow[{QT}];
    float* orow[{QT}];
    const float* brow[{QT}];{sinks}
    float m[{QT}], l[{QT}];
    float acc[{QT}][{dv}] __attribute__((aligned(64)));
    float qt[{d}][{QT}] __attribute__((aligned(64)));  /* q, a lane per row (key-major) */
    for (int r = 0; r < nr; r++) {{
        const int64_t g = (r0 + r) / {sq}, i = (r0 + r) % {sq};
        (void)g; (void)i;
{row_ptrs}
        {sink_start}
        for (int c = 0; c < {dv}; c++) acc[r][c] = 0.0f;
        for (int c = 0; c < {d}; c++) qt[c][r] = qrow[r][c * {q_cs}];
    }}
{_key_major_blocks(KeyBlocks(sk, d, dv, k_rs, k_cs, v_rs, v_cs, skip, bval, terms, scale))}
    for (int r = 0; r < nr; r++) {{
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  /* no key visible: 0, as sdpa */
        for (int c = 0; c < {dv}; c++) orow[r][c * {o_cs}] = acc[r][c] * inv;
    }}
}}"""


@dataclass(frozen=True)
class KeyBlocks:
    """What the loop over a task's key blocks reads: the key count and head dims, K's and V's
    row and column strides, the masked-block skip (C statements), the bias at (r, j0 + j)
    (a C expression), the row terms (softcap) and the scale."""
    sk: int
    d: int
    dv: int
    k_rs: int
    k_cs: int
    v_rs: int
    v_cs: int
    skip: str
    bias: str
    terms: RowTerms
    scale: float


def _key_major_blocks(b: KeyBlocks) -> str:
    """Per block of BK keys, scores key-major: S[j][r] for the tile's QT rows at once, each
    key's row of K read in place (8 keys at a time, each a register chain of QT-lane FMAs
    over the head dim), so no key block is transposed; the online softmax runs across the
    rows' lanes. Padded rows (r >= nr) have zero queries and row 0's bias; nothing of theirs
    is stored. (A tile of one row, MHA decode, leaves 7 of 8 score lanes idle and still beat
    the transposed block: the stream of K and V bounds it, not the FMAs.)"""
    keys = range(8)
    k_rows = "\n".join(f"            const float* k{u} = kp + (j0 + (j + {u} < nk ? j + {u} : "
                        f"nk - 1)) * {b.k_rs};" for u in keys)
    fmas = " ".join(f"a{u} += k{u}[c * {b.k_cs}] * qc;" for u in keys)
    stores = " ".join(f"memcpy(s[j + {u}], &a{u}, sizeof a{u});" for u in keys)
    return f"""    typedef float eq_rows __attribute__((vector_size({4 * QT})));
    for (int r = nr; r < {QT}; r++) {{
        brow[r] = brow[0]; m[r] = -INFINITY; l[r] = 0.0f;
        for (int c = 0; c < {b.d}; c++) qt[c][r] = 0.0f;
    }}
    float s[{BK}][{QT}] __attribute__((aligned(64)));  /* (rows past nk: unread) */
    for (int64_t j0 = 0; j0 < {b.sk}; j0 += {BK}) {{
        const int nk = {b.sk} - j0 < {BK} ? (int)({b.sk} - j0) : {BK};{b.skip}
        for (int j = 0; j < nk; j += 8) {{
{k_rows}
{_prefetch_rows(b)}
            eq_rows {", ".join(f"a{u} = {{0}}" for u in keys)};
            for (int c = 0; c < {b.d}; c++) {{
                eq_rows qc;
                memcpy(&qc, qt[c], sizeof qc);
                {fmas}
            }}
            {stores}
        }}
        float bm[{QT}], base[{QT}], corr[{QT}], ls[{QT}];
        for (int r = 0; r < {QT}; r++) {{ bm[r] = -INFINITY; ls[r] = 0.0f; }}
        for (int j = 0; j < nk; j++)
            for (int r = 0; r < {QT}; r++) {{
                s[j][r] = {b.terms.capped(f"s[j][r] * {b.scale.hex()}f")} + {b.bias};
                bm[r] = s[j][r] > bm[r] ? s[j][r] : bm[r];
            }}
        /* base: the new running max, 0 while a row has seen no key (its scores -inf: each
           p 0 and corr 0, no inf - inf) */
#pragma omp simd
        for (int r = 0; r < {QT}; r++) {{
            const float mn = m[r] > bm[r] ? m[r] : bm[r];
            base[r] = mn == -INFINITY ? 0.0f : mn;
            corr[r] = eq_expf(m[r] - base[r]);
            m[r] = mn;
        }}
        for (int j = 0; j < nk; j++)
#pragma omp simd
            for (int r = 0; r < {QT}; r++) {{
                s[j][r] = eq_expf(s[j][r] - base[r]);
                ls[r] += s[j][r];
            }}
        for (int r = 0; r < {QT}; r++) l[r] = l[r] * corr[r] + ls[r];
{_weighted_values(b)}
    }}"""


PREFETCH_KEYS = 32  # the K rows this many keys ahead are prefetched as 8 keys' scores start


def _prefetch_rows(b: KeyBlocks) -> str:
    """Prefetches of the K rows PREFETCH_KEYS keys ahead and of the V rows of the 8 keys
    whose scores are computed next (read when the block's values are summed): the 8 rows
    read at once are 8 streams, which the hardware prefetchers followed poorly (the scores
    waited on the cache's latency: 8 GB/s a core). Addresses past the cache are harmless to
    a prefetch."""
    k_bytes, v_bytes = 4 * b.d * b.k_cs, 4 * b.dv * b.v_cs
    return f"""            for (int u = 0; u < 8; u++) {{
                const char* kn = (const char*)(kp + (j0 + j + {PREFETCH_KEYS} + u) * {b.k_rs});
                const char* vn = (const char*)(vp + (j0 + j + u) * {b.v_rs});
                for (int o = 0; o < {k_bytes}; o += 64) __builtin_prefetch(kn + o, 0, 1);
                for (int o = 0; o < {v_bytes}; o += 64) __builtin_prefetch(vn + o, 0, 1);
            }}"""


def _weighted_values(b: KeyBlocks) -> str:
    """acc[r] = acc[r] * corr[r] + sum_j s[j][r] V[j] for the tile's rows: the accumulators
    held in registers across the block's keys, in the ISA's own vector width (a wider GNU
    vector is lowered through the stack on AVX2: measured 1.2x slower than the transposed
    blocks there), where V's rows are contiguous and dv a multiple of 16 (up to 256); else
    through memory."""
    if b.v_cs != 1 or b.dv % 16 or b.dv > 256:
        return f"""        for (int r = 0; r < nr; r++) {{
#pragma omp simd
            for (int c = 0; c < {b.dv}; c++) acc[r][c] *= corr[r];
            for (int j = 0; j < nk; j++) {{
                const float p = s[j][r];
                const float* vr = vp + (j0 + j) * {b.v_rs};
#pragma omp simd
                for (int c = 0; c < {b.dv}; c++) acc[r][c] += p * vr[c * {b.v_cs}];
            }}
        }}"""
    return f"""#if defined(__AVX512F__)  /* rows by {WV_ROWS}: each V row loaded once for them */
{_rows_times_v(b, WV_ROWS, 16)}
#elif defined(__AVX__)  /* a row at a time (16 registers: its accumulators and V's vectors) */
{_rows_times_v(b, 1, 8)}
#else
{_rows_times_v(b, 1, 4)}
#endif"""


WV_ROWS = 4  # rows whose accumulators share each V row's loads (AVX-512)


def _rows_times_v(b: KeyBlocks, rows: int, width: int) -> str:
    """The tile's rows `rows` at a time (the last pass fewer, each row's terms behind an
    `if`), their accumulators vectors of `width` floats in registers across the block's
    keys."""
    parts, each, size = range(b.dv // width), range(rows), 4 * width
    names = ", ".join(f"t{r}_{t}" for r in each for t in parts)
    load = "\n".join(f"            if ({r} < n) {{ " + " ".join(
        f"memcpy(&t{r}_{t}, acc[r + {r}] + {width * t}, {size}); t{r}_{t} *= corr[r + {r}];"
        for t in parts) + " } else { " + " ".join(f"t{r}_{t} = (eq_vw){{0}};" for t in parts)
        + " }" for r in each)
    fma = "\n".join(f"                memcpy(&v, vr + {width * t}, {size}); " + " ".join(
        f"t{r}_{t} += s[j][r + {r}] * v;" for r in each) for t in parts)
    store = "\n".join(f"            if ({r} < n) {{ " + " ".join(
        f"memcpy(acc[r + {r}] + {width * t}, &t{r}_{t}, {size});" for t in parts) + " }"
        for r in each)
    return f"""        typedef float eq_vw __attribute__((vector_size({size})));
        for (int r = 0; r < nr; r += {rows}) {{
            const int n = nr - r;
            (void)n;
            eq_vw v, {names};
{load}
            for (int j = 0; j < nk; j++) {{
                const float* vr = vp + (j0 + j) * {b.v_rs};
{fma}
            }}
{store}
        }}"""


def _blas_attention(nb: int, sq: int, sk: int, d: int, dv: int, offs: list[str],
                    row_strides: tuple[int, int, int, int], bias_ptr: str, terms: RowTerms,
                    scale: float, q: Ref, k: Ref, v: Ref, out: Ref,
                    bias_strides: tuple[int, int]) -> str:
    """Per (batch, head) and block of query rows: S = q k^T * scale by BLAS into a block of
    scores on the thread's stack (at most STACK_SCORES floats: nothing static, so programs
    sharing this code may run at once), + bias and a row softmax, then out = S v by BLAS, over
    the keys the block can see (_live_keys: a KV cache's unused tail is skipped).
    Rounding differs from the reference only in where the scale is applied."""
    q_rs, k_rs, v_rs, o_rs = row_strides
    rb = max(1, min(sq, STACK_SCORES // sk))
    return f"""const float* qp0 = {q.ptr()};
const float* kp0 = {k.ptr()};
const float* vp0 = {v.ptr()};
float* op0 = {out.ptr(const=False)};
const float* bp0 = {bias_ptr if bias_ptr != "0" else "(const float*)0"};
#pragma omp parallel for schedule(static, 1) if({int(nb > 1)})
for (int64_t bi = 0; bi < {nb}; bi++) {{
{_head_pointers(offs)}
    float S[{rb * sk}] __attribute__((aligned(64)));
    for (int64_t i0 = 0; i0 < {sq}; i0 += {rb}) {{
        const int rows = {sq} - i0 < {rb} ? (int)({sq} - i0) : {rb};
{_live_keys(bias_ptr, *bias_strides, sk, "rows", "i0")}
        EQ_SGEMM(101, 111, 112, rows, (int)kend, {d}, {scale.hex()}f, qp + i0 * {q_rs}, {q_rs},
                 kp, {k_rs}, 0.0f, S, {sk});
{_softmax_rows(terms, sk, "rows", "i0", "kend")}
        EQ_SGEMM(101, 111, 111, rows, {dv}, (int)kend, 1.0f, S, {sk}, vp, {v_rs}, 0.0f,
                 op + i0 * {o_rs}, {o_rs});
    }}
}}"""


def _live_keys(bias_ptr: str, b_rs: int, b_cs: int, sk: int, rows: str, row0: str) -> str:
    """C statements setting `kend` to one past the last key a run-time bias leaves visible to
    any of `rows` query rows from `row0` (scanned from the end, so a cache's unused tail costs
    one read per key): the keys past it are -inf for every row and are skipped. A fully
    masked block keeps all keys (its rows come out zero, as in the reference)."""
    if bias_ptr == "0" or b_cs == 0:
        return f"        const int64_t kend = {sk};"
    return f"""        int64_t kend = 0;
        for (int64_t r = 0; r < {rows}; r++) {{
            const float* br = bp + ({row0} + r) * {b_rs};
            for (int64_t j = {sk} - 1; j >= kend; j--)
                if (br[j * {b_cs}] != -INFINITY) {{ kend = j + 1; break; }}
        }}
        if (kend == 0) kend = {sk};"""


def _softmax_rows(terms: RowTerms, sk: int, rows: str, row0: str, cols: str | None = None) -> str:
    """Rows of S (row stride sk; the first `cols` columns, default all), softcapped, + bias at
    (row0 + r, j), replaced by their softmax with the row's sink, in place."""
    n = cols or str(sk)
    add_bias = (f"s[j] = {terms.capped('s[j]')} + {terms.bias_at}" if terms.softcap else
                f"s[j] += {terms.bias_at}")
    return f"""        for (int64_t r = 0; r < {rows}; r++) {{
            float* s = S + r * {sk};
            const int64_t i = {row0} + r;
            (void)i;
            float mx = {terms.sink("i") or "-INFINITY"};
#pragma omp simd reduction(max:mx)
            for (int64_t j = 0; j < {n}; j++) {{
                {add_bias};
                mx = s[j] > mx ? s[j] : mx;
            }}
            if (mx == -INFINITY) {{  /* no key visible: a zero row, as sdpa gives */
                for (int64_t j = 0; j < {n}; j++) s[j] = 0.0f;
                continue;
            }}
            float sum = {f"eq_expf({terms.sink('i')} - mx)" if terms.sink_at else "0.0f"};
#pragma omp simd reduction(+:sum)
            for (int64_t j = 0; j < {n}; j++) {{ s[j] = eq_expf(s[j] - mx); sum += s[j]; }}
            const float inv = 1.0f / sum;
#pragma omp simd
            for (int64_t j = 0; j < {n}; j++) s[j] *= inv;
        }}"""


def key_extents(bias: torch.Tensor | None, scores: tuple[int, ...], rb: int) -> list[int] | None:
    """Per block of rb query rows, how many leading keys are not masked for every head: past
    them the constant bias is -inf on all of the block's rows (a causal mask), so their
    probabilities are exactly 0 and the kernel skips them. None when nothing can be skipped
    (or the mask differs between heads). A fully masked block keeps every key (its rows are
    zero, as in the reference)."""
    if bias is None:
        return None
    sq, sk = scores[-2:]
    b = bias.broadcast_to(scores).reshape(-1, sq, sk)
    if not bool((b == b[:1]).all()):
        return None
    live = b[0] != float("-inf")
    ends = []
    for i0 in range(0, sq, rb):
        cols = live[i0:i0 + rb].any(0).nonzero()
        ends.append(int(cols.max()) + 1 if len(cols) else sk)
    return ends if min(ends) < sk else None


def _packed_attention(nb: int, sq: int, sk: int, d: int, dv: int, offs: list[str],
                      row_strides: tuple[int, int, int, int], bias_ptr: str, terms: RowTerms,
                      scale: float, q: Ref, k: Ref, v: Ref, out: Ref,
                      bias: torch.Tensor | None, bias_strides: tuple[int, int]) -> str:
    """Per (batch, head), on the packed GEMM's micro-kernels (packed_gemm.py): k^T and v packed
    into 32-column panels on the stack, then per block of query rows S = q k^T * scale, + bias
    and a row softmax in place, out = S v, over the keys the block can see (key_extents for a
    constant bias, _live_keys at run time otherwise: a KV cache's unused tail is neither packed
    nor multiplied).
    Rounding differs from the reference only in the order of the sums."""
    q_rs, k_rs, v_rs, o_rs = row_strides
    npk, npv = -(-sk // 32), -(-dv // 32)
    rb = min(sq, PACKED_ROWS)
    ends = key_extents(bias, out.shape[:-2] + (sq, sk), rb)
    table = (f"static const int64_t key_end[] = {{{', '.join(map(str, ends))}}};" if ends
             else "")
    run_time = not ends and bias_ptr != "0" and bias_strides[1] != 0
    packed_keys = _live_keys(bias_ptr, *bias_strides, sk, str(sq), "0").replace(
        "kend", "kpack") if run_time else f"        const int64_t kpack = {sk};"
    kend = (f"        const int64_t kend = key_end[i0 / {rb}];" if ends else
            _live_keys(bias_ptr, *bias_strides, sk, "rows", "i0").replace(
                f"kend = {sk};", "kend = kpack;") if run_time else
            f"        const int64_t kend = {sk};")
    par = nb > 1 and nb * sq * sk * (d + dv) >= PARALLEL_MIN * 4
    return f"""const float* qp0 = {q.ptr()};
const float* kp0 = {k.ptr()};
const float* vp0 = {v.ptr()};
float* op0 = {out.ptr(const=False)};
const float* bp0 = {bias_ptr if bias_ptr != "0" else "(const float*)0"};
{table}
#pragma omp parallel for schedule(static, 1) if({int(par)})
for (int64_t bi = 0; bi < {nb}; bi++) {{
{_head_pointers(offs)}
    float kt[{npk * d * 32}] __attribute__((aligned(64)));  /* k^T: key panels of d x 32 */
    float vk[{npv * sk * 32}] __attribute__((aligned(64)));  /* v: column panels of sk x 32 */
    float S[{rb * sk}] __attribute__((aligned(64)));
{packed_keys}
    for (int64_t p = 0; p * 32 < kpack; p++)
        for (int64_t c = 0; c < {d}; c++)
            for (int64_t j = 0; j < 32; j++)
                kt[(p * {d} + c) * 32 + j] =
                    p * 32 + j < kpack ? kp[(p * 32 + j) * {k_rs} + c] : 0.0f;
    for (int64_t p = 0; p < {npv}; p++)
        for (int64_t j = 0; j < kpack; j++)
            for (int64_t c = 0; c < 32; c++)
                vk[(p * {sk} + j) * 32 + c] =
                    p * 32 + c < {dv} ? vp[j * {v_rs} + p * 32 + c] : 0.0f;
    for (int64_t i0 = 0; i0 < {sq}; i0 += {rb}) {{
        const int64_t rows = {sq} - i0 < {rb} ? {sq} - i0 : {rb};
{kend}
        const float* qa = eq_tiled(rows, {d}, qp + i0 * {q_rs}, {q_rs});  /* (tile order) */
        if (!qa) break;  /* (out of memory: flagged) */
        for (int64_t p = 0; p * 32 < kend; p++)
            eq_panel(rows, {d}, qa, kt + p * {d} * 32, S, {sk}, p * 32,
                     (int)(kend - p * 32 < 32 ? kend - p * 32 : 32), {scale.hex()}f, 0, 0, 0, 0,
                     0, 0);
{_softmax_rows(terms, sk, "rows", "i0", "kend")}
        const float* sa = eq_tiled(rows, kend, S, {sk});
        if (!sa) break;
        for (int64_t p = 0; p < {npv}; p++)
            eq_panel(rows, kend, sa, vk + p * {sk} * 32, op + i0 * {o_rs}, {o_rs}, p * 32,
                     (int)({dv} - p * 32 < 32 ? {dv} - p * 32 : 32), 1.0f, 0, 0, 0, 0, 0, 0);
    }}
}}"""
