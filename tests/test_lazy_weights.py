"""Recipe keys (weights/lazy_weights.py): equal keys exactly when the values are equal, so that a
program takes another's prepared weight by key: nested cats in either order, and the columns
of a merged weight's quantized form (a SwiGLU weight's gate half) as the part's own."""

import pytest
import torch

from eqsat_llm.ops import evaluate
from eqsat_llm.weights.lazy_weights import (
    LazyConstants,
    WeightRef,
    columns_key,
    materialize,
    recipe_key,
    with_recipe,
)

K = 64
WEIGHTS = {name: torch.randn(K, n, generator=torch.Generator().manual_seed(i))
           for i, (name, n) in enumerate({"a": 32, "b": 48, "c": 16}.items())}


def ref(name):
    return WeightRef(name, torch.empty(WEIGHTS[name].shape, device="meta"))


def folded(op, attrs, *args):
    values = [materialize(a, WEIGHTS.__getitem__) for a in args]
    out = evaluate(op, values, attrs)
    return with_recipe(torch.empty(out.shape, dtype=out.dtype, device="meta"), op, attrs,
                       list(args))


def test_nested_cats_along_one_dim_have_one_key():
    a, b, c = ref("a"), ref("b"), ref("c")
    left = folded("cat", {"dim": 1}, folded("cat", {"dim": 1}, a, b), c)
    right = folded("cat", {"dim": -1}, a, folded("cat", {"dim": 1}, b, c))
    assert recipe_key(left) == recipe_key(right)
    assert recipe_key(left) != recipe_key(folded("cat", {"dim": 1}, b, a, c))
    rows, cols = folded("cat", {"dim": 0}, a, a), folded("cat", {"dim": 1}, a, a)
    assert recipe_key(rows) != recipe_key(cols)


@pytest.mark.parametrize("fmt", ["int8", "int4_g32"])
@pytest.mark.parametrize("op", ["quantize_weight", "weight_scales"])
def test_columns_of_a_quantized_merged_weight_are_the_parts_own(fmt, op):
    a, b = ref("a"), ref("b")
    merged = folded(op, {"fmt": fmt}, folded("cat", {"dim": 1}, a, b))
    alone = folded(op, {"fmt": fmt}, b)
    assert columns_key(merged, 32, 48) == recipe_key(alone)
    assert columns_key(merged, 0, 32) == recipe_key(folded(op, {"fmt": fmt}, a))
    assert columns_key(merged, 16, 32) not in (recipe_key(alone), None)  # straddles a and b
    # the claim behind the key: the values agree
    whole = materialize(merged, WEIGHTS.__getitem__)
    assert torch.equal(whole[..., 32:], materialize(alone, WEIGHTS.__getitem__))


def test_a_real_tensor_in_a_recipe_is_never_shared():
    big = torch.randn(K, 32)
    t = folded("add", {}, ref("a"), big)
    assert recipe_key(t) is None
    lazy = LazyConstants({"x": t}, WEIGHTS.__getitem__)
    made = []
    lazy.shared(None, lambda: made.append(1) or big)
    lazy.shared(None, lambda: made.append(1) or big)
    assert made == [1, 1]


def test_a_half_weight_is_quantized_without_widening_it_whole():
    """quantize_weight(permute(to_dtype(w_bf16))) runs on the bf16 weight (quantize widens
    some columns at a time): the same integers and scales as widening it first."""
    from eqsat_llm.weights.lazy_weights import narrowed

    half = {"h": torch.randn(48, K, generator=torch.Generator().manual_seed(5)).bfloat16()}
    h = WeightRef("h", torch.empty(48, K, dtype=torch.bfloat16, device="meta"))

    def fold(op, attrs, *args):
        out = evaluate(op, [materialize(a, half.__getitem__) for a in args], attrs)
        return with_recipe(torch.empty(out.shape, dtype=out.dtype, device="meta"), op, attrs,
                           list(args))

    wide = fold("permute", {"dims": [1, 0]}, fold("to_dtype", {"dtype": "float32"}, h))
    narrow = narrowed(wide)
    assert narrow.dtype == torch.bfloat16 and narrow.shape == wide.shape
    for op in ("quantize_weight", "weight_scales"):
        q = fold(op, {"fmt": "int4_g32"}, wide)
        lazy = LazyConstants({"q": q}, half.__getitem__)
        want = evaluate(op, [materialize(wide, half.__getitem__)], {"fmt": "int4_g32"})
        assert torch.equal(lazy["q"], want)
    assert narrowed(folded("to_dtype", {"dtype": "float32"}, ref("a"))).dtype == torch.float32


