"""Rules as data: each rewrite carries a name, a family and a soundness class.

A rule module defines families as generator functions, in the style of egglog-python's own
rule modules: the parameters are the pattern variables (typed by their annotations), and each
yielded line is one identity, `guarded(lhs, rhs, *conditions)` where it holds only under
conditions:

    @family("layout")
    def layout(x: Tensor, y: Tensor, s: Vec[i64], t: Vec[i64]):
        yield exact("view-view", rewrite(E.view(E.view(x, s), t)).to(E.view(x, t)))
        yield exact("view-noop", guarded(E.view(x, s), x, eq(shape(x)).to(s)))

Soundness classes: "exact" (bit-identical results), "reassociates" (equal in real arithmetic;
floating-point rounding may differ), "approximate" (within a stated tolerance).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from egglog import Fact, RewriteOrRule, Ruleset, eq, rule, ruleset, union, var

from .egraph.language import Tensor
from .errors import RuleError

SOUNDNESS = ("exact", "reassociates", "approximate")


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    soundness: str
    command: RewriteOrRule
    tolerance: float | None = None
    note: str = ""
    check_dims: tuple[int, ...] = ()  # sizes `rules check` draws (default rulecheck.DIMS)
    # how `rules check` shapes the weights it draws (random values; sparsity: pruned ones)
    check_weights: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    check_dtype: str = "float64"  # the dtype of the tensors `rules check` draws

    @property
    def key(self) -> object:
        """How egglog's run report names this rule (its declaration)."""
        return self.command.decl


@dataclass(frozen=True)
class _Pending:
    name: str
    soundness: str
    command: RewriteOrRule
    tolerance: float | None
    note: str
    check_dims: tuple[int, ...] = ()
    check_weights: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    check_dtype: str = "float64"


def exact(name: str, command: RewriteOrRule, note: str = "", check_dims: tuple[int, ...] = (),
          check_weights: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
          check_dtype: str = "float64") -> _Pending:
    return _Pending(name, "exact", command, None, note, check_dims, check_weights, check_dtype)


def reassociates(name: str, command: RewriteOrRule, note: str = "") -> _Pending:
    return _Pending(name, "reassociates", command, None, note)


def approximate(name: str, command: RewriteOrRule, tolerance: float, note: str = "",
                check_dims: tuple[int, ...] = ()) -> _Pending:
    return _Pending(name, "approximate", command, tolerance, note, check_dims, None)


def guarded(lhs: Tensor, rhs: Tensor, *conditions: Fact) -> RewriteOrRule:
    """lhs -> rhs where the conditions hold: rule(eq(y).to(lhs), *conditions).then(union(y)
    .with_(rhs)). Unlike rewrite(lhs).to(rhs, *conditions), the conditions can read facts of
    the matched term itself (shape(y), dtype(y)): it is the variable y, a family's parameter
    `y: Tensor`."""
    y = var("y", Tensor)
    return rule(eq(y).to(lhs), *conditions).then(union(y).with_(rhs))


LIBRARY_PACKAGE = "eqsat_llm.rules"
FAMILIES: dict[str, list[Rule]] = {}
# Families left out of "all": rules that grow the e-graph without bound (associativity,
# commutativity, distributivity), whose saturation limits stop them at a cost in compile time;
# identities that hold for finite values only ("algebra-finite": x - x = 0 is wrong for inf and
# NaN, which the differential fuzzer's inputs carry); the approximate quantize-<format>
# families, which optimize(quantize=...) adds; and "sparsity", which optimize(sparsity="auto")
# adds (it needs the weights' values read).
OPT_IN = frozenset({"algebra-ac", "algebra-finite", "sparsity"})


def opt_in(family_name: str) -> bool:
    return family_name in OPT_IN or family_name.startswith("quantize-")


def family(name: str) -> Callable[[Callable[..., Iterator[_Pending]]], list[Rule]]:
    """Collect a generator of rules into a list of Rules of the family `name`. Families of
    the library (modules under eqsat_llm.rules) are also registered by name; a user's module
    passes its rules to optimize() itself."""

    def collect(fn: Callable[..., Iterator[_Pending]]) -> list[Rule]:
        try:
            hints = typing.get_type_hints(fn)
            variables = [var(p, hints[p]) for p in inspect.signature(fn).parameters]
            rules = [Rule(r.name, name, r.soundness, r.command, r.tolerance, r.note,
                          r.check_dims, r.check_weights, r.check_dtype) for r in fn(*variables)]
        except Exception as exc:  # a typo in a rule (E.no_such_op), a missing annotation
            raise RuleError(f"rule family {name!r} ({fn.__code__.co_filename}:"
                            f"{_raised_at(exc, fn)}) raised while building its rules: "
                            f"{type(exc).__name__}: {exc}") from exc
        if fn.__module__.startswith(LIBRARY_PACKAGE + "."):
            existing = {r.name for rs in FAMILIES.values() for r in rs}
            for r in rules:
                if r.name in existing:
                    raise RuleError(f"rule name {r.name!r} is used twice")
                existing.add(r.name)
            FAMILIES.setdefault(name, []).extend(rules)
        return rules

    return collect


def _raised_at(exc: BaseException, fn: Callable[..., object]) -> int:
    """The line of `fn`'s file where `exc` was raised (the family's first line if none)."""
    tb, line = exc.__traceback__, fn.__code__.co_firstlineno
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == fn.__code__.co_filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def load_library() -> dict[str, list[Rule]]:
    """Import the rule library's modules (which register their families)."""
    from . import rules  # noqa: F401  (eqsat_llm.rules: the top-level rules/ folder)
    return FAMILIES


RuleSpec = str | Rule | types.ModuleType | Ruleset


def rules_of_module(module: types.ModuleType) -> list[Rule]:
    """The rules a rule module defines: its module-level lists of Rule (what @family returns)."""
    out: list[Rule] = []
    for value in vars(module).values():
        if isinstance(value, list) and value and all(isinstance(r, Rule) for r in value):
            out.extend(value)
    return out


def rules_of_ruleset(rs: Ruleset, soundness: str = "exact") -> list[Rule]:
    """Plain egglog rewrites, named by their text; their claimed soundness is checked like any
    user rule's before use."""
    decls = rs.__egg_ruleset__.rules
    name = rs.ident.name if rs.ident is not None else "ruleset"
    return [Rule(f"{name}[{i}]", "user", soundness, RewriteOrRule(rs._current_egg_decls, d))
            for i, d in enumerate(decls)]


def resolve(spec: Iterable[RuleSpec] | None) -> list[Rule]:
    """Rules named by family names (or "all"), given as Rule objects, rule modules or egglog
    rulesets."""
    families = load_library()
    if spec is None:
        spec = ["all"]
    out: list[Rule] = []
    for item in spec:
        if isinstance(item, Rule):
            out.append(item)
        elif isinstance(item, types.ModuleType):
            out.extend(rules_of_module(item))
        elif isinstance(item, Ruleset):
            out.extend(rules_of_ruleset(item))
        elif item == "all":
            out.extend(r for f, rs in families.items() if not opt_in(f) for r in rs)
        elif item in families:
            out.extend(families[item])
        else:
            raise RuleError(f"unknown rule family {item!r}; known: {sorted(families)}")
    seen: set[str] = set()
    return [r for r in out if not (r.name in seen or seen.add(r.name))]


def as_ruleset(rules: list[Rule]):
    return ruleset(*(r.command for r in rules), name="rewrites")
