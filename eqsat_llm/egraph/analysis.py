"""Shape and dtype analyses inside the e-graph, computed by one rule per op.

Every op declares a `shape_rule` and a `dtype_rule` kind in the registry; this module turns
each kind into egglog rules, so a node that a rewrite creates gets its shape and dtype just as
an encoded node does, and rewrite rules can test them (`eq(shape(x)).to(s)`).

Shapes are `Vec[i64]`. egglog has no loops, so rank-generic shape functions (broadcasting,
permutation, reduction, sub-vectors) are computed by small step relations that walk a vector
one index at a time and are memoised by their arguments; they cost a few iterations of the
analysis ruleset, which the schedule runs to saturation before each rewrite round.
Broadcasting takes the max of two aligned dims, which is right for every valid broadcast except
against a size-0 dim (LLM graphs have none; encode rejects them).
"""

from __future__ import annotations

from collections.abc import Iterator

from egglog import (
    Expr,
    RewriteOrRule,
    String,
    Vec,
    eq,
    f64,
    function,
    i64,
    relation,
    rule,
    ruleset,
    set_,
    var,
)

from ..formats.quant_formats import FORMATS, format_group, is_nibbles, stored_dtype
from ..formats.sparse_formats import BLOCK
from ..formats.sparse_formats import FORMATS as SPARSE_FORMATS
from ..ops import REGISTRY, OpDef
from .language import ATTR_SORTS, E, Tensor, dtype, input_names, shape

_SORTS = {"i64": i64, "f64": f64, "Vec[i64]": Vec[i64], "String": String}


def op_pattern(opdef: OpDef, prefix: str = "") -> tuple[Expr, dict[str, Expr]]:
    """The op's constructor applied to fresh variables, and the variables by parameter name."""
    args: dict[str, Expr] = {}
    for name in input_names(opdef):
        sort = Vec[Tensor] if opdef.arity is None else Tensor
        args[name] = var(prefix + name, sort)
    for name, kind in opdef.attrs:
        args[name] = var(prefix + name, _SORTS[ATTR_SORTS[kind]])
    return getattr(E, opdef.name)(*args.values()), args


# --- step relations: rank-generic vector functions -----------------------------------------
# broadcast(a, b): walk the output dims i = 0..n-1, n = max(|a|, |b|), right-aligned.
bcast_step = relation("bcast_step", Vec[i64], Vec[i64], i64, Vec[i64])


@function(merge=lambda old, new: old)
def bcast(a: Vec[i64], b: Vec[i64]) -> Vec[i64]:
    """The broadcast of two shapes (set by the step rules)."""


# vec_gather(s, idx): [s[idx[0]], s[idx[1]], ...] (permutation)
gather_step = relation("gather_step", Vec[i64], Vec[i64], i64, Vec[i64])


# (not named `gather`: the serialized e-graph names a node by its function's name, and the
# program view keeps the nodes named as a registry op, such as the op `gather`)
@function(merge=lambda old, new: old)
def vec_gather(s: Vec[i64], idx: Vec[i64]) -> Vec[i64]:
    """Elements of s at the positions idx."""



# reduce(s, dims, keep): s with the dims in `dims` dropped (keep=0) or set to 1 (keep=1)
reduce_step = relation("reduce_step", Vec[i64], Vec[i64], i64, i64, Vec[i64])


@function(merge=lambda old, new: old)
def reduced(s: Vec[i64], dims: Vec[i64], keep: i64) -> Vec[i64]:
    """The shape of a reduction of s over dims."""


# insert(s, d, v): s with v inserted before position d
insert_step = relation("insert_step", Vec[i64], i64, i64, i64, Vec[i64])


@function(merge=lambda old, new: old)
def inserted(s: Vec[i64], d: i64, v: i64) -> Vec[i64]:
    """s with the value v inserted at position d."""


# cat: sum of the sizes along dim of the listed tensors
cat_step = relation("cat_step", Vec[Tensor], i64, i64, i64)


@function(merge=lambda old, new: old)
def cat_size(xs: Vec[Tensor], dim: i64) -> i64:
    """Total size along dim of the tensors xs."""


