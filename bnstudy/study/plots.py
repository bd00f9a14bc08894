"""One figure style for the book, and stable figure files (:func:`save_figure`) the book links under each figure."""

from __future__ import annotations

import io
import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import seaborn as sns

import pandas as pd

from . import style
from .inference import Interval, t_interval
from .modes import MODE_NAMES
from .sweep import atomic_write_bytes


def _interval(values, confidence: float = 0.95) -> Interval:
    """A figure's bar: :func:`bnstudy.study.inference.t_interval` of ``values`` (NaN dropped); one value is drawn as a
    point without a bar."""
    iv = t_interval(values, confidence)
    return iv if iv.n >= 2 else Interval(iv.mean, iv.mean, iv.mean, iv.n, confidence)


MODE_ORDER = list(MODE_NAMES)
# colorblind palette entries blue, orange, green and purple: its fourth (vermillion) is too close to orange
# for backbone_eval and separate_stats, which several figures draw side by side (referee s7)
MODE_PALETTE = style.palette("mode", MODE_ORDER)  # one colour per freeze mode in every figure (bnstudy.study.style)


def set_style() -> None:
    """The book's matplotlib/seaborn style (white grid, readable sizes, SVG text kept as text)."""
    # 10 pt text: the book shows figures at up to their own width, never scaled up
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.bbox": "tight", "svg.fonttype": "none",
                                "axes.titlesize": "medium", "font.size": 10, "legend.fontsize": 10,
                                "xtick.labelsize": 10, "ytick.labelsize": 10, "axes.labelsize": 10.5})


PNG_DPI = 300


def save_figure(fig: plt.Figure, name: str, figures_dir, data=None, where: dict | None = None) -> list[Path]:
    """Write ``fig`` atomically as ``<figures_dir>/<name>.png`` (300 dpi) and ``.svg``; returns both paths.

    Also writes ``<name>.json`` naming ``data``, the CSV(s) the figure was drawn from (default: the table
    :func:`bnstudy.study.report.save_table` wrote last), ``where`` (``{column: [values]}`` of the per-seed rows it
    shows, for its provenance card) and :func:`legibility`. Raises ``ValueError`` if ``name`` has a suffix or a path
    separator, for an empty list of ``data``, or unless ``where`` maps column names to non-empty lists.
    """
    from . import report

    if "/" in name or "." in name:
        raise ValueError(f"name must be a bare figure id like '01-accuracy', got {name!r}")
    if where is not None and not (isinstance(where, dict) and all(
            isinstance(c, str) and isinstance(v, (list, tuple)) and len(v) for c, v in where.items())):
        raise ValueError(f"where must map column names to non-empty lists of values, got {where!r}")
    paths = []
    for ext, kw in (("png", {"dpi": PNG_DPI}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        p = Path(figures_dir) / f"{name}.{ext}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(f"data must name at least one CSV for figure {name!r}, got an empty list")
        data, more = Path(data[0]), [Path(d) for d in data[1:]]
    else:
        data, more = (Path(data) if data is not None else report.last_table), []
    meta = dict(figure=name, png=f"{name}.png", png_dpi=PNG_DPI, svg=f"{name}.svg",
                data=data.name if data is not None else None,
                data_sidecar=report.sidecar_path(data).name if data is not None else None)
    if more:
        meta.update(data_more=[d.name for d in more], data_more_sidecars=[report.sidecar_path(d).name for d in more])
    if where:
        meta["where"] = {c: list(v) for c, v in where.items()}
    meta.update(legibility(fig))
    side = Path(figures_dir) / f"{name}.json"
    atomic_write_bytes(side, (json.dumps(meta, indent=2) + "\n").encode())
    return paths


def legibility(fig: plt.Figure) -> dict:
    """How large ``fig``'s smallest text is on the page: ``width_in`` (drawn width, inches), ``min_font_pt`` (as
    drawn), ``page_font_pt`` (once shrunk to :data:`bnstudy.study.style.COLUMN_WIDTH_IN`, never enlarged) and
    ``phone_font_px`` (CSS px at :data:`bnstudy.study.style.PHONE_WIDTH_PX`, 100 px per inch)."""
    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and t.figure is not None]
    width = float(fig.get_tightbbox(fig.canvas.get_renderer()).width)
    smallest = float(min(sizes)) if sizes else float("nan")
    scale = min(1.0, style.COLUMN_WIDTH_IN / width) if width > 0 else 1.0
    phone = min(1.0, style.PHONE_WIDTH_PX / (100 * width)) if width > 0 else 1.0  # shown at most its own width
    return dict(width_in=round(width, 3), min_font_pt=smallest, page_font_pt=round(smallest * scale, 3),
                phone_font_px=round(smallest / 72 * 100 * phone, 2))


def interval_frame(df: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Mean and 95% interval of ``value`` per group ``by``: columns ``mean, lo, hi``, indexed by ``by``."""
    return df.groupby(by)[value].apply(lambda v: pd.Series(tuple(_interval(v)), index=["mean", "lo", "hi"])).unstack()


def min_text_size(fig: plt.Figure, size: float = 9.0) -> plt.Figure:
    """Raise every text of ``fig`` (labels, ticks, legends, annotations) below ``size`` points to ``size``."""
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_fontsize() < size:
            t.set_fontsize(size)
    return fig


def _mean_ci_bar(ax, x, values, color, **kw):
    iv = _interval(values)
    ax.errorbar([x], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D", color=color, ms=6,
                capsize=5, lw=1.6, zorder=4, **kw)


def _ci_text(mean, lo, hi, n, min_seeds=3, digits=3) -> str:
    if n < min_seeds:
        return f"{mean:.{digits}f} (range of {n} seeds)"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def legend_below(fig: plt.Figure, ax, ncol: int = 3) -> plt.Figure:
    """One legend for the whole figure, below its panels, from ``ax``'s labelled artists (``ncol`` columns), after
    ``tight_layout``; then :func:`fit_page` at the book's column width and smallest font (:mod:`.style`)."""
    h, lab = ax.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(h, lab, loc="upper center", ncol=ncol, frameon=False, bbox_to_anchor=(0.5, -0.01))
    return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def fit_page(fig: plt.Figure, width: float = 6.6, min_size: float = 9.0) -> plt.Figure:
    """Shrink ``fig`` to at most ``width`` inches wide (aspect kept; the browser would shrink its text with it) and
    raise text below ``min_size`` pt."""
    w, h = fig.get_size_inches()
    if w > width:
        fig.set_size_inches(width, h * width / w)
    return min_text_size(fig, min_size)
