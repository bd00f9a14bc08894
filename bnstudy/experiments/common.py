"""Shared plumbing for the chapters' experiments: cached stage 1, packed stage 2, seeds, intervals.

Every chapter that transfers a trained backbone uses :func:`run_transfer_sweep`:
it trains (or loads from the cache) one source backbone per distinct stage-1
config, then runs the stage-2 configs in packs through :func:`bnstudy.sweep.run_sweep`.
"""

from __future__ import annotations

import io
import numbers
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

from .. import train
from ..sweep import RunCache, atomic_write_bytes, code_version, default_cache_dir, run_sweep

#: How many seeds each profile runs by default (``full``: the published book).
PROFILE_SEEDS = {"quick": 3, "full": 10}
PROFILES = tuple(PROFILE_SEEDS)


def seeds_for(profile: str, seeds=None) -> list[int]:
    """``seeds`` if given (an int n means ``range(n)``), else the profile's default count.

    Raises ``ValueError`` for an unknown profile or fewer than 2 seeds (an
    interval over seeds needs at least two).
    """
    if profile not in PROFILE_SEEDS:
        raise ValueError(f"profile={profile!r} is not allowed; choose one of {list(PROFILES)}")
    if seeds is None:
        seeds = PROFILE_SEEDS[profile]
    if isinstance(seeds, numbers.Integral) and not isinstance(seeds, bool):
        seeds = list(range(int(seeds)))
    elif isinstance(seeds, (list, tuple)) and all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                                                  for s in seeds):
        seeds = [int(s) for s in seeds]
    else:
        raise ValueError(f"seeds must be None, an integer n >= 2 (seeds 0..n-1) or a list of integer seeds, "
                         f"got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat a seed, got {seeds}")
    if len(seeds) < 2:
        raise ValueError(f"seeds must name at least 2 seeds for a 95% interval, got {seeds}")
    return seeds


def stage1_config(config: dict) -> dict:
    cfg = train.complete_config({k: config[k] for k in train.STAGE1_KEYS if k in config})
    return {k: cfg[k] for k in train.STAGE1_KEYS}


def _source_path(cache_root, cfg, version) -> Path:
    return RunCache(cache_root, "source", version).path(cfg).with_suffix(".pt")


def stage1_pack(configs: list[dict], cache_root: str, version: str) -> list[dict]:
    """Train a pack of source backbones, save each state atomically, return summary rows."""
    outs = train.train_source(configs)
    rows = []
    for c, o in zip(configs, outs):
        buf = io.BytesIO()
        torch.save({"backbone": o["backbone"], "head_a": o["head_a"], "task_a_accuracy": o["task_a_accuracy"]}, buf)
        atomic_write_bytes(_source_path(cache_root, c, version), buf.getvalue())
        rows.append(dict(seed=c["seed"], source_task_a_accuracy=o["task_a_accuracy"], stage1_wall_s=o["wall_s"]))
    return rows


def load_source(cache_root, config: dict, version: str | None = None) -> dict:
    """The cached stage-1 result for ``config`` (state dicts and accuracy) under code ``version``.

    Raises ``FileNotFoundError`` if that source has not been trained (run
    :func:`run_transfer_sweep` first).
    """
    return torch.load(_source_path(cache_root, stage1_config(config), version or code_version()),
                      map_location="cpu", weights_only=True)


def transfer_pack(configs: list[dict], cache_root: str, version: str) -> list[dict]:
    """Stage 2 for a pack of configs, reading their source backbones from the cache."""
    return train.transfer(configs, [load_source(cache_root, c, version) for c in configs])


def _structural(keys_that_vary):
    def key(c):
        return {k: v for k, v in c.items() if k not in keys_that_vary}
    return key


