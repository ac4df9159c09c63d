"""interning.intern: one copy of equal compile-time tensors across programs."""

import gc

import torch

from eqsat_llm.weights.interning import intern


def test_equal_tensors_share_one_copy_and_unequal_ones_do_not():
    a = torch.randn(64, 128)
    first = intern(a)
    assert first is a
    assert intern(a.clone()) is a  # equal values: the copy is dropped for the first
    differs = a.clone()
    differs[37, 5] += 1.0  # (not at a sampled position of the fingerprint, as it happens)
    assert intern(differs) is differs
    assert intern(a.t().contiguous()) is not a  # other strides / shape: another tensor
    assert intern(a.double()) is not a


def test_only_weak_references_are_kept():
    a = torch.randn(64, 128)
    intern(a)
    copy = a.clone()
    del a
    gc.collect()
    assert intern(copy) is copy  # the first one is gone: nothing keeps it alive


def test_small_tensors_and_tensors_that_need_grad_are_left_alone():
    s = torch.randn(10)
    assert intern(s.clone()) is not intern(s.clone())
    p = torch.randn(64, 128, requires_grad=True)
    assert intern(p) is p


def test_last_call_answers_the_same_input_and_misses_a_changed_one():
    from eqsat_llm.formats.last_call import last_call

    calls = []

    @last_call
    def double(t, k):
        calls.append(k)
        return t * k

    x = torch.arange(6.0)
    first = double(x, 2)
    assert double(x, 2) is first and calls == [2]
    assert torch.equal(double(x, 3), x * 3) and calls == [2, 3]  # other arguments
    x.add_(1)  # an in-place write: its version counter moves on
    assert torch.equal(double(x, 3), x * 3) and calls == [2, 3, 3]
    y = x.clone()
    assert torch.equal(double(y, 3), y * 3) and len(calls) == 4  # an equal, other tensor
