"""Rules as data: each rewrite carries a name, a family and a soundness class.

A rule module defines families as generator functions, in the style of egglog-python's own
rule modules: the parameters are the pattern variables (typed by their annotations), and each
yielded line is one identity:

    @family("layout")
    def layout(x: Tensor, s: Vec[i64], t: Vec[i64]):
        yield exact("view-view", rewrite(E.view(E.view(x, s), t)).to(E.view(x, t)))

Soundness classes: "exact" (bit-identical results), "reassociates" (equal in real arithmetic;
floating-point rounding may differ), "approximate" (within a stated tolerance).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from egglog import RewriteOrRule, ruleset, var

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


def exact(name: str, command: RewriteOrRule, note: str = "") -> _Pending:
    return _Pending(name, "exact", command, None, note)


def reassociates(name: str, command: RewriteOrRule, note: str = "") -> _Pending:
    return _Pending(name, "reassociates", command, None, note)


def approximate(name: str, command: RewriteOrRule, tolerance: float, note: str = "") -> _Pending:
    return _Pending(name, "approximate", command, tolerance, note)


FAMILIES: dict[str, list[Rule]] = {}


def family(name: str) -> Callable[[Callable[..., Iterator[_Pending]]], list[Rule]]:
    """Collect a generator of rules into the family `name` (appending if it exists)."""

    def collect(fn: Callable[..., Iterator[_Pending]]) -> list[Rule]:
        hints = typing.get_type_hints(fn)
        variables = [var(p, hints[p]) for p in inspect.signature(fn).parameters]
        rules = [Rule(r.name, name, r.soundness, r.command, r.tolerance, r.note)
                 for r in fn(*variables)]
        existing = {r.name for rs in FAMILIES.values() for r in rs}
        for r in rules:
            if r.name in existing:
                raise RuleError(f"rule name {r.name!r} is used twice")
            existing.add(r.name)
        FAMILIES.setdefault(name, []).extend(rules)
        return rules

    return collect


def load_library() -> dict[str, list[Rule]]:
    """Import the rule library's modules (which register their families)."""
    from . import rules  # noqa: F401  (eqsat_llm.rules: the top-level rules/ folder)
    return FAMILIES


def resolve(spec: Iterable[str | Rule] | None) -> list[Rule]:
    """Rules named by family names (or "all"), or given as Rule objects."""
    families = load_library()
    if spec is None:
        spec = ["all"]
    out: list[Rule] = []
    for item in spec:
        if isinstance(item, Rule):
            out.append(item)
        elif item == "all":
            out.extend(r for rs in families.values() for r in rs)
        elif item in families:
            out.extend(families[item])
        else:
            raise RuleError(f"unknown rule family {item!r}; known: {sorted(families)}")
    seen: set[str] = set()
    return [r for r in out if not (r.name in seen or seen.add(r.name))]


def as_ruleset(rules: list[Rule]):
    return ruleset(*(r.command for r in rules), name="rewrites")
