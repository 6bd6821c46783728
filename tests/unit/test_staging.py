"""Index arrays of one engine step travel to the device as one copy, each keeping its shape."""

import numpy as np
import torch

from masrl.engines.staging import copy_into, to_device, to_device_many


def test_many_arrays_come_back_as_views_of_one_buffer_with_their_shapes_and_values():
    a = np.arange(6).reshape(2, 3)
    b = [7, 8]
    c = np.zeros((2, 0), dtype=np.int32)  # a prefill with no cached tokens: an empty past
    d = np.array([], dtype=np.int64)
    ta, tb, tc, td = to_device_many(torch.device("cpu"), a, b, c, d)
    assert ta.tolist() == a.tolist() and tb.tolist() == b and tc.shape == (2, 0) and td.shape == (0,)
    assert {t.dtype for t in (ta, tb, tc, td)} == {torch.int64}
    assert ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr()  # one buffer, one copy
    assert to_device_many(torch.device("cpu")) == []


def test_single_copies_keep_values_and_dtype():
    x = torch.tensor([[0.5, 1.0], [0.9, 1.0]])
    assert torch.equal(to_device(x, torch.device("cpu")), x)
    dst = torch.zeros(3, dtype=torch.long)
    copy_into(dst[:2], torch.tensor([4, 5]))
    assert dst.tolist() == [4, 5, 0]
