"""The package's exception types: each names what went wrong and what to do about it."""


class EqsatError(Exception):
    """Base class of every error eqsat-llm raises on purpose."""


class GraphError(EqsatError):
    """An IR graph is malformed (an unknown op, a bad input reference, a shape that does not
    type-check)."""


class CaptureError(EqsatError):
    """The model could not be captured with torch.export."""


class EncodeError(EqsatError):
    """A graph could not be encoded into, or decoded from, the e-graph."""


class RuleError(EqsatError):
    """A rewrite rule is malformed, ill-typed or failed its check."""


class MemoryLimitError(EqsatError, MemoryError):
    """A program would need more memory than is available (memcheck.py): refused before any of
    it was allocated."""


class CostError(EqsatError):
    """An e-node cannot be costed: an unknown op, an op without a cost entry, or bad types
    (also a machine description the cost model cannot read)."""
