"""``python -m flatlm``: the ``flatlm`` command (what ``flatlm replicate --jobs`` starts)."""

import sys

from flatlm.cli import main

sys.exit(main())
