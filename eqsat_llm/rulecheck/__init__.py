"""Numerical checking of rewrite rules against the ops' reference semantics.

For each rule, random instances of its left-hand pattern(s) are built as IR graphs, encoded
into an e-graph, and the rule alone is applied by egglog (so its conditions are evaluated
exactly as during optimization). Every e-node the rule added to an e-class of the instance is
then decoded into a program, run by the reference runtime on random float64 inputs and compared
with the value of that e-class in the original instance; original nodes the rule merged are
compared with each other. How it works and how to read the output: docs/rule-checking.md.

Modules: patterns (a rule's left-hand side, read from its egglog declaration), draws (the
shapes and attribute values an instance draws), instances (a random IR graph matching a
pattern), compare (the rule applied by egglog, every alternative run and compared), checker
(check_rule: the draw loop and its verdict), loading (rules from a file, module or family),
command (`eqsat-llm rules check`).
"""

from .checker import STATUSES, RuleCheck, check_rule, check_rules
from .command import main_check
from .compare import ROUNDS, TOLERANCE
from .draws import DIMS
from .loading import load_rules_from

__all__ = ["DIMS", "ROUNDS", "STATUSES", "TOLERANCE", "RuleCheck", "check_rule", "check_rules",
           "load_rules_from", "main_check"]
