"""The C runtime moves its large prepared weights onto 2 MiB pages where Linux allows, on a
background thread (memcheck.collapse_in_background: madvise(MADV_COLLAPSE), Linux 6.1 and
later), values and addresses unchanged; elsewhere, or with EQSAT_HUGE_PAGES=0, nothing
happens."""

import platform
import sys

import torch

from eqsat_llm.memcheck import (
    HUGE_PAGE,
    _huge_stretches,
    collapse_in_background,
    collapse_into_huge_pages,
)


def _kernel_collapses() -> bool:
    if sys.platform != "linux":
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)


def _huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages"):
                return int(line.split()[1])
    return 0


def test_a_large_weight_is_collapsed_in_place_with_its_values():
    w = torch.randn(6 * HUGE_PAGE // 4, generator=torch.Generator().manual_seed(0))
    want, ptr = w.clone(), w.data_ptr()
    before = _huge_kib() if sys.platform == "linux" else 0
    done = collapse_into_huge_pages([w, w[10:]])  # a view of the same storage: once
    if _kernel_collapses():
        # 24 MiB from an unaligned start: at least 5 whole 2 MiB pages inside it
        assert 5 * HUGE_PAGE <= done <= 6 * HUGE_PAGE
        assert _huge_kib() - before >= done // 1024
    else:
        assert done == 0
    assert w.data_ptr() == ptr and torch.equal(w, want)


def _on(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def test_weights_back_to_back_are_moved_together():
    # a 1.5 MiB and a 3 MiB weight allocated one after the other (64 bytes of allocator
    # header between them): neither holds a whole aligned 2 MiB page, the two together do
    buf = torch.empty(8 * HUGE_PAGE, dtype=torch.uint8).untyped_storage()
    at = -(-buf.data_ptr() // HUGE_PAGE) * HUGE_PAGE - buf.data_ptr() + HUGE_PAGE
    half = 3 * HUGE_PAGE // 4
    a, b = _on(buf[at - half:at]), _on(buf[at + 64:at + 64 + 2 * half])
    assert _huge_stretches([a]) == [] and _huge_stretches([b]) == []
    assert _huge_stretches([b, a]) == [(buf.data_ptr() + at, buf.data_ptr() + at + HUGE_PAGE)]
    far = _on(buf[at + 64 + 2 * half + 3 * 4096:at + 3 * HUGE_PAGE])  # past the gap joined
    assert len(_huge_stretches([a, b, far])) == 2


def test_small_tensors_and_the_switch_leave_memory_as_it_is(monkeypatch):
    assert collapse_into_huge_pages([torch.ones(1000)]) == 0  # under one huge page
    assert collapse_in_background([torch.ones(1000)]) is None  # no thread for nothing
    monkeypatch.setenv("EQSAT_HUGE_PAGES", "0")
    assert collapse_into_huge_pages([torch.ones(4 * HUGE_PAGE)]) == 0
    assert collapse_in_background([torch.ones(4 * HUGE_PAGE)]) is None


def test_a_programs_prepared_weights_are_collapsed_in_the_background():
    from eqsat_llm import optimize

    lin = torch.nn.Sequential(torch.nn.Linear(2048, 2048, bias=False), torch.nn.SiLU()).eval()
    x = torch.randn(1, 1, 2048)  # a 16 MiB float32 weight, 4 MiB at int8
    fp32 = optimize(lin, (x,), backend="c", measure_eager=False)
    assert fp32._runtime.huge_pages is None  # float32 panels stay on 4 KiB pages
    compiled = optimize(lin, (x,), backend="c", measure_eager=False, quantize="int8")
    assert any(w.dtype == torch.int8 and w.numel() >= 2 * HUGE_PAGE
               for w in compiled._runtime.weights)
    thread = compiled._runtime.huge_pages
    assert thread is not None and thread.name == "eqsat-huge-pages"
    assert torch.allclose(compiled(x), lin(x), atol=0.05)  # usable while it runs
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert torch.allclose(compiled(x), lin(x), atol=0.05)