@pytest.mark.parametrize("fmt", ["int8", "int4_g32"])
def test_panels_of_a_merged_weight_hold_each_parts_own(fmt):
    """The prepared panels of quantize_weight(cat(p, q, r)) are, row block by row block,
    the panels each part's own quantized weight prepares (panel-aligned parts), and are
    remembered under those parts' keys."""
    from eqsat_llm.codegen.c.quant_gemm import QuantPanels
    from eqsat_llm.codegen.c.tiles import QUANT_PANEL
    from eqsat_llm.codegen.c.values import Layout, spec_key

    widths = {"p": QUANT_PANEL, "q": 2 * QUANT_PANEL, "r": QUANT_PANEL}
    weights = {n: torch.randn(K, w, generator=torch.Generator().manual_seed(i))
               for i, (n, w) in enumerate(widths.items())}
    refs = [WeightRef(n, torch.empty(K, w, device="meta")) for n, w in widths.items()]

    def fold(op, attrs, *args):
        out = evaluate(op, [materialize(a, weights.__getitem__) for a in args], attrs)
        return with_recipe(torch.empty(out.shape, dtype=out.dtype, device="meta"), op, attrs,
                           list(args))

    merged = fold("quantize_weight", {"fmt": fmt}, fold("cat", {"dim": 1}, *refs))
    alone = fold("quantize_weight", {"fmt": fmt}, refs[1])
    lazy = LazyConstants({"m": merged, "q_alone": alone}, weights.__getitem__)
    rows, n = merged.shape[0], merged.shape[1]
    whole = QuantPanels("m", 0, rows, n, n)
    parts = whole.parts(lazy)
    assert [r for _, r in parts] == [slice(0, 1), slice(1, 3), slice(3, 4)]
    t = Layout._prepared(whole, lazy)
    own = QuantPanels("q_alone", 0, rows, widths["q"], widths["q"])
    assert spec_key(own, lazy) == spec_key(parts[1][0], lazy)
    assert torch.equal(t[1:3], own.prepare(lazy))
    taken = Layout._prepared(own, lazy)  # made by no one: a view of the whole
    assert taken.data_ptr() == t[1:3].data_ptr()


@pytest.mark.parametrize("widened", [False, True])
def test_a_merged_transposed_weight_is_packed_from_the_sources_own_bytes(widened):
    """A float32 program's panels of cat(q^T, k^T, v^T) (bf16 checkpoint weights, widened)
    are packed part by part straight from the stored [n, K] bf16 tensors: bit-equal to
    packing the materialized merged weight, and nothing else is asked of the source. A view
    that cuts a part, or a part off a panel boundary, takes the materialized path."""
    from eqsat_llm.codegen.c.build import compiler
    from eqsat_llm.codegen.c.packed_gemm import PackedWeight
    from eqsat_llm.codegen.c.tiles import PACKED_PANEL as P

    if compiler() is None:
        pytest.skip("no C compiler")
    widths = {"q": 4 * P, "k": 2 * P, "v": 2 * P - 3}  # v ragged: the last panel padded
    stored = {n: torch.randn(w, K, generator=torch.Generator().manual_seed(w)).bfloat16()
              for n, w in widths.items()}
    asked = []

    def source(name):
        asked.append(name)
        return stored[name]
    dtype = torch.bfloat16 if widened else torch.float32  # the model's dtype of the weight
    refs = {n: WeightRef(n, torch.empty(w, K, dtype=dtype, device="meta"))
            for n, w in widths.items()}

    def fold(op, attrs, *args):
        out = evaluate(op, [materialize(a, source) for a in args], attrs)
        return with_recipe(torch.empty(out.shape, dtype=out.dtype, device="meta"), op, attrs,
                           list(args))

    def t(n):
        part = fold("permute", {"dims": [1, 0]}, refs[n])
        return fold("to_dtype", {"dtype": "float32"}, part) if widened else part
    merged = fold("cat", {"dim": 1}, *(t(n) for n in widths))
    n = merged.shape[1]
    lazy = LazyConstants({"m": merged}, source)
    whole = PackedWeight("m", 0, K, n, n, 1)
    want = whole.prepare_in_torch(materialize(merged, source))
    asked.clear()
    got = whole.prepare(lazy)
    assert asked == ["q", "k", "v"]  # each part read once, no merged weight made
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # k and v alone (another program's part), and a view that cuts q: the same panels
    kv = PackedWeight("m", 4 * P, K, n - 4 * P, n, 1)
    assert lazy.source_columns("m", 4 * P, K, n - 4 * P, n) is not None
    assert torch.equal(kv.prepare(lazy), want[4:])
    assert lazy.source_columns("m", P, K, n - P, n) is None
