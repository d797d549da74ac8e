"""Where the analysis scripts write: a report directory that is no link, and every file in it
written whole (a temporary beside it, renamed) and never through a link: the same safe writer
as the ``flatlm`` commands (``flatlm.core.safe_io``).

>>> import tempfile; from pathlib import Path
>>> root = Path(tempfile.mkdtemp())
>>> (root / "elsewhere").mkdir(); (root / "link").symlink_to(root / "elsewhere")
>>> try:
...     report_dir(root / "link")
... except ValueError as e:
...     print(str(e).split(";")[0].replace(str(root), "ROOT"))
--out ROOT/link is a symbolic link (to ROOT/elsewhere)
>>> write_file(report_dir(root / "report") / "a.md", "# a")
>>> (root / "report" / "a.md").read_text()
'# a'
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from flatlm.core.safe_io import check_output_dir, refuse_links_among, write_atomic


def report_dir(path: str | Path, flag: str = "--out", files: Iterable[str] = ()) -> Path:
    """``path``, created if missing; a ValueError naming ``flag`` if it is a link or a file, or
    if one of the ``files`` the script writes there is a link: all checked before any is
    written, so that a refused report writes nothing."""
    out = check_output_dir(path, flag)
    refuse_links_among(out, files, flag)
    return out


def write_file(path: str | Path, data: str | bytes) -> None:
    """``path`` written whole, never through a link (a link there is refused)."""
    write_atomic(path, data)


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    write_file(path, df.to_csv(index=False))


def write_figure(fig, path: str | Path, **savefig) -> None:
    """A matplotlib figure as ``path`` (its format from the suffix), never through a link."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig)
    write_file(path, buffer.getvalue())
