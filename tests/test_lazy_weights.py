"""Recipe keys (lazy_weights.py): equal keys exactly when the values are equal, so that a
program takes another's prepared weight by key: nested cats in either order, and the columns
of a merged weight's quantized form (a SwiGLU weight's gate half) as the part's own."""

import pytest
import torch

from eqsat_llm.lazy_weights import (
    LazyConstants,
    WeightRef,
    columns_key,
    materialize,
    recipe_key,
    with_recipe,
)
from eqsat_llm.ops import evaluate

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
