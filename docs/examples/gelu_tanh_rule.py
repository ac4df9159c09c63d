"""Worked example of docs/rules.md: recognise GPT-2's `gelu_new`, the tanh approximation of
GELU written out in elementwise ops, as one `gelu(x, approximate="tanh")` op.

    0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))
"""

from egglog import String, rewrite

from eqsat_llm.egraph.language import E, Tensor
from eqsat_llm.rulebook import family, reassociates

SQRT_2_OVER_PI = 0.7978845608028654


@family("example-gelu")
def gelu_rules(x: Tensor, k: String):
    cube = E.pow(x, E.scalar(3.0, k))
    inner = E.mul(E.add(x, E.mul(cube, E.scalar(0.044715, "float"))),
                  E.scalar(SQRT_2_OVER_PI, "float"))
    written_out = E.mul(E.mul(x, E.scalar(0.5, "float")),
                        E.add(E.tanh(inner), E.scalar(1.0, "float")))
    yield reassociates("gelu-tanh", rewrite(written_out).to(E.gelu(x, "tanh")),
                       note="torch's fused kernel rounds differently")
