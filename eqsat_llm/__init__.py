"""eqsat-llm: an equality-saturation optimizer for LLM inference graphs.

    compiled = eqsat_llm.optimize(model, example_inputs)
    out = compiled(*inputs)
    print(compiled.report.summary())
"""

from .api import Compiled, EagerFallbackWarning, FallbackWarning, optimize, optimize_graph
from .errors import CaptureError, EncodeError, EqsatError, GraphError, RuleError
from .report import Report
from .saturate import Limits

__all__ = [
    "CaptureError",
    "Compiled",
    "EagerFallbackWarning",
    "EncodeError",
    "EqsatError",
    "FallbackWarning",
    "GraphError",
    "Limits",
    "Report",
    "RuleError",
    "optimize",
    "optimize_graph",
]
__version__ = "0.1.0"


def _register_dynamo_backend() -> None:
    from .dynamo import register

    register()


_register_dynamo_backend()
