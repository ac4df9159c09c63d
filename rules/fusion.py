"""Fusion: recognise the decompositions of norms, SwiGLU and attention as one op each, and
merge matmuls that share their input (Q, K, V; gate and up) into one matmul against
concatenated weights (which constant folding then prepares once).

The fused ops' reference semantics spell out the decomposition they replace (ops/fused.py,
ops/gemm.py), so the recognising rules are exact.
"""

from egglog import String, Vec, eq, f64, i64, rewrite, rule, set_, subsume, union, var

from eqsat_llm.egraph.analysis import (
    hi_id,
    is_const,
    is_float_dtype,
    is_full_float_dtype,
    is_half_dtype,
    lo_id,
)
from eqsat_llm.egraph.language import E, Tensor, dtype, shape
from eqsat_llm.ops import ACTIVATIONS
from eqsat_llm.rulebook import exact, family, guarded, reassociates

NO_SINK = E.scalar(f64(float("-inf")), "float")  # attention's sink logit: none
NO_CAP = f64(0.0)  # attention's softcap: none


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, al: f64, cap: f64 = NO_CAP,
           sinks: Tensor = NO_SINK) -> Tensor:
    """The attention op: softmax([softcap(q k^T * al) + bias, sinks]) [v; 0] (ops/fused.py)."""
    return E.attention(q, k, v, bias, sinks, al, cap)


