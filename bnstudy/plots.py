"""One figure style for the book, and stable figure files.

``save_figure(fig, "01-accuracy", figures_dir)`` writes ``01-accuracy.png`` (300 dpi)
and ``01-accuracy.svg`` atomically, so a reader can cite and link a file whose
name does not change between builds, and ``01-accuracy.json``, which names the
tidy CSV the figure was drawn from. The book (``bnstudy.sphinxext``) links all of
them under the figure labelled ``fig-ch01-accuracy``.
"""

from __future__ import annotations

import io
import json
import os
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


PNG_DPI = 300


def save_figure(fig: plt.Figure, name: str, figures_dir, data=None) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` (300 dpi) and ``.svg``; returns both paths.

    Also writes ``<name>.json`` naming the files and ``data``, the tidy CSV the figure was drawn from
    (default: the table that :func:`bnstudy.report.save_table` wrote last in this process; pass the
    path when the figure comes from another one). Raises ``ValueError`` if ``name`` has a suffix or a
    path separator (names are stable ids).
    """
    from . import report

    if "/" in name or "." in name:
        raise ValueError(f"name must be a bare figure id like '01-accuracy', got {name!r}")
    paths = []
    for ext, kw in (("png", {"dpi": PNG_DPI}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        p = Path(figures_dir) / f"{name}.{ext}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    data = Path(data) if data is not None else report.last_table
    meta = dict(figure=name, png=f"{name}.png", png_dpi=PNG_DPI, svg=f"{name}.svg",
                data=data.name if data is not None else None,
                data_sidecar=report.sidecar_path(data).name if data is not None else None)
    side = Path(figures_dir) / f"{name}.json"
    atomic_write_bytes(side, (json.dumps(meta, indent=2) + "\n").encode())
    return paths
