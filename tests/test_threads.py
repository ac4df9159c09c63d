"""One Compiled called from several threads at once: every call gets its own inputs' result
(calls on one program share its arena, so they take turns: api.Compiled's lock)."""

from __future__ import annotations

import threading

import pytest
import torch

from eqsat_llm import optimize


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x))) + x


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_calls_from_many_threads_each_get_their_own_result(backend):
    torch.manual_seed(0)
    model = Mlp().eval()
    compiled = optimize(model, (torch.randn(4, 32),), backend=backend, measure_eager=False)
    inputs = [torch.randn(4, 32) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors: list[str] = []

    def worker(k: int) -> None:
        for _ in range(25):
            got = compiled(inputs[k])
            if not torch.allclose(got, expected[k], atol=1e-5):
                errors.append(f"thread {k}: off by {(got - expected[k]).abs().max():.3g}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