def default_pack_size() -> int:
    """Data streams (distinct seed and shift) per packed network: 1 on a CPU, 16 on CUDA.

    Runs of the same seed and shift in different freeze modes always share a
    pack: they run in lockstep on the same batch tensors, one model per mode,
    which changes no number (:func:`bnstudy.train.transfer`). Packing several
    seeds into one grouped network is different: on this project's 2-core CPU
    it ran at 2.41 ms per model-step against 2.54 ms unpacked (5%), while packed
    and unpacked runs agree only to float rounding, which long training can
    amplify (at strong shifts a pinned-mode head's task-B accuracy moved by up to
    0.04 between pack sizes). So on a CPU each seed and shift is computed alone,
    and a run's numbers depend on its config only. On a GPU many small runs
    packed together use the device far better; there a run's numbers also
    depend on the packs it was computed in.
    """
    return 16 if torch.cuda.is_available() else 1


def transfer_packs(configs: list[dict], streams_per_pack: int) -> list[list[int]]:
    """Packs for stage 2: configs equal up to seed, shift and mode, ``streams_per_pack``
    distinct (seed, shift) streams per pack, every mode of a stream in the same pack."""
    if not isinstance(streams_per_pack, int) or streams_per_pack < 1:
        raise ValueError(f"pack_size must be a positive integer, got {streams_per_pack!r}")
    vary = train.REPLICA_KEYS + ("mode",)
    groups: dict = {}
    for i, c in enumerate(configs):
        struct = repr(sorted((k, v) for k, v in c.items() if k not in vary))
        stream = (c["seed"], float(c["brightness"]), float(c["contrast"]))
        groups.setdefault(struct, {}).setdefault(stream, []).append(i)
    packs = []
    for streams in groups.values():
        lists = list(streams.values())
        for j in range(0, len(lists), streams_per_pack):
            packs.append([i for idx in lists[j:j + streams_per_pack] for i in idx])
    return packs


def run_transfer_sweep(configs: list[dict], *, namespace: str, cache_dir=None, n_jobs=None,
                       pack_size: int | None = None, backend: str = "loky", progress: bool = True,
                       version: str | None = None) -> pd.DataFrame:
    """Stage 1 (cached per distinct source config) then stage 2 for every config; one row per config.

    ``pack_size`` (default :func:`default_pack_size`) counts seeds per stage-1
    pack and (seed, shift) streams per stage-2 pack; all freeze modes of a
    stream share its pack. Other arguments as in :func:`bnstudy.sweep.run_sweep`.
    """
    if pack_size is None:
        pack_size = default_pack_size()
    root = str(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    version = version or code_version()  # fixed for the whole sweep
    full = [train.complete_config(c) for c in configs]
    sources = list({repr(sorted(stage1_config(c).items())): stage1_config(c) for c in full}.values())
    run_sweep(sources, stage1_pack, namespace="source", cache_dir=root, pack_by=_structural(("seed",)),
              pack_size=pack_size, n_jobs=n_jobs, backend=backend, progress=progress, desc="stage 1 (source)",
              pack_kwargs={"cache_root": root, "version": version}, version=version)
    return run_sweep(full, transfer_pack, namespace=namespace, cache_dir=root, n_jobs=n_jobs,
                     backend=backend, progress=progress, desc=f"stage 2 ({namespace})",
                     pack_kwargs={"cache_root": root, "version": version}, version=version,
                     packs=transfer_packs(full, pack_size))


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and the two ends of a Student-t interval over ``values`` (e.g. seeds).

    Returns ``(mean, low, high)``; with one value (or all equal) the interval
    collapses to the mean.
    """
    v = np.asarray(values, dtype=float)
    m = float(v.mean())
    if len(v) < 2:
        return m, m, m
    half = float(sps.sem(v) * sps.t.ppf((1 + confidence) / 2, len(v) - 1)) if v.std() > 0 else 0.0
    return m, m - half, m + half


def summarize(df: pd.DataFrame, by, columns, confidence: float = 0.95) -> pd.DataFrame:
    """Mean and 95% t-interval over seeds of ``columns`` for each group ``by``: long table."""
    recs = []
    for key, g in df.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        for col in columns:
            m, lo, hi = mean_ci(g[col], confidence)
            recs.append(dict(zip([by] if isinstance(by, str) else by, key), metric=col, mean=m, ci_low=lo,
                             ci_high=hi, n_seeds=len(g)))
    return pd.DataFrame(recs)