@family("fusion")
def fusion(x: Tensor, w: Tensor, g: Tensor, u: Tensor, q: Tensor, k: Tensor,
           v: Tensor, bias: Tensor, snk: Tensor, eps: f64, al: f64, cap: f64, k1: String,
           k2: String, d: Vec[i64], sx: Vec[i64], sw: Vec[i64]):
    inv_rms = E.rsqrt(E.add(E.mean(E.pow(x, E.scalar(2.0, k1)), d, i64(1)), E.scalar(eps, k2)))
    last_dim = (eq(sx).to(shape(x)), eq(d).to(Vec[i64](sx.length() - 1)), eq(sw).to(shape(w)),
                eq(sw).to(Vec[i64](sx[sx.length() - 1])))
    norm = E.rms_norm(x, w, eps)
    single = (*last_dim, is_full_float_dtype(dtype(x)))  # (a half x: rms-norm-half)
    yield exact("rms-norm", guarded(E.mul(E.mul(x, inv_rms), w), norm, *single))
    yield exact("rms-norm-weight-first", guarded(E.mul(w, E.mul(x, inv_rms)), norm, *single))
    wide = is_full_float_dtype(dtype(g))  # (a half g: swiglu-half)
    yield exact("swiglu", guarded(E.mul(E.mul(g, E.sigmoid(g)), u), E.swiglu(g, u), wide))
    yield exact("silu-mul", guarded(E.mul(E.silu(g), u), E.swiglu(g, u), wide),
                note="silu(g) = g * sigmoid(g) up to rounding of torch's fused silu")
    scores = E.matmul(q, E.permute(k, Vec[i64](0, 1, 3, 2)), al)
    blind = "where every key is -inf, attention's row is 0 (as sdpa's) and the formula's NaN"
    yield exact("attention",
                rewrite(E.matmul(E.softmax(E.add(scores, bias), i64(3)), v, f64(1.0)))
                .to(attend(q, k, v, bias, al)), note=blind)
    yield exact("attention-no-bias",
                rewrite(E.matmul(E.softmax(scores, i64(3)), v, f64(1.0)))
                .to(attend(q, k, v, E.scalar(0.0, "float"), al)),
                note="s + 0.0 = s; " + blind)
    # a bias in two parts (ALiBi's and the causal mask, either side of the scores): one bias
    b1, b2 = var("b1", Tensor), var("b2", Tensor)
    for name, biased in (("attention-two-biases", E.add(E.add(scores, b1), b2)),
                         ("attention-bias-first", E.add(E.add(b1, scores), b2))):
        yield reassociates(name, rewrite(E.matmul(E.softmax(biased, i64(3)), v, f64(1.0)))
                           .to(attend(q, k, v, E.add(b1, b2), al)),
                           note="(s + b1) + b2 = s + (b1 + b2); " + blind)
    # attention sinks (GPT-OSS): a column of logits joins the softmax and is sliced off after
    # it, its value never read (one column: a sink per head and query row; the slice keeps
    # exactly the keys)
    t, sk, sn, sa = var("t", i64), var("sk", Vec[i64]), var("sn", Vec[i64]), var("sa", Vec[i64])
    xs = var("xs", Vec[Tensor])
    sunk = E.slice(E.softmax(E.cat(xs, i64(3)), i64(3)), i64(3), i64(0), t, i64(1))
    one_sink = (eq(xs.length()).to(i64(2)), eq(snk).to(xs[1]), eq(sn).to(shape(snk)),
                eq(sn[3]).to(i64(1)), eq(sk).to(shape(k)), eq(t).to(sk[2]),
                eq(sa).to(shape(xs[0])), eq(sa[3]).to(t))
    yield exact("attention-sinks",
                guarded(E.matmul(sunk, v, f64(1.0)), attend(q, k, v, bias, al, NO_CAP, snk),
                        eq(xs[0]).to(E.add(scores, bias)), *one_sink), note=blind)
    yield reassociates("attention-sinks-two-biases",
                       guarded(E.matmul(sunk, v, f64(1.0)),
                               attend(q, k, v, E.add(b1, b2), al, NO_CAP, snk),
                               eq(xs[0]).to(E.add(E.add(scores, b1), b2)), *one_sink),
                       note="(s + b1) + b2 = s + (b1 + b2); " + blind)
    capped = E.mul(E.tanh(scores), E.scalar(cap, "float"))  # logit softcapping (Gemma 2)
    yield exact("attention-softcap",
                guarded(E.matmul(E.softmax(E.add(capped, bias), i64(3)), v, f64(1.0)),
                        attend(q, k, v, bias, al, cap), cap > 0.0), note=blind)
    # masked_fill(probs, mask, 0) after a masked_fill(scores, mask, -inf) (CPM-Ant): zeroes
    # the masked keys, 0 already, and a row that sees no key, as the attention op does
    m, dt = var("m", Tensor), var("dt", String)
    mask_bias = E.where(m, E.scalar(f64(float("-inf")), k1), E.full(Vec[i64].empty(), 0.0, dt))

    def zeroed(biased: Tensor) -> Tensor:
        return E.matmul(E.where(m, E.scalar(0.0, k2), E.softmax(biased, i64(3))), v, f64(1.0))
    yield exact("attention-zeroed-probs",
                rewrite(zeroed(E.add(scores, mask_bias))).to(attend(q, k, v, mask_bias, al)),
                note="the mask zeroes probabilities the softmax made 0, and the rows the "
                     "attention op makes 0")
    yield reassociates("attention-zeroed-probs-two-biases",
                       rewrite(zeroed(E.add(E.add(scores, b1), mask_bias)))
                       .to(attend(q, k, v, E.add(b1, mask_bias), al)),
                       note="(s + b1) + b2 = s + (b1 + b2); as attention-zeroed-probs")


@family("fusion")
def half_rms_norm(x: Tensor, w: Tensor, eps: f64, k1: String, k2: String, dt: String,
                  d: Vec[i64], sx: Vec[i64], sw: Vec[i64]):
    # a half model's RMSNorm (LLaMA's): x widened to float32, normalised, rounded back to
    # x's dtype, then times the weight: the rms_norm op's meaning for a half x (ops/fused.py)
    x32 = E.to_dtype(x, String("float32"))
    inv_rms = E.rsqrt(E.add(E.mean(E.pow(x32, E.scalar(2.0, k1)), d, i64(1)),
                            E.scalar(eps, k2)))
    rounded = E.to_dtype(E.mul(x32, inv_rms), dt)
    half = (eq(sx).to(shape(x)), eq(d).to(Vec[i64](sx.length() - 1)), eq(sw).to(shape(w)),
            eq(sw).to(Vec[i64](sx[sx.length() - 1])), eq(dt).to(dtype(x)),
            eq(dt).to(dtype(w)), is_half_dtype(dt))
    norm = E.rms_norm(x, w, eps)
    yield exact("rms-norm-half", guarded(E.mul(w, rounded), norm, *half),
                check_dtype="bfloat16")
    yield exact("rms-norm-half-weight-last", guarded(E.mul(rounded, w), norm, *half),
                note="a product of two half values is the same in either order",
                check_dtype="bfloat16")


