"""Settings shared by the whole suite."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and OpenMP threads competing with other
    processes on a 2-core machine make them up to 50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