# iota(n): [0, 1, ..., n-1], to recognise identity permutations and build permutations
iota_step = relation("iota_step", i64, i64, Vec[i64])


@function(merge=lambda old, new: old)
def iota(n: i64) -> Vec[i64]:
    """The identity permutation of rank n."""


is_float_dtype = relation("is_float_dtype", String)
is_half_dtype = relation("is_half_dtype", String)
is_full_float_dtype = relation("is_full_float_dtype", String)  # float32, float64
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
HALF_DTYPES = ("float16", "bfloat16")
WEAK_DTYPES = ("py_float", "py_int", "py_bool")
is_weak_dtype = relation("is_weak_dtype", String)


def dtype_facts() -> list:
    return [is_float_dtype(String(d)) for d in FLOAT_DTYPES] + [
        is_half_dtype(String(d)) for d in HALF_DTYPES] + [
        is_full_float_dtype(String(d)) for d in FLOAT_DTYPES if d not in HALF_DTYPES] + [
        is_weak_dtype(String(d)) for d in WEAK_DTYPES]


@ruleset
def vector_functions(a: Vec[i64], b: Vec[i64], s: Vec[i64], idx: Vec[i64], acc: Vec[i64],
                     i: i64, n: i64, k: i64, d: i64, v: i64, xs: Vec[Tensor], total: i64,
                     dims: Vec[i64]) -> Iterator[RewriteOrRule]:
    # broadcast: output index i reads a at i - (n - |a|) and b at i - (n - |b|), 1 outside.
    n_ab = a.length().max(b.length())
    ia, ib = i - (n_ab - a.length()), i - (n_ab - b.length())
    yield rule(bcast_step(a, b, i, acc), i < n_ab, ia >= 0, ib >= 0).then(
        bcast_step(a, b, i + 1, acc.push(a[ia].max(b[ib]))))
    yield rule(bcast_step(a, b, i, acc), i < n_ab, ia < 0).then(
        bcast_step(a, b, i + 1, acc.push(b[ib])))
    yield rule(bcast_step(a, b, i, acc), i < n_ab, ib < 0).then(
        bcast_step(a, b, i + 1, acc.push(a[ia])))
    yield rule(bcast_step(a, b, i, acc), eq(i).to(n_ab)).then(set_(bcast(a, b)).to(acc))
    # gather
    yield rule(gather_step(s, idx, i, acc), i < idx.length()).then(
        gather_step(s, idx, i + 1, acc.push(s[idx[i]])))
    yield rule(gather_step(s, idx, i, acc), eq(i).to(idx.length())).then(
        set_(vec_gather(s, idx)).to(acc))
    # reduce
    yield rule(reduce_step(s, dims, k, i, acc), i < s.length(), dims.not_contains(i)).then(
        reduce_step(s, dims, k, i + 1, acc.push(s[i])))
    yield rule(reduce_step(s, dims, k, i, acc), i < s.length(), dims.contains(i),
               eq(k).to(i64(1))).then(reduce_step(s, dims, k, i + 1, acc.push(i64(1))))
    yield rule(reduce_step(s, dims, k, i, acc), i < s.length(), dims.contains(i),
               eq(k).to(i64(0))).then(reduce_step(s, dims, k, i + 1, acc))
    yield rule(reduce_step(s, dims, k, i, acc), eq(i).to(s.length())).then(
        set_(reduced(s, dims, k)).to(acc))
    # insert: copy s[0..d), push v, copy s[d..)
    yield rule(insert_step(s, d, v, i, acc), i < d).then(
        insert_step(s, d, v, i + 1, acc.push(s[i])))
    yield rule(insert_step(s, d, v, i, acc), eq(i).to(d)).then(
        insert_step(s, d, v, i + 1, acc.push(v)))
    yield rule(insert_step(s, d, v, i, acc), i > d, i <= s.length()).then(
        insert_step(s, d, v, i + 1, acc.push(s[i - 1])))
    yield rule(insert_step(s, d, v, i, acc), eq(i).to(s.length() + 1)).then(
        set_(inserted(s, d, v)).to(acc))
    # iota
    yield rule(iota_step(n, i, acc), i < n).then(iota_step(n, i + 1, acc.push(i)))
    yield rule(iota_step(n, i, acc), eq(i).to(n)).then(set_(iota(n)).to(acc))
    # cat sizes
    yield rule(cat_step(xs, d, i, total), i < xs.length(), eq(s).to(shape(xs[i]))).then(
        cat_step(xs, d, i + 1, total + s[d]))
    yield rule(cat_step(xs, d, i, total), eq(i).to(xs.length())).then(
        set_(cat_size(xs, d)).to(total))


