"""One figure style for the book, and stable figure files.

``save_figure(fig, "01-accuracy", figures_dir)`` writes ``01-accuracy.png`` (150 dpi)
and ``01-accuracy.svg`` atomically, so a reader can cite and link a file whose
name does not change between builds.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import seaborn as sns

from .freeze import MODE_NAMES
from .sweep import atomic_write_bytes

MODE_ORDER = list(MODE_NAMES)
MODE_PALETTE = dict(zip(MODE_ORDER, sns.color_palette("colorblind", len(MODE_ORDER))))


def set_style() -> None:
    """The book's matplotlib/seaborn style (white grid, readable sizes, SVG text kept as text)."""
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.bbox": "tight", "svg.fonttype": "none",
                                "axes.titlesize": "medium"})


def save_figure(fig: plt.Figure, name: str, figures_dir) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` and ``.svg``; returns both paths.

    Raises ``ValueError`` if ``name`` has a suffix or a path separator (names are stable ids).
    """
    if "/" in name or "." in name:
        raise ValueError(f"name must be a bare figure id like '01-accuracy', got {name!r}")
    paths = []
    for ext, kw in (("png", {"dpi": 150}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        p = Path(figures_dir) / f"{name}.{ext}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    return paths
