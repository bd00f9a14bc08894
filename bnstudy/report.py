"""Helpers the chapters use to put measured numbers into prose and tables.

Values are glued as plain Python numbers (a NumPy scalar's text form,
``np.float64(0.5)``, would break ``{glue:text}`key:.3f```), and sentences whose
wording depends on the data are glued as Markdown for ``{glue:md}``.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd
import torch

from .sweep import atomic_write_bytes, code_version


def glue_number(key: str, value) -> float:
    """Glue ``value`` as a Python float under ``key`` (for ``{glue:text}`key:.3f```)."""
    from myst_nb import glue
    value = float(value)
    glue(key, value, display=False)
    return value


def glue_md(key: str, text: str) -> str:
    """Glue Markdown ``text`` under ``key`` (for ``{glue:md}`key```)."""
    from IPython.display import Markdown
    from myst_nb import glue
    glue(key, Markdown(text), display=False)
    return text


def fmt_ci(mean: float, low: float, high: float, digits: int = 3) -> str:
    """``"0.512 [0.498, 0.526]"``: a mean and its interval."""
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def run_line(profile: str, n_seeds: int, **params) -> str:
    """A one-line, human-readable record of what a chapter ran with."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    extra = ", ".join(f"{k}={v}" for k, v in params.items())
    return (f"Ran with profile={profile}, {n_seeds} seeds, {extra}; bnstudy code {code_version()}, "
            f"torch {torch.__version__}, device {dev}, Python {platform.python_version()}.")


def save_table(df: pd.DataFrame, path) -> Path:
    """Write the tidy table ``df`` as CSV atomically (a complete file or none).

    Raises ``ValueError`` naming the columns if any holds lists, tuples or dicts: a CSV cannot
    hold them faithfully, so turn them into a long table first instead of losing them.
    """
    nested = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (list, tuple, dict))).any()]
    if nested:
        raise ValueError(f"save_table: columns {nested} hold lists or dicts; save them as a tidy long table "
                         f"(one value per row) instead")
    path = Path(path)
    atomic_write_bytes(path, df.to_csv(index=False).encode())
    return path


def provenance() -> str:
    """Which code produced a result: ``bnstudy <version> code <hash>``."""
    from importlib.metadata import version
    try:
        v = version("bnstudy")
    except Exception:
        v = "unknown"
    return f"bnstudy {v} code {code_version()}"


def profile_note(profile: str, n_seeds: int) -> str:
    """A Markdown note telling readers how much to trust a page built in the ``quick`` profile."""
    if profile == "full":
        return (f"*This page was built with the full profile: {n_seeds} seeds per condition, 95% intervals "
                f"over seeds.*")
    return (f"*This page was built with the {profile} profile ({n_seeds} seeds per condition), meant for "
            f"checking the pipeline. With so few seeds the 95% intervals are wide (a Student's t interval "
            f"can even extend past 0 or 1), bootstrap resamples of the seeds take only a few distinct "
            f"values, and small differences may be noise; read the numbers from the full-profile book.*")