# --- shape rules, one kind per op --------------------------------------------------------------
def _shape_rules(opdef: OpDef) -> Iterator[RewriteOrRule]:
    y, p = op_pattern(opdef)
    kind = opdef.shape_rule
    s0, s1, s2 = var("s0", Vec[i64]), var("s1", Vec[i64]), var("s2", Vec[i64])
    out = var("out", Vec[i64])
    if kind == "scalar":
        yield rule(eq(var("y", Tensor)).to(y)).then(set_(shape(y)).to(Vec[i64].empty()))
    elif kind == "attr":
        yield rule(eq(var("y", Tensor)).to(y)).then(set_(shape(y)).to(p["shape"]))
    elif kind == "same":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            set_(shape(y)).to(s0))
    elif kind == "broadcast":
        # fold the inputs pairwise: bcast(bcast(s0, s1), s2)
        names = input_names(opdef)
        shapes = [s0, s1, s2][: len(names)]
        facts = [eq(s).to(shape(p[n])) for s, n in zip(shapes, names)]
        acc, fold_facts = shapes[0], []
        for k, s in enumerate(shapes[1:]):
            yield rule(eq(var("y", Tensor)).to(y), *facts, *fold_facts).then(
                bcast_step(acc, s, i64(0), Vec[i64].empty()))
            nxt = var(f"b{k}", Vec[i64])
            fold_facts.append(eq(nxt).to(bcast(acc, s)))
            acc = nxt
        yield rule(eq(var("y", Tensor)).to(y), *facts, *fold_facts).then(
            set_(shape(y)).to(acc))
    elif kind == "permute":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            gather_step(s0, p["dims"], i64(0), Vec[i64].empty()))
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(out).to(vec_gather(s0, p["dims"]))).then(set_(shape(y)).to(out))
    elif kind == "transpose":
        d0, d1 = p["dim0"], p["dim1"]
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            set_(shape(y)).to(s0.set(d0, s0[d1]).set(d1, s0[d0])))
    elif kind == "unsqueeze":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            insert_step(s0, p["dim"], i64(1), i64(0), Vec[i64].empty()))
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(out).to(inserted(s0, p["dim"], i64(1)))).then(set_(shape(y)).to(out))
    elif kind == "reduce":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            reduce_step(s0, p["dims"], p["keepdim"], i64(0), Vec[i64].empty()))
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(out).to(reduced(s0, p["dims"], p["keepdim"]))).then(
            set_(shape(y)).to(out))
    elif kind == "slice":
        size = (p["end"] - p["start"] + p["step"] - 1) / p["step"]
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            set_(shape(y)).to(s0.set(p["dim"], size)))
    elif kind == "select":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            set_(shape(y)).to(s0.remove(p["dim"])))
    elif kind == "cat":
        xs, dim = p["xs"], p["dim"]
        yield rule(eq(var("y", Tensor)).to(y)).then(cat_step(xs, dim, i64(0), i64(0)))
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(xs[0])),
                   eq(var("total", i64)).to(cat_size(xs, dim))).then(
            set_(shape(y)).to(s0.set(dim, var("total", i64))))
    elif kind in ("mm", "bmm", "addmm"):
        a, b = (p["x1"], p["x2"]) if kind == "addmm" else (p["x0"], p["x1"])
        dims = (s0[0], s1[1]) if kind != "bmm" else (s0[0], s0[1], s1[2])
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(a)), eq(s1).to(shape(b))).then(
            set_(shape(y)).to(Vec[i64](*dims)))
    elif kind == "matmul":  # batch dims from the left side: b is 2-D or has a's batch dims
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(s1).to(shape(p["x1"]))).then(
            set_(shape(y)).to(s0.set(s0.length() - 1, s1[s1.length() - 1])))
    elif kind == "linear":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(s1).to(shape(p["x1"]))).then(
            set_(shape(y)).to(s0.set(s0.length() - 1, s1[0])))
    elif kind == "gemm":  # x's rows, n columns (any weight format: w's shape may be packed)
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"]))).then(
            set_(shape(y)).to(s0.set(s0.length() - 1, p["n"])))
    elif kind in ("quant_weight", "quant_scales"):  # quant_formats.quantized_types, per format
        for fmt in FORMATS:
            group = format_group(fmt)
            k, n = s0[0], s0[1]
            if kind == "quant_scales":
                out_shape = Vec[i64](n) if group == 0 else Vec[i64](k / group, n)
            else:
                out_shape = Vec[i64](k / 2, n) if is_nibbles(fmt) else s0
            yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                       eq(p["fmt"]).to(String(fmt))).then(set_(shape(y)).to(out_shape))
    elif kind in ("sparse_values", "sparse_index"):  # sparse_formats.packed_types, per format
        k, n, b = s0[0], s0[1], p["blocks"]
        shapes = {("sparse_values", "sparse24"): Vec[i64](k / 2, n),
                  ("sparse_index", "sparse24"): Vec[i64](k / 4, n),
                  ("sparse_values", "bsr16"): Vec[i64](b, i64(BLOCK), i64(BLOCK)),
                  ("sparse_index", "bsr16"): Vec[i64](n / BLOCK + 1 + b)}
        for fmt in SPARSE_FORMATS:
            yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                       eq(p["fmt"]).to(String(fmt))).then(set_(shape(y)).to(shapes[kind, fmt]))
    elif kind == "embedding":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(s1).to(shape(p["x1"]))).then(set_(shape(y)).to(s1.push(s0[1])))
    elif kind == "sdpa":
        yield rule(eq(var("y", Tensor)).to(y), eq(s0).to(shape(p["x0"])),
                   eq(s2).to(shape(p["x2"]))).then(
            set_(shape(y)).to(s0.set(s0.length() - 1, s2[s2.length() - 1])))
    elif kind != "given":
        raise ValueError(f"op {opdef.name}: unknown shape rule {kind!r}")