@family("fusion")
def half_swiglu(g: Tensor, u: Tensor, dt: String):
    # a half model's SwiGLU as torch decomposes its silu: g widened to float32, g * sigmoid(g)
    # rounded back to g's dtype, times u: the swiglu op's meaning for a half g (ops/fused.py)
    g32 = E.to_dtype(g, String("float32"))
    silu = E.to_dtype(E.mul(g32, E.sigmoid(g32)), dt)
    half = (eq(dt).to(dtype(g)), eq(dt).to(dtype(u)), is_half_dtype(dt))
    yield exact("swiglu-half", guarded(E.mul(silu, u), E.swiglu(g, u), *half),
                check_dtype="bfloat16")


@family("fusion")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, m: Tensor, al: f64,
                   sq: Vec[i64], sk: Vec[i64], dt: String):
    # scaled_dot_product_attention (kept whole by the frontend) as the one attention op: no
    # mask, is_causal (the top-left causal bias, -inf above the diagonal: a constant that
    # folds and lets the kernel skip masked blocks), a boolean mask (True = attend) or an
    # additive float mask. torch's sdpa kernel rounds differently from the formula.
    zero, ninf = E.scalar(0.0, "float"), E.scalar(f64(float("-inf")), "float")
    note = "torch's sdpa kernel sums in another order"
    yield reassociates("sdpa-as-attention",
                       rewrite(E.sdpa(q, k, v, i64(0), al))
                       .to(attend(q, k, v, zero, al)),
                       note=note)
    sizes = (eq(sq).to(shape(q)), eq(sk).to(shape(k)), eq(dt).to(dtype(q)), is_float_dtype(dt))
    lq_lk = Vec[i64](sq[sq.length() - 2], sk[sk.length() - 2])
    causal = E.triu(E.full(lq_lk, f64(float("-inf")), dt), i64(1))
    masked = E.sdpa_masked(q, k, v, m, al)
    yield reassociates("sdpa-causal-as-attention",
                       guarded(E.sdpa(q, k, v, i64(1), al),
                               attend(q, k, v, causal, al), *sizes), note=note)
    # (the additive mask in q's dtype: a half model's scores stay half; to-dtype-noop drops
    # the cast for float32)
    yield reassociates("sdpa-bool-mask-as-attention",
                       guarded(masked,
                               attend(q, k, v, E.to_dtype(E.where(m, zero, ninf), dt), al),
                               eq(dtype(m)).to(String("bool")), eq(dt).to(dtype(q))),
                       note=note)
    yield reassociates("sdpa-float-mask-as-attention",
                       guarded(masked, attend(q, k, v, m, al),
                               is_float_dtype(dtype(m))),
                       note=note)


