"""The e-graph language: one egglog constructor per registered op, made from its declaration.

`Tensor` is the one sort of values. An op with tensor inputs `x, y` and attributes
`dims:ints, alpha:float` becomes the egglog function `op(x: Tensor, y: Tensor, dims: Vec[i64],
alpha: f64) -> Tensor`; an op taking a list of tensors (cat) takes a `Vec[Tensor]`. Rules use
the constructors through the namespace `E`: `E.view(E.view(x, s1), s2)`.

Two analyses are declared beside the constructors: `shape(t)` and `dtype(t)`, computed by the
rules of `analysis.py` and read by rewrite rules that need them.
"""

from __future__ import annotations

from types import SimpleNamespace

from egglog import Expr, String, Vec, f64, function, i64

from ..ops import REGISTRY, OpDef


class Tensor(Expr):
    """A tensor-valued e-class."""


# The egglog sort of each attribute kind.
ATTR_SORTS = {"int": "i64", "bool": "i64", "float": "f64", "ints": "Vec[i64]", "str": "String"}


def input_names(opdef: OpDef) -> list[str]:
    """Names of the constructor's tensor parameters (the list parameter is called `xs`)."""
    if opdef.arity is None:
        return ["xs"]
    return [f"x{i}" for i in range(opdef.arity)]


def _make_constructor(opdef: OpDef):
    # egglog reads a function's signature; one is generated from the op's declaration.
    params = [f"{n}: {'Vec[Tensor]' if opdef.arity is None else 'Tensor'}"
              for n in input_names(opdef)]
    params += [f"{name}: {ATTR_SORTS[kind]}" for name, kind in opdef.attrs]
    source = f"def {opdef.name}({', '.join(params)}) -> Tensor: ...\n"
    namespace = {"Tensor": Tensor, "Vec": Vec, "i64": i64, "f64": f64, "String": String}
    exec(source, namespace)  # noqa: S102 - the source is built from the registry only
    fn = namespace[opdef.name]
    fn.__module__ = __name__
    return function(fn, egg_fn=opdef.name)


E = SimpleNamespace(**{name: _make_constructor(op) for name, op in REGISTRY.items()})


@function(merge=lambda old, new: old)
def shape(t: Tensor) -> Vec[i64]:
    """The static shape of a tensor (the analysis; first value kept)."""


@function(merge=lambda old, new: old)
def dtype(t: Tensor) -> String:
    """torch's dtype name of a tensor, or a weak scalar dtype ("py_float", ...)."""


# Names the serializer gives the analyses, so that extraction ignores their nodes.
ANALYSIS_OPS = frozenset({"shape", "dtype"})