def _dtype_rules(opdef: OpDef) -> Iterator[RewriteOrRule]:
    y, p = op_pattern(opdef)
    kind = opdef.dtype_rule
    d0, d1 = var("d0", String), var("d1", String)
    if kind in ("same", "same_float"):
        first = input_names(opdef)[0]
        x0 = p[first][0] if opdef.arity is None else p[first]
        only_float = [is_float_dtype(d0)] if kind == "same_float" else []  # sum(bool) is int64
        yield rule(eq(var("y", Tensor)).to(y), eq(d0).to(dtype(x0)), *only_float).then(
            set_(dtype(y)).to(d0))
    elif kind == "scalar":
        for k in ("float", "int", "bool"):
            yield rule(eq(var("y", Tensor)).to(y), eq(p["kind"]).to(String(k))).then(
                set_(dtype(y)).to(String("py_" + k)))
    elif kind == "bool":
        yield rule(eq(var("y", Tensor)).to(y)).then(set_(dtype(y)).to(String("bool")))
    elif kind == "attr":
        yield rule(eq(var("y", Tensor)).to(y)).then(set_(dtype(y)).to(p["dtype"]))
    elif kind == "quant_scales":
        yield rule(eq(var("y", Tensor)).to(y)).then(set_(dtype(y)).to(String("float32")))
    elif kind == "quant_weight":
        for fmt in FORMATS:
            yield rule(eq(var("y", Tensor)).to(y), eq(p["fmt"]).to(String(fmt))).then(
                set_(dtype(y)).to(String(stored_dtype(fmt))))
    elif kind == "sparse_index":
        for fmt, positions in (("sparse24", "uint8"), ("bsr16", "int32")):
            yield rule(eq(var("y", Tensor)).to(y), eq(p["fmt"]).to(String(fmt))).then(
                set_(dtype(y)).to(String(positions)))
    elif kind in ("promote", "promote12"):
        # Only the promotions LLM graphs need: equal dtypes, or a float tensor with a Python
        # number. Other combinations stay unknown, and rules that test dtypes do not fire.
        # (promote12: where(cond, a, b) promotes its value inputs a and b.)
        x0, x1 = (p["x1"], p["x2"]) if kind == "promote12" else (p["x0"], p["x1"])
        facts = [eq(var("y", Tensor)).to(y), eq(d0).to(dtype(x0)), eq(d1).to(dtype(x1))]
        yield rule(*facts, eq(d0).to(d1)).then(set_(dtype(y)).to(d0))
        yield rule(*facts, is_float_dtype(d0), is_weak_dtype(d1)).then(set_(dtype(y)).to(d0))
        yield rule(*facts, is_weak_dtype(d0), is_float_dtype(d1)).then(set_(dtype(y)).to(d1))
    elif kind != "given":
        raise ValueError(f"op {opdef.name}: unknown dtype rule {kind!r}")


