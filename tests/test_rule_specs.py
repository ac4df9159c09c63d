"""What `optimize(rules=...)` accepts, and saturation limits under rules that never saturate."""

import types

import pytest
import torch
from egglog import rewrite, ruleset, var

from eqsat_llm import Limits, optimize
from eqsat_llm.egraph.language import E, Tensor
from eqsat_llm.rulebook import OPT_IN, exact, family, resolve


class AddChain(torch.nn.Module):
    def forward(self, *xs):
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return total


@pytest.mark.slow  # (21 s; the default run stays under 15 minutes)
def test_ac_rules_are_stopped_by_the_limits():
    xs = tuple(torch.randn(4, 4) for _ in range(10))
    model = AddChain()
    compiled = optimize(model, xs, rules=["algebra-ac"],
                        limits=Limits(iterations=50, enodes=20_000, seconds=20))
    assert compiled.report.stop_reason in ("enode_limit", "time_limit")
    assert compiled.report.egraph_size_per_iteration[-1] >= 20_000 or \
        compiled.report.stop_reason == "time_limit"
    assert torch.allclose(compiled(*xs), model(*xs), atol=1e-5)
    assert "algebra-ac" in OPT_IN and not any(r.family == "algebra-ac" for r in resolve(None))


def test_rules_from_a_module_and_a_ruleset():
    x = var("x", Tensor)
    module = types.ModuleType("my_rules")

    @family("my-family")
    def mine(x: Tensor):
        yield exact("my-neg-neg", rewrite(E.neg(E.neg(x))).to(x))

    module.mine = mine
    assert [r.name for r in resolve([module])] == ["my-neg-neg"]
    plain = ruleset(rewrite(E.neg(E.neg(x))).to(x), name="plain")
    rules = resolve([plain])
    assert len(rules) == 1 and rules[0].family == "user"

    class DoubleNeg(torch.nn.Module):
        def forward(self, a):
            return torch.neg(torch.neg(a)) * 3.0

    a = torch.randn(5)
    compiled = optimize(DoubleNeg(), (a,), rules=[plain])
    assert compiled.graph.op_counts()["neg"] == 0
    assert torch.equal(compiled(a), a * 3.0)


def test_a_wrong_user_rule_is_refused_unless_forced():
    import pytest
    from egglog import f64

    from eqsat_llm import RuleError

    a = var("a", Tensor)
    wrong = ruleset(rewrite(E.mul(a, E.scalar(f64(2.0), "float"))).to(E.add(a, E.add(a, a))),
                    name="triple")

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2.0

    x = torch.randn(3)
    with pytest.raises(RuleError, match="triple\\[0\\].*failed its check"):
        optimize(Double(), (x,), rules=[wrong])
    forced = optimize(Double(), (x,), rules=[wrong], force_rules=True)
    # what the user asked for, at their risk: the rule ran (extraction kept the cheaper mul)
    assert {r.name: r.matches for r in forced.report.rules}["triple[0]"] == 1
