import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def ray_tmpdir():
    """A private Ray temp root, short: Unix socket paths under it must stay under 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
