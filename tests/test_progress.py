"""The progress line (generation/progress.py): shown on a terminal, rewritten in place, silent on a
pipe."""

import io

from eqsat_llm.generation.progress import ProgressLine, bytes_text


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_one_line_rewritten_in_place():
    out = Terminal()
    line = ProgressLine(out)
    line.show("reading weights: 0.10 of 1.00 GB")
    line.show("skipped: under 0.1 s after the last")
    line.done("reading weights: done")
    text = out.getvalue()
    assert text.startswith("\rreading weights: 0.10") and "skipped" not in text
    assert text.endswith("\rreading weights: done           \n")  # padded over the last


def test_a_pipe_gets_nothing(monkeypatch):
    out = io.StringIO()
    line = ProgressLine(out)
    line.show("x", force=True)
    line.done("y")
    assert out.getvalue() == ""
    monkeypatch.setenv("EQSAT_QUIET", "1")
    assert not ProgressLine(Terminal()).enabled


def test_bytes_text():
    assert bytes_text(int(2e9), int(4e9), 4.0) == "2.00 of 4.00 GB, 0.50 GB/s"