@ruleset
def layout_demands(x: Tensor, p: Vec[i64], q: Vec[i64], s: Vec[i64], d: i64,
                   e: i64) -> Iterator[RewriteOrRule]:
    # Values that the layout rules look up: composed and identity permutations.
    yield rule(E.permute(E.permute(x, p), q)).then(gather_step(p, q, i64(0), Vec[i64].empty()))
    yield rule(E.permute(x, p)).then(iota_step(p.length(), i64(0), Vec[i64].empty()))
    yield rule(E.transpose(x, d, e), eq(s).to(shape(x))).then(
        iota_step(s.length(), i64(0), Vec[i64].empty()))


# --- constness: a value computed from weights and constants only is folded at compile time --
is_const = relation("is_const", Tensor)
consts_from = relation("consts_from", Vec[Tensor], i64)  # xs[i:] are all constant
CONST_SOURCES = ("param", "const", "scalar", "full", "arange")
NEVER_CONST = ("input", "fallback")


def _const_rules(opdef: OpDef) -> Iterator[RewriteOrRule]:
    y, p = op_pattern(opdef)
    if opdef.name in CONST_SOURCES:
        yield rule(y).then(is_const(y))
    elif opdef.name in NEVER_CONST:
        return
    elif opdef.arity is None:
        xs = p["xs"]
        yield rule(y).then(consts_from(xs, xs.length()))  # start the walk over the list
        yield rule(y, consts_from(xs, i64(0))).then(is_const(y))
    elif opdef.arity > 0:
        yield rule(y, *(is_const(p[n]) for n in input_names(opdef))).then(is_const(y))


@ruleset
def const_lists(xs: Vec[Tensor], i: i64) -> Iterator[RewriteOrRule]:
    # walk a tensor list from its end: consts_from(xs, i) holds when xs[i:] are all constant
    yield rule(consts_from(xs, i), i > 0, is_const(xs[i - 1])).then(consts_from(xs, i - 1))


# --- weight identity: an order on constant weights, so that merging parallel matmuls builds
# each concatenation once, in increasing order (fusion.merge_parallel) instead of every
# permutation and repetition. A weight is numbered by its leaf; layout ops keep the number.
@function(merge=lambda old, new: old.min(new))
def lo_id(t: Tensor) -> i64:
    """Smallest leaf number of the weights concatenated in t."""


@function(merge=lambda old, new: old.max(new))
def hi_id(t: Tensor) -> i64:
    """Largest leaf number of the weights concatenated in t."""


# (to_dtype too: a half-precision weight is read through a conversion to float32, formats/half.py)
def _weight_id_rules(opdef: OpDef) -> Iterator[RewriteOrRule]:
    if not _follows_weight(opdef):
        return
    y, p = op_pattern(opdef)
    lo, hi = var("lo", i64), var("hi", i64)
    yield rule(eq(var("y", Tensor)).to(y), eq(lo).to(lo_id(p["x0"])),
               eq(hi).to(hi_id(p["x0"]))).then(set_(lo_id(y)).to(lo), set_(hi_id(y)).to(hi))