@family("fusion")
def grouped_query_attention(y: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                            snk: Tensor, al: f64, cap: f64, s1: Vec[i64], s2: Vec[i64],
                            s3: Vec[i64], sk: Vec[i64], sq: Vec[i64]):
    # GQA: each KV head serves a group of n query heads. repeat_kv materialises the repeat
    # (k[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)); attention reads the KV
    # head of each query head instead (head i -> i // n), so the repeat is never made. The
    # repeated form is subsumed: never cheaper, though the cost model prices its views at zero.
    repeat = (eq(sk).to(shape(k)), eq(sk.length()).to(i64(4)), eq(sq).to(shape(q)),
              eq(s1).to(Vec[i64](sk[0], sk[1], i64(1), sk[2], sk[3])),
              eq(s2).to(Vec[i64](sk[0], sk[1], s2[2], sk[2], sk[3])),
              eq(s3).to(Vec[i64](sk[0], sk[1] * s2[2], sk[2], sk[3])), eq(sq[1]).to(s3[1]))
    k_rep = E.view(E.expand(E.view(k, s1), s2), s3)
    v_rep = E.view(E.expand(E.view(v, s1), s2), s3)
    with_k = attend(q, k_rep, v, bias, al, cap, snk)
    with_v = attend(q, k, v_rep, bias, al, cap, snk)
    grouped = attend(q, k, v, bias, al, cap, snk)
    yield exact("attention-gqa-k", rule(eq(y).to(with_k), *repeat)
                .then(union(y).with_(grouped), subsume(with_k)))
    yield exact("attention-gqa-v", rule(eq(y).to(with_v), eq(sk).to(shape(v)), *repeat[1:])
                .then(union(y).with_(grouped), subsume(with_v)))


@family("fusion")
def merge_parallel(x: Tensor, p: Tensor, q: Tensor, wa: Tensor, wb: Tensor, al: f64,
                   sx: Vec[i64], sa: Vec[i64], sb: Vec[i64], la: i64, ha: i64, lb: i64, hb: i64):
    # x @ Wa and x @ Wb -> one x @ [Wa | Wb], each product a slice of it. Constant weights only
    # (their concatenation is folded once at compile time), concatenated in increasing weight
    # order (analysis.lo_id/hi_id) so that each concatenation is built once.
    both = (eq(p).to(E.matmul(x, wa, al)), eq(q).to(E.matmul(x, wb, al)),
            is_const(wa), is_const(wb),
            eq(la).to(lo_id(wa)), eq(ha).to(hi_id(wa)), eq(lb).to(lo_id(wb)), eq(hb).to(hi_id(wb)),
            ha < lb,
            eq(sx).to(shape(x)), eq(sa).to(shape(wa)), eq(sb).to(shape(wb)),
            eq(sa.length()).to(i64(2)), eq(sb.length()).to(i64(2)))
    weights = E.cat(Vec[Tensor](wa, wb), i64(1))
    merged = E.matmul(x, weights, al)
    last = sx.length() - 1
    left = E.slice(merged, last, i64(0), sa[1], i64(1))
    right = E.slice(merged, last, sa[1], sa[1] + sb[1], i64(1))
    yield reassociates("merge-parallel-matmul",
                       rule(*both).then(set_(lo_id(weights)).to(la), set_(hi_id(weights)).to(hb),
                                        union(p).with_(left), union(q).with_(right)),
                       note="a GEMM of another width may block its sums differently")


NONE = E.scalar(0.0, "float")  # a gemm operand its descriptor does not use


def gemm(x, w, n, *, alpha=1.0, beta=1.0, eps=0.0, norm=NONE, addend=NONE, prologue="none",
         epilogue="none", act="none"):
    """The one GEMM op (ops/gemm.py) with a float weight: act(epilogue(alpha * prologue(x) @ w))."""
    return E.gemm(x, w, NONE, norm, addend, n, alpha, beta, eps, String(prologue),
                  String("float"), String(epilogue), String(act))


def stored_weight_rules(fmt: str, stored: Tensor, aux: Tensor, facts: list, x: Tensor,
                        w: Tensor, sw: Vec[i64]) -> tuple:
    """The two rewrites that store a GEMM's weight w in the format `fmt` as (stored, aux) where
    `facts` hold: a plain matmul x @ w, and a float gemm keeping its other operands and
    attributes (variables of their own: no fact reads them)."""
    ws, norm, addend = var("ws", Tensor), var("norm", Tensor), var("addend", Tensor)
    n, al, be, eps = var("n", i64), var("al", f64), var("be", f64), var("eps", f64)
    pro, epi, act = var("pro", String), var("epi", String), var("act", String)
    none = String("none")
    plain = E.gemm(x, stored, aux, NONE, NONE, sw[1], al, 1.0, 0.0, none, String(fmt), none, none)
    fused = E.gemm(x, w, ws, norm, addend, n, al, be, eps, pro, String("float"), epi, act)
    stored_fused = E.gemm(x, stored, aux, norm, addend, n, al, be, eps, pro, String(fmt), epi, act)
    return (guarded(E.matmul(x, w, al), plain, *facts),
            guarded(fused, stored_fused, *facts))


