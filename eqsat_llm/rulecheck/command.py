"""`eqsat-llm rules check`: one row per rule, with a counterexample for each that fails."""

from __future__ import annotations

import json

from ..rulebook import Rule
from .checker import check_rule
from .loading import load_rules_from


def main_check(specs: list[str], *, instances: int = 20, seed: int = 0,
               max_attempts: int = 2000) -> int:
    """`eqsat-llm rules check [FILE_OR_MODULE ...]`: print one row per rule; 1 if any rule is
    not "pass", else 0. No specs: the whole library."""
    rules: list[Rule] = []
    for spec in specs or ["all"]:
        rules.extend(load_rules_from(spec))
    # columns as wide as the longest name (rows print as each rule is checked)
    name_w = max([28, *(len(r.name) + 2 for r in rules)])
    family_w = max([12, *(len(r.family) + 2 for r in rules)])
    print(f"{'rule':<{name_w}}{'family':<{family_w}}{'soundness':<14}{'status':<15}{'inst':>5}"
          f"{'sec':>7}  max error / message")
    bad = 0
    for rule in rules:
        res = check_rule(rule, instances=instances, seed=seed, max_attempts=max_attempts)
        err = f"{res.max_error:.2g}" if res.status in ("pass", "fail") else "-"
        detail = err + (f"  {res.message}" if res.message else "")
        print(f"{res.rule:<{name_w}}{res.family:<{family_w}}{res.soundness:<14}{res.status:<15}"
              f"{res.instances_checked:>5}{res.seconds:>7.2f}  {detail}", flush=True)
        if not res.ok:
            bad += 1
            if res.counterexample:
                cex = {k: v for k, v in res.counterexample.items()
                       if k not in ("instance", "alternative")}
                print(f"    counterexample: {json.dumps(cex, default=str)}")
                for key in ("instance", "alternative"):
                    if res.counterexample.get(key):
                        text = str(res.counterexample[key]).replace("\n", "\n        ")
                        print(f"    {key}:\n        {text}")
    print(f"{len(rules) - bad} of {len(rules)} rules pass")
    return 1 if bad else 0
