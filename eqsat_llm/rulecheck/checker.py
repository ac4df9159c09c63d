"""check_rule: a rule drawn on random instances until enough fired, and its verdict."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import GraphError
from ..rulebook import Rule
from .compare import Checker
from .draws import DIMS, DRAW, Retry
from .instances import Instance
from .patterns import Pattern, Unsupported, read_patterns, show

STATUSES = ("pass", "fail", "ill-typed", "not-exercised")


@dataclass
class RuleCheck:
    rule: str
    family: str
    soundness: str
    status: str  # one of STATUSES
    instances_checked: int  # instances the rule fired on and whose alternatives were compared
    counterexample: dict[str, Any] | None = None
    message: str = ""
    max_error: float = 0.0  # largest error seen, relative to max(1, max|expected|)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "pass"


def check_rule(rule: Rule, *, instances: int = 20, seed: int = 0,
               max_attempts: int = 2000) -> RuleCheck:
    """Check `rule` on up to `instances` random instances it fires on (at most `max_attempts`
    draws, of which at most max(200, 20 * instances) reach egglog)."""
    start = time.perf_counter()

    def done(status: str, n: int, cex: dict[str, Any] | None, msg: str,
             err: float = 0.0) -> RuleCheck:
        return RuleCheck(rule.name, rule.family, rule.soundness, status, n, cex,
                         " ".join(msg.split()), err, time.perf_counter() - start)

    try:
        patterns = read_patterns(rule)
    except Unsupported as exc:
        return done("not-exercised", 0, None, str(exc))
    if not any(p.roots for p in patterns):
        return done("not-exercised", 0, None, "the rule matches no op pattern")
    shown = " / ".join(", ".join(show(r) for r in p.roots) for p in patterns)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    DRAW["dims"], DRAW["dtype"] = rule.check_dims or DIMS, rule.check_dtype
    try:
        return _check(rule, patterns, shown, rng, gen, instances, max_attempts, done)
    finally:
        DRAW["dims"], DRAW["dtype"] = DIMS, "float64"


def _check(rule: Rule, patterns: list[Pattern], shown: str, rng: random.Random,
           gen: torch.Generator, instances: int, max_attempts: int, done: Any) -> RuleCheck:
    try:
        checker = Checker(rule)
    except Unsupported as exc:
        return done("not-exercised", 0, None, str(exc))
    checked = typed = fired = 0
    worst = 0.0
    last_error = ""
    for attempt in range(max_attempts):
        if checked >= instances or typed >= max(200, 20 * instances):
            break
        try:
            inst = Instance(patterns[attempt % len(patterns)], rule.command.__egg_decls__, rng)
        except (GraphError, Retry) as exc:
            last_error = str(exc)
            continue
        except Unsupported as exc:
            return done("not-exercised", 0, None, f"pattern {shown}: {exc}")
        typed += 1
        outcome = checker.run(inst, gen)
        if outcome is None:
            continue
        fired += 1
        worst = max(worst, outcome.max_error)
        if outcome.status != "pass":
            return done(outcome.status, checked + 1, outcome.counterexample, outcome.message,
                        worst)
        checked += outcome.compared > 0
    if checked:
        note = "" if checked >= instances else f"checked {checked} of {instances} instances"
        return done("pass", checked, None, note, worst)
    if not typed:
        msg = (f"pattern {shown} could not be instantiated in {max_attempts} attempts"
               f" (last error: {last_error[:200]})")
    elif not fired:
        msg = (f"pattern {shown} was instantiated {typed} times but the rule never fired "
               f"(its conditions never held) {checker.last_error[:200]}")
    else:
        msg = f"the rule fired {fired} times but left nothing to compare (every choice cyclic)"
    return done("not-exercised", 0, None, msg.strip())


def check_rules(rules: Iterable[Rule], **kwargs: Any) -> list[RuleCheck]:
    return [check_rule(r, **kwargs) for r in rules]