def stored_experts_rule(fmt: str, store, mark, x: Tensor, w: Tensor, sw: Vec[i64],
                        *extra):
    """The rewrite that stores a mixture's experts w [E, K, N] (shape sw) in the format
    `fmt`: a float expert_mm on w, a constant float weight `mark` holds for (and `extra`
    facts), becomes the one on store(M) = (stored, aux), M the experts side by side as one
    [K, E N] weight (ops/experts.experts_matrix). Its other operands and attributes are
    variables of their own."""
    ids, ws, n = var("ids", Tensor), var("ws", Tensor), var("n", i64)
    side = E.view(E.permute(w, Vec[i64](1, 0, 2)), Vec[i64](sw[1], sw[0] * sw[2]))
    stored, aux = store(side)
    facts = [is_const(w), mark(w), eq(sw).to(shape(w)), eq(sw.length()).to(i64(3)),
             is_float_dtype(dtype(w)), *extra]
    return guarded(E.expert_mm(x, w, ws, ids, String("float"), n),
                   E.expert_mm(x, stored, aux, ids, String(fmt), n), *facts)


@family("fusion")
def matmul_epilogue(y: Tensor, m: Tensor, x: Tensor, w: Tensor, r: Tensor, al: f64,
                    s: Vec[i64], dt: String):
    # A residual/bias add after a matmul becomes the GEMM's epilogue (one kernel: the product
    # is never written out and read back). r may only broadcast into the product: the sum's
    # shape must be the product's; dtypes equal (no promotion is folded away).
    same = (eq(m).to(E.matmul(x, w, al)), eq(s).to(shape(y)), eq(s).to(shape(m)),
            eq(dt).to(dtype(m)), eq(dt).to(dtype(r)))
    fused = gemm(x, w, s[s.length() - 1], alpha=al, addend=r, epilogue="add")
    yield exact("matmul-add", guarded(E.add(m, r), fused, *same))
    yield exact("add-matmul", guarded(E.add(r, m), fused, *same),
                note="r + p = p + r: float addition commutes")


@family("fusion")
def norm_matmul(x: Tensor, g: Tensor, w: Tensor, eps: f64, al: f64, sw: Vec[i64]):
    # An RMSNorm feeding a matmul against a 2-D weight (the merged QKV and gate/up projections)
    # is the GEMM's prologue: the normalised rows are never written out and read
    # back; with g and w constant the C backend folds g into w's rows and scales each row.
    two_d = (eq(sw).to(shape(w)), eq(sw.length()).to(i64(2)))
    fused = gemm(x, w, sw[1], alpha=al, eps=eps, norm=g, prologue="rms_norm")
    yield exact("rms-norm-matmul", guarded(E.matmul(E.rms_norm(x, g, eps), w, al), fused, *two_d))


@family("fusion")
def swiglu_epilogue(x: Tensor, wg: Tensor, wu: Tensor, sw: Vec[i64]):
    # The gate and up projections and the SwiGLU that joins them as one GEMM against [wg | wu]:
    # each output tile's two products are combined as they are stored. The merged
    # gate/up matmul's slices are equal to the two products, so this matches after
    # merge-parallel-matmul too (and the concatenation is then the merged weight).
    same_2d = (eq(sw).to(shape(wg)), eq(sw).to(shape(wu)), eq(sw.length()).to(i64(2)))
    both = E.cat(Vec[Tensor](wg, wu), i64(1))
    pair = E.swiglu(E.matmul(x, wg, 1.0), E.matmul(x, wu, 1.0))
    yield exact("matmul-swiglu", guarded(pair, gemm(x, both, sw[1], epilogue="swiglu"), *same_2d),
                note="the gate and up products as column slices of one weight")


