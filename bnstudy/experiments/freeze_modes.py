"""Chapter 1: does a frozen backbone stay frozen? The four freeze modes, paired over seeds.

Stage 1 trains backbone + head A on task A; stage 2 freezes the backbone in one
of the four modes (:mod:`bnstudy.freeze`), trains a new linear head on task B
(shifted in brightness and contrast) and measures task A again on the same
held-out set. Within a seed every mode starts from the same trained backbone,
head-B initialisation and task-B batch stream.
"""

from __future__ import annotations

import pandas as pd

from .. import train
from ..freeze import MODE_NAMES, get_mode
from .common import run_transfer_sweep, seeds_for

#: Experiment-level keys (everything else is a :data:`bnstudy.train.DEFAULTS` key).
RUN_KEYS = ("profile", "seeds", "modes", "cache_dir", "n_jobs", "pack_size", "progress", "backend")
NAMESPACE = "ch01_freeze_modes"


def make_configs(seeds, modes=MODE_NAMES, **overrides) -> list[dict]:
    """One complete run config per (seed, mode), seeds outermost."""
    for m in modes:
        get_mode(m)
    return [train.complete_config({**overrides, "seed": s, "mode": m}) for s in seeds for m in modes]


def run(config: dict | None = None) -> pd.DataFrame:
    """Run chapter 1's experiment; one row per (seed, mode).

    ``config`` may hold ``profile`` (``quick`` | ``full``), ``seeds`` (count or
    list; default by profile), ``modes`` (default all four), ``cache_dir``,
    ``n_jobs``, ``pack_size``, ``backend``, ``progress``, and any key of
    :data:`bnstudy.train.DEFAULTS` (e.g. ``steps``, ``brightness``).
    Columns: see :func:`bnstudy.train.transfer`. Raises ``ValueError`` for an
    unknown key, mode or profile.
    """
    config = dict(config or {})
    unknown = set(config) - set(RUN_KEYS) - set(train.DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(RUN_KEYS + tuple(train.DEFAULTS))}")
    seeds = seeds_for(config.get("profile", "quick"), config.get("seeds"))
    overrides = {k: v for k, v in config.items() if k in train.DEFAULTS and k not in ("seed", "mode")}
    cfgs = make_configs(seeds, tuple(config.get("modes", MODE_NAMES)), **overrides)
    return run_transfer_sweep(cfgs, namespace=NAMESPACE, cache_dir=config.get("cache_dir"),
                              n_jobs=config.get("n_jobs"), pack_size=config.get("pack_size"),
                              backend=config.get("backend", "loky"), progress=config.get("progress", True))
