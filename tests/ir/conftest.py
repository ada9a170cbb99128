"""IR tests run tiny shapes: one intra-op thread is faster than two fighting over a loaded CPU."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
