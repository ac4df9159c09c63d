"""Errors of the C backend: each says what failed and that the caller may fall back."""

from __future__ import annotations

from ...errors import EqsatError


class UnsupportedByBackend(EqsatError):
    """The program has ops (or dtypes) the C backend does not generate; `ops` names them.
    Run it with the reference runtime instead."""

    def __init__(self, ops: list[str], detail: str = ""):
        self.ops = sorted(set(ops))
        msg = f"the C backend does not support: {', '.join(self.ops)}"
        super().__init__(msg + (f" ({detail})" if detail else "")
                         + "; run this program with the reference runtime")


class CCompileError(EqsatError):
    """The C compiler rejected the generated program. `kernel` names the kernel the first error
    lies in (None when it cannot be attributed), `message` is the compiler's output."""

    def __init__(self, kernel: str | None, message: str, command: list[str]):
        self.kernel = kernel
        self.message = message
        self.command = command
        where = f"in kernel {kernel}" if kernel else "(not attributable to one kernel)"
        super().__init__(f"C compile failed {where}: {' '.join(command)}\n{message.strip()}")


class KernelIndexError(EqsatError, IndexError):
    """A generated kernel met an index out of range (an embedding id, gather indices): it read
    nothing there, and the call raises as torch would."""