@family("fusion")
def activations(x: Tensor, k: String):
    # GPT-2's gelu_new, 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), is one gelu;
    # written the same way in docs/examples/gelu_tanh_rule.py, the rule-authoring guide's example
    cube = E.pow(x, E.scalar(3.0, k))
    inner = E.mul(E.add(x, E.mul(cube, E.scalar(0.044715, "float"))),
                  E.scalar(0.7978845608028654, "float"))
    written_out = E.mul(E.mul(x, E.scalar(0.5, "float")),
                        E.add(E.tanh(inner), E.scalar(1.0, "float")))
    yield reassociates("gelu-tanh", rewrite(written_out).to(E.gelu(x, "tanh")),
                       note="torch's fused kernel rounds differently")


@family("fusion")
def linear_activation(b: Tensor, x: Tensor, w: Tensor, be: f64, al: f64,
                      s: Vec[i64], sw: Vec[i64]):
    # linear + bias + activation as one GEMM: act(addmm(b, x, w)), the bias and the
    # activation applied in the epilogue. addmm is 2-D and the models 3-D, so the activation
    # usually reads the product through a view (GPT-2: addmm -> view -> gelu): an elementwise
    # op commutes with a reshape, so that form fuses too, under the view.
    mm = E.addmm(b, x, w, be, al)
    weight = eq(sw).to(shape(w))
    for act_name, spec in ACTIVATIONS.items():
        name = act_name.replace("_", "-")

        def act(t: Tensor, spec=spec) -> Tensor:  # the activation's op, as the graph has it
            return getattr(E, spec.op)(t, *(v for _, v in spec.attrs))
        fused = gemm(x, w, sw[1], alpha=al, beta=be, addend=b, epilogue="bias", act=act_name)
        yield exact(f"addmm-{name}", guarded(act(mm), fused, weight))
        yield exact(f"addmm-view-{name}", guarded(act(E.view(mm, s)), E.view(fused, s), weight),
                    note="an elementwise op commutes with a reshape")


@family("fusion")
def rotary(x: Tensor, cos: Tensor, sin: Tensor, h: i64, h1: i64, h2: i64, dd: i64,
           sx: Vec[i64], dt: String):
    # The rotary embedding x * cos + rotate_half(x) * sin, rotate_half(x) = cat([-x2, x1])
    # with x1, x2 the two halves of the last dim, is one elementwise kernel. The
    # slices must split the last dim exactly in half (step 1). mul and add commute exactly: the
    # operand orders of the frontends (x * cos + rot * sin) and each single swap are one rule.
    # One dtype throughout (rope's is x's: no promotion is folded away).
    # (h1: the second slice's start, a variable of its own so that the rule checker draws
    # the two slices independently; the conditions make it h)
    lo, hi = E.slice(x, dd, i64(0), h, i64(1)), E.slice(x, dd, h1, h2, i64(1))
    rot = E.cat(Vec[Tensor](E.neg(hi), lo), dd)
    halves = (eq(sx).to(shape(x)), eq(dd).to(sx.length() - 1), eq(h2).to(sx[sx.length() - 1]),
              eq(h1).to(h), eq(h2).to(h + h), i64(0) < h, eq(dt).to(dtype(x)),
              eq(dt).to(dtype(cos)), eq(dt).to(dtype(sin)))
    fused = E.rope(x, cos, sin)
    note = "float multiplication and addition commute exactly"
    yield exact("rope", guarded(E.add(E.mul(x, cos), E.mul(rot, sin)), fused, *halves))
    yield exact("rope-sin-first", guarded(E.add(E.mul(x, cos), E.mul(sin, rot)), fused, *halves),
                note=note)
    yield exact("rope-cos-first", guarded(E.add(E.mul(cos, x), E.mul(rot, sin)), fused, *halves),
                note=note)
    yield exact("rope-rot-first", guarded(E.add(E.mul(rot, sin), E.mul(x, cos)), fused, *halves),
                note=note)
