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


# The assets are modules tests import (a toy source, measurement, ...), not tests: collecting
# them for doctests would import them, and so register them, before a test asks to.
collect_ignore = ["assets"]
