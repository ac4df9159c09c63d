"""The rule checker: every library rule passes; planted wrong rules are caught."""

from pathlib import Path

import pytest

from eqsat_llm import rulebook
from eqsat_llm.errors import RuleError
from eqsat_llm.rulecheck import check_rule, check_rules, load_rules_from, main_check

WRONG = str(Path(__file__).with_name("rules_wrong.py"))
LAYOUT_FILE = str(Path(__file__).parents[1] / "rules" / "layout.py")
LIBRARY = rulebook.resolve(None)
EVERY_RULE = [r for rs in rulebook.load_library().values() for r in rs]  # opt-in families too

# Library rules the checker refutes, with why; strict xfail: fixing the rule fails the test,
# as a reminder to drop the entry.
KNOWN_WRONG: dict[str, str] = {}


@pytest.fixture(scope="module")
def wrong():
    return {r.name: r for r in load_rules_from(WRONG)}


@pytest.mark.parametrize("rule", [
    pytest.param(r, marks=pytest.mark.xfail(reason=KNOWN_WRONG[r.name], strict=True))
    if r.name in KNOWN_WRONG else r for r in EVERY_RULE], ids=lambda r: r.name)
def test_library_rule_passes(rule):
    res = check_rule(rule, instances=3)
    assert res.status == "pass", (res.message, res.counterexample)
    assert res.instances_checked >= 1
    assert res.counterexample is None


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_library_passes_many_instances(seed):
    results = check_rules([r for r in EVERY_RULE if r.name not in KNOWN_WRONG], instances=20,
                          seed=seed)
    bad = [(r.rule, r.status, r.message) for r in results if r.status != "pass"]
    assert not bad
    assert all(r.instances_checked == 20 for r in results)


def test_transpose_of_product_is_caught(wrong):
    # (AB)^T = A^T B^T: ill-typed for non-square A, B; numerically wrong for square ones
    for seed in range(3):
        res = check_rule(wrong["bad-transpose"], instances=5, seed=seed)
        assert res.status in ("fail", "ill-typed"), res
        cex = res.counterexample
        assert cex is not None and {"a", "b"} <= cex["leaves"].keys()
        assert "al" in cex["attributes"] and "mm" in res.message


def test_shape_changing_rule_is_ill_typed(wrong):
    res = check_rule(wrong["bad-keepdim"], instances=5)
    assert res.status == "ill-typed"
    assert "changed a type" in res.message and res.counterexample is not None
    assert res.counterexample["attributes"]["s"]  # the reduced dims


def test_numerically_wrong_rule_fails_with_its_error(wrong):
    res = check_rule(wrong["bad-triple"], instances=5)
    assert res.status == "fail" and res.instances_checked == 1
    cex = res.counterexample
    assert cex["max_error"] > cex["tolerance"] > 0
    assert "add" in res.message and "x" in cex["leaves"]


def test_wrong_union_fails(wrong):
    res = check_rule(wrong["bad-union"], instances=5)
    assert res.status == "fail" and "which the rule merged with it" in res.message


def test_sparse_rule_reading_the_wrong_dim_fails(wrong):
    # rules check draws weights 2:4 along one dim or the other (rules/sparsity.py: pruned)
    res = check_rule(wrong["bad-sparse-dim"], instances=5)
    assert res.status == "ill-typed" and "not 2:4 sparse along K" in res.message


def test_half_weight_rule_without_exact_values_fails(wrong):
    # rules/half_weights.py asks that W's values fit the half dtype; without it they round
    res = check_rule(wrong["bad-half"], instances=5)
    assert res.status == "fail" and res.counterexample is not None, res


def test_uninstantiable_pattern_is_not_exercised(wrong):
    res = check_rule(wrong["uninstantiable"], instances=5, max_attempts=200)
    assert res.status == "not-exercised" and res.instances_checked == 0
    assert "could not be instantiated" in res.message and "permute" in res.message


def test_rule_that_never_fires_is_not_exercised(wrong):
    res = check_rule(wrong["never-fires"], instances=5, max_attempts=40)
    assert res.status == "not-exercised" and "never fired" in res.message


def test_load_rules_from_a_file_leaves_the_library_unchanged():
    before = {f: list(rs) for f, rs in rulebook.FAMILIES.items()}
    first, again = load_rules_from(WRONG), load_rules_from(WRONG)  # twice: no name clash
    assert [r.name for r in first] == [r.name for r in again]
    assert {"bad-transpose", "bad-keepdim", "bad-triple"} <= {r.name for r in first}
    assert all(r.family == "wrong" for r in first)
    assert rulebook.FAMILIES == before
    assert not any(r.family == "wrong" for r in rulebook.resolve(None))
    # a file reusing the library's rule names (a copy of a library module) loads too
    assert [r.name for r in load_rules_from(LAYOUT_FILE)] == [
        r.name for r in rulebook.resolve(["layout"])]


def test_load_rules_from_module_family_and_errors():
    names = {r.name for r in load_rules_from("eqsat_llm.rules.algebra")}
    assert {r.name for r in rulebook.resolve(["algebra"])} < names <= {r.name for r in EVERY_RULE}
    assert {r.name for r in load_rules_from("eqsat_llm.rules")} == {r.name for r in EVERY_RULE}
    assert load_rules_from("layout") == rulebook.resolve(["layout"])
    assert load_rules_from("all") == LIBRARY
    with pytest.raises(RuleError):
        load_rules_from("no_such_module_xyz")
    with pytest.raises(RuleError):
        load_rules_from("missing_rules.py")


def test_main_check_prints_a_table(capsys):
    assert main_check([WRONG], instances=2, max_attempts=50) == 1
    out = capsys.readouterr().out
    for name, status in [("bad-transpose", ""), ("bad-keepdim", "ill-typed"),
                         ("bad-triple", "fail"), ("uninstantiable", "not-exercised")]:
        assert any(name in line and status in line for line in out.splitlines()), out
    assert "counterexample" in out
    assert main_check(["layout"], instances=1) == 0
    assert "rules pass" in capsys.readouterr().out