def _follows_weight(opdef: OpDef) -> bool:
    """A one-input layout op or a dtype conversion: its value is still the weight's."""
    return (opdef.category == "layout" and opdef.arity == 1) or opdef.name == "to_dtype"


def _cat_weight_id_rules() -> Iterator[RewriteOrRule]:
    # a concatenation of weights is numbered by its parts (lo_id/hi_id merge by min/max), so
    # that the SwiGLU's [wg | wu] is known as a weight like merge-parallel-matmul's
    y, xs, d = var("y", Tensor), var("xs", Vec[Tensor]), var("d", i64)
    lo, hi = var("lo", i64), var("hi", i64)
    for k in range(4):  # (the merged QKV: three weights)
        yield rule(eq(y).to(E.cat(xs, d)), xs.length() > k, eq(lo).to(lo_id(xs[k])),
                   eq(hi).to(hi_id(xs[k]))).then(set_(lo_id(y)).to(lo), set_(hi_id(y)).to(hi))


# --- weight marks: facts about a constant weight's values that hold for its views, its
# widening conversions and its concatenations (the merged QKV, the SwiGLU's [wg | wu]). The
# encoder sets them on leaves; a layout op or a concatenation of marked parts is marked too.
# - quantizable: a weight optimize(quantize=...) may store as integers (every weight leaf, or
#   those optimize(keep_float=...) leaves out); any dtype conversion keeps it.
# - fp16_exact / bf16_exact: every value is exactly a float16 / bfloat16 one (a half-precision
#   leaf, or a float32 one whose values happen to be: a half checkpoint loaded as float32), so
#   storing the weight in that dtype loses nothing; only a conversion that keeps every value
#   (to float32 or float64, or to the same dtype) keeps it.
WIDENING = ("float32", "float64")


def _weight_mark(name: str, conversions: tuple[str, ...] | None):
    """The relation `name` (Tensor) and the rules that spread it; `conversions`: the to_dtype
    targets that keep it (None: all)."""
    mark = relation(name, Tensor)
    mark_from = relation(f"{name}_from", Vec[Tensor], i64)  # xs[i:] all marked
    rules: list[RewriteOrRule] = []
    for opdef in REGISTRY.values():
        y, p = op_pattern(opdef, prefix=f"{name}_")
        if opdef.name == "to_dtype" and conversions is not None:
            rules += [rule(y, mark(p["x0"]), eq(p["dtype"]).to(String(d))).then(mark(y))
                      for d in conversions]
        elif _follows_weight(opdef):
            rules.append(rule(y, mark(p["x0"])).then(mark(y)))
        elif opdef.name == "cat":
            xs = p["xs"]
            rules += [rule(y).then(mark_from(xs, xs.length())),
                      rule(y, mark_from(xs, i64(0))).then(mark(y))]
    xs, i = var(f"{name}_list", Vec[Tensor]), var(f"{name}_i", i64)
    rules.append(rule(mark_from(xs, i), i > 0, mark(xs[i - 1])).then(mark_from(xs, i - 1)))
    return mark, ruleset(*rules, name=f"{name}_marks")


quantizable, quantizable_marks = _weight_mark("quantizable", None)
fp16_exact, fp16_marks = _weight_mark("fp16_exact", ("float16", *WIDENING))
bf16_exact, bf16_marks = _weight_mark("bf16_exact", ("bfloat16", *WIDENING))
HALF_EXACT = {"float16": fp16_exact, "bfloat16": bf16_exact}


# --- sparse weights: the structure optimize(sparsity="auto") found in a constant's values.
# two_four(w, d): every 4 consecutive entries along dim d of the matrix w hold at most 2
# non-zeros; stored_blocks(w): its 16 x 16 blocks with a non-zero entry (both dims multiples
# of 16). The encoder sets them on weight leaves (sparse_formats.structure); they follow
# transposes, dtype conversions and concatenations (the merged QKV, the SwiGLU's [wg | wu]).
two_four = relation("two_four", Tensor, i64)


@function(merge=lambda old, new: old)
def stored_blocks(t: Tensor) -> i64: ...


@ruleset
def sparse_structure(y: Tensor, x: Tensor, a: Tensor, b: Tensor, c: Tensor, d: i64, e: i64,
                     d0: i64, d1: i64, dims: Vec[i64], dt: String, na: i64, nb: i64,
                     nc: i64) -> Iterator[RewriteOrRule]:
    swaps = [(E.transpose(x, d0, d1), [eq(d0 + d1).to(i64(1)), eq(shape(x).length()).to(i64(2))]),
             (E.permute(x, dims), [eq(dims).to(Vec[i64](i64(1), i64(0)))])]
    for swapped, facts in swaps:
        yield rule(eq(y).to(swapped), *facts, two_four(x, d)).then(two_four(y, 1 - d))
        yield rule(eq(y).to(swapped), *facts, eq(nb).to(stored_blocks(x))).then(
            set_(stored_blocks(y)).to(nb))
    yield rule(eq(y).to(E.to_dtype(x, dt)), two_four(x, d)).then(two_four(y, d))
    yield rule(eq(y).to(E.to_dtype(x, dt)), eq(nb).to(stored_blocks(x))).then(
        set_(stored_blocks(y)).to(nb))
    # concatenations of 2 or 3 matrices: 2:4 kept (a part's dims along e are multiples of 4,
    # so no group straddles two parts), blocks summed
    pair, triple = E.cat(Vec[Tensor](a, b), d), E.cat(Vec[Tensor](a, b, c), d)
    yield rule(eq(y).to(pair), two_four(a, e), two_four(b, e)).then(two_four(y, e))
    yield rule(eq(y).to(triple), two_four(a, e), two_four(b, e), two_four(c, e)).then(
        two_four(y, e))
    yield rule(eq(y).to(pair), eq(na).to(stored_blocks(a)), eq(nb).to(stored_blocks(b))).then(
        set_(stored_blocks(y)).to(na + nb))
    yield rule(eq(y).to(triple), eq(na).to(stored_blocks(a)), eq(nb).to(stored_blocks(b)),
               eq(nc).to(stored_blocks(c))).then(set_(stored_blocks(y)).to(na + nb + nc))


# --- keep masks: a constant of 0s and 1s multiplied into scores (OpenAI-GPT's
# `w * b + -1e4 * (1 - b)`, b its causal buffer), whose every row keeps its first key:
# keep_mask(t) holds when t's entries are 0 or 1 and t[..., 0] is 1. The encoder sets it on
# constant leaves (keep_mask_value); it follows slices that keep each row's first entry (any
# slice of a leading dim, a slice of the last dim from 0) and conversions to a float dtype.
keep_mask = relation("keep_mask", Tensor)


@ruleset
def keep_masks(y: Tensor, x: Tensor, d: i64, a: i64, b: i64, st: i64, dt: String
               ) -> Iterator[RewriteOrRule]:
    yield rule(eq(y).to(E.slice(x, d, a, b, st)), keep_mask(x),
               d < shape(x).length() - 1).then(keep_mask(y))
    yield rule(eq(y).to(E.slice(x, d, i64(0), b, st)), keep_mask(x),
               eq(d).to(shape(x).length() - 1), b > 0).then(keep_mask(y))
    yield rule(eq(y).to(E.to_dtype(x, dt)), keep_mask(x), is_float_dtype(dt)).then(keep_mask(y))


def _build_analysis():
    rules: list[RewriteOrRule] = []
    for opdef in REGISTRY.values():
        rules.extend(_shape_rules(opdef))
        rules.extend(_dtype_rules(opdef))
        rules.extend(_const_rules(opdef))
        rules.extend(_weight_id_rules(opdef))
    rules.extend(_cat_weight_id_rules())
    return ruleset(*rules, name="analysis")


# The analysis: run it to saturation before each round of rewrites (see saturate.py).
analysis = (_build_analysis() | vector_functions | layout_demands | const_lists
            | quantizable_marks | fp16_marks | bf16_marks | sparse_structure | keep_masks)
