"""Chapter 3: where the crossover sits. Drifting BatchNorm statistics against shift strength.

Chapter 1 shows that the one-line freeze (``train_mode``) lets the backbone's
``running_mean``/``running_var`` drift to task B's statistics: that costs task A
and helps task B. This module measures both as the shift between the tasks
grows, in three line sweeps ("shift types"), each from no shift to beyond
chapter 1's default shift ``(b0, c0) = (DEFAULTS["brightness"], DEFAULTS["contrast"])``:

* ``brightness``: task-B inputs offset by ``b`` (contrast 1), strength ``b``;
* ``contrast``: task-B inputs multiplied by ``c`` (brightness 0), strength ``c``;
* ``both``: the straight path from no shift through chapter 1's shift, strength
  ``t`` with ``brightness = t * b0`` and ``contrast = 1 + t * (c0 - 1)``
  (``t = 1`` is chapter 1's shift);

plus a brightness x contrast grid for heatmaps, and a training-budget check:
a few points of the ``both`` line rerun with longer stage-2 training, because
the cost is settled once the running statistics have drifted (a few dozen
steps) while the benefit can depend on how far the new head has trained. Each
distinct ``(seed, mode, brightness, contrast, steps)`` runs once (the no-shift
point is shared by all three lines), through
:func:`bnstudy.experiments.common.run_transfer_sweep`.

Within a seed, every mode and shift level starts from the same trained
backbone, head-B initialisation and task-B batch stream, so the effects are
paired differences per seed (:func:`paired_effects`)::

    cost    = task_a_after(pinned) - task_a_after(train_mode)
    benefit = task_b(train_mode)   - task_b(pinned)

with ``pinned = "backbone_eval"`` by default (with a linear head ``all_eval``
computes the same function). Every run also carries the statistics mismatch
between its source backbone's stored statistics and its task-B data
(:func:`bnstudy.stats.statistics_mismatch`), which needs no training.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .. import train
from ..freeze import MODE_NAMES, get_mode
from ..models import ConvBackbone
from ..stats import bn_input_statistics, mismatch_from_statistics
from ..sweep import code_version, default_cache_dir, run_sweep
from ..tasks import BatchStream, generator, make_task
from .common import load_source, run_transfer_sweep, seeds_for, stage1_config

NAMESPACE = "ch03_shift_strength"
MISMATCH_NAMESPACE = "ch03_mismatch"
SHIFT_TYPES = ("brightness", "contrast", "both")
PINNED_MODES = ("backbone_eval", "all_eval")
#: Chapter 1's shift, the ``t = 1`` point of the ``both`` line: ``(brightness, contrast)``.
REFERENCE_SHIFT = (float(train.DEFAULTS["brightness"]), float(train.DEFAULTS["contrast"]))

#: Default sweep sizes (the notebook's ``full`` profile; ``quick`` passes smaller ones).
DEFAULT_LEVELS = {
    "brightness": (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 4.0, 6.0),
    "contrast": (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0),
    "both": (0.0, 0.0625, 0.125, 0.25, 0.375, 0.5, 1.0, 1.5),
}
DEFAULT_GRID = {"brightness": (0.0, 1.0, 2.0, 4.0), "contrast": (1.0, 2.0, 3.0, 5.0)}
GRID_MODES = ("train_mode", "backbone_eval")
#: Training-budget check: strengths on the ``both`` line, rerun with these stage-2 step counts.
DEFAULT_BUDGET_LEVELS = (0.25, 1.0)
DEFAULT_BUDGET_STEPS = (800, 1600)
#: Batches (of ``batch_size`` task-B images) the mismatch measure sees per run.
MISMATCH_BATCHES = 8

RUN_KEYS = ("profile", "seeds", "cache_dir", "n_jobs", "pack_size", "progress", "backend",
            "brightness_levels", "contrast_levels", "both_levels", "grid_brightness", "grid_contrast",
            "line_modes", "grid_modes", "mismatch_batches", "budget_levels", "budget_steps")
SWEPT_KEYS = ("seed", "mode", "brightness", "contrast")
#: What identifies a run apart from its mode: the keys paired comparisons match on.
PAIR_KEYS = ("seed", "brightness", "contrast", "steps")


def shift_of(shift_type: str, strength: float) -> tuple[float, float]:
    """``(brightness, contrast)`` of a point at ``strength`` on the line ``shift_type``.

    Raises ``ValueError`` for an unknown shift type or a strength that gives a
    non-positive contrast.
    """
    if shift_type not in SHIFT_TYPES:
        raise ValueError(f"shift_type={shift_type!r} is not allowed; choose one of {list(SHIFT_TYPES)}")
    s = float(strength)
    if shift_type == "brightness":
        b, c = s, 1.0
    elif shift_type == "contrast":
        b, c = 0.0, s
    else:
        b0, c0 = REFERENCE_SHIFT
        b, c = s * b0, 1.0 + s * (c0 - 1.0)
    if not c > 0:
        raise ValueError(f"strength={strength!r} on the {shift_type} line gives contrast {c}; contrast must be > 0")
    return _r(b), _r(c)


def _r(v: float) -> float:
    # Shift values are keys (cache, pairing, line membership): round away float noise from t * b0.
    return round(float(v), 9)


def _check_levels(name: str, levels, shift_type: str | None = None) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in levels)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of numbers, got {levels!r}") from None
    if len(out) < 2:
        raise ValueError(f"{name} needs at least 2 levels, got {levels!r}")
    if any(not math.isfinite(v) for v in out) or list(out) != sorted(set(out)):
        raise ValueError(f"{name} must be finite, strictly increasing numbers, got {levels!r}")
    if shift_type is not None:
        for v in out:
            shift_of(shift_type, v)
    return out


def _check_modes(name: str, modes) -> tuple[str, ...]:
    modes = tuple(modes)
    if not modes:
        raise ValueError(f"{name} must name at least one freeze mode; choose from {list(MODE_NAMES)}")
    for m in modes:
        get_mode(m)
    return modes


def make_configs(seeds, levels: dict | None = None, grid: dict | None = None, line_modes=MODE_NAMES,
                 grid_modes=GRID_MODES, **overrides) -> list[dict]:
    """One complete run config per distinct ``(seed, mode, brightness, contrast)``.

    The concatenation of :func:`make_config_blocks`; see there for the arguments.
    """
    return [c for block in make_config_blocks(seeds, levels, grid, line_modes, grid_modes, **overrides)
            for c in block]


def make_config_blocks(seeds, levels: dict | None = None, grid: dict | None = None, line_modes=MODE_NAMES,
                       grid_modes=GRID_MODES, **overrides) -> list[list[dict]]:
    """The sweep's run configs in blocks: ``[line points x line_modes, remaining grid points x grid_modes]``.

    ``levels``: ``{shift_type: strengths}`` for the line sweeps (default
    :data:`DEFAULT_LEVELS`; a missing type is not swept); ``grid``:
    ``{"brightness": values, "contrast": values}`` for the heatmaps (default
    :data:`DEFAULT_GRID`; ``{}`` for none). Every ``(seed, mode, brightness,
    contrast)`` appears once. Within a block each mode lists the same
    ``(seed, shift)`` sequence (mode, then seed, then shift), so when a block is
    swept on its own every mode gets the same pack compositions. That matters:
    a packed run's numbers can differ by floating-point rounding from the same
    run packed with other replicas (grouped convolutions and batched products of
    another size), and a training run in a chaotic regime amplifies the
    rounding; with equal packs, modes that compute the same function give
    bit-identical results. ``overrides`` are :data:`bnstudy.train.DEFAULTS` keys
    other than the swept ones. Raises ``ValueError`` for unknown modes, shift
    types, bad levels or a swept key in ``overrides``.
    """
    levels = DEFAULT_LEVELS if levels is None else levels
    grid = DEFAULT_GRID if grid is None else grid
    bad = set(overrides) & set(SWEPT_KEYS)
    if bad:
        raise ValueError(f"{sorted(bad)} are swept by this experiment; set the levels instead")
    for t in levels:
        if t not in SHIFT_TYPES:
            raise ValueError(f"levels has shift type {t!r}; choose from {list(SHIFT_TYPES)}")
    line_modes, grid_modes = _check_modes("line_modes", line_modes), _check_modes("grid_modes", grid_modes)
    line_points: dict[tuple[float, float], None] = {}
    for t, ls in levels.items():
        for s in _check_levels(f"levels[{t!r}]", ls, t):
            line_points[shift_of(t, s)] = None
    grid_points: dict[tuple[float, float], None] = {}
    if grid:
        if set(grid) != {"brightness", "contrast"}:
            raise ValueError(f"grid must have exactly the keys 'brightness' and 'contrast', got {sorted(grid)}")
        for b in _check_levels("grid['brightness']", grid["brightness"], "brightness"):
            for c in _check_levels("grid['contrast']", grid["contrast"], "contrast"):
                grid_points[(_r(b), _r(c))] = None
    seeds = list(seeds)

    def block(points, modes, skip=frozenset()):
        return [train.complete_config({**overrides, "seed": s, "mode": m, "brightness": b, "contrast": c})
                for m in MODE_NAMES if m in modes for s in seeds for (b, c) in points if ((b, c), m) not in skip]

    done = {(p, m) for p in line_points for m in line_modes}
    blocks = [block(line_points, line_modes), block(grid_points, grid_modes, done)]
    return [b for b in blocks if b]


def make_budget_configs(seeds, levels=DEFAULT_BUDGET_LEVELS, steps=DEFAULT_BUDGET_STEPS, modes=GRID_MODES,
                        **overrides) -> list[dict]:
    """Configs of the training-budget check: each ``both``-line strength in ``levels`` x each
    stage-2 step count in ``steps`` x ``modes`` x seeds. Raises ``ValueError`` as :func:`make_configs`,
    or for a non-positive step count."""
    bad = set(overrides) & (set(SWEPT_KEYS) | {"steps"})
    if bad:
        raise ValueError(f"{sorted(bad)} are swept by this experiment; set the levels instead")
    levels = tuple(float(v) for v in levels)
    for v in levels:
        shift_of("both", v)
    for n in steps:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"budget_steps must be positive integers, got {list(steps)!r}")
    modes = _check_modes("budget modes", modes)
    return [train.complete_config({**overrides, "seed": s, "mode": m, "steps": n,
                                   "brightness": shift_of("both", t)[0], "contrast": shift_of("both", t)[1]})
            for m in modes for n in steps for s in seeds for t in levels]


# --- the statistics mismatch of each run -------------------------------------------------------------------------

def mismatch_config(config: dict, n_batches: int = MISMATCH_BATCHES) -> dict:
    """The part of a run config the mismatch measure depends on (its cache key)."""
    cfg = train.complete_config(config)
    return {**stage1_config(cfg), "brightness": cfg["brightness"], "contrast": cfg["contrast"],
            "batch_size": cfg["batch_size"], "mismatch_batches": n_batches}


def mismatch_batches(config: dict) -> list[torch.Tensor]:
    """``config["mismatch_batches"]`` unlabelled task-B batches ``(batch_size, 3, 32, 32)`` of ``config``'s seed and shift.

    Drawn from their own generator (``seed, "mismatch", "B"``), so the same
    images, shifted differently, serve every shift level of a seed.
    """
    task = make_task(config["seed"], "B", config["n_classes"], config["noise"], config["brightness"], config["contrast"])
    stream = BatchStream(task, config["batch_size"], generator(config["seed"], "mismatch", "B"))
    return [stream.next()[0] for _ in range(config["mismatch_batches"])]


def source_backbone(cache_root, config: dict, version: str | None = None) -> ConvBackbone:
    """The trained (stage-1) backbone of ``config``'s seed, single replica, in eval mode."""
    cfg = train.complete_config({k: v for k, v in config.items() if k in train.STAGE1_KEYS})
    backbone = ConvBackbone(3, cfg["widths"], cfg["norm"], 1, cfg["momentum"])
    backbone.load_state_dict(load_source(cache_root, cfg, version)["backbone"])
    return backbone.eval()


def mismatch_row(backbone: torch.nn.Module, batches: list[torch.Tensor]) -> dict:
    """The mismatch columns of one run: Gaussian KL (eval and train pass) and standardised mean shift.

    ``mismatch_kl`` (the chapter's measure): mean over BN layers of the
    per-layer, channel-averaged ``KL(new || stored)`` in the eval pass (what the
    frozen, deployed backbone sees); ``mismatch_kl_l<i>``: per layer;
    ``mismatch_mean_shift``: mean over layers of the standardised mean shift
    (eval pass); ``mismatch_kl_train``: the KL in the train pass, i.e. against
    the statistics a ``train_mode`` freeze drifts to.
    """
    row = {}
    stats_eval = bn_input_statistics(backbone, batches, "eval")
    kl = mismatch_from_statistics(backbone, stats_eval, "kl")
    row["mismatch_kl"] = float(np.mean(list(kl.values())))
    for i, v in enumerate(kl.values()):
        row[f"mismatch_kl_l{i}"] = v
    row["mismatch_mean_shift"] = float(np.mean(list(mismatch_from_statistics(backbone, stats_eval, "mean_shift").values())))
    kl_train = mismatch_from_statistics(backbone, bn_input_statistics(backbone, batches, "train"), "kl")
    row["mismatch_kl_train"] = float(np.mean(list(kl_train.values())))
    return row


def mismatch_pack(configs: list[dict], cache_root: str, version: str | None = None) -> list[dict]:
    """Mismatch rows for a list of :func:`mismatch_config` configs (a :func:`bnstudy.sweep.run_sweep` pack)."""
    rows, backbones = [], {}
    for c in configs:
        key = repr(sorted(stage1_config(c).items()))
        if key not in backbones:
            backbones[key] = source_backbone(cache_root, c, version)
        rows.append(mismatch_row(backbones[key], mismatch_batches(c)))
    return rows


def _seed_key(c: dict):
    return c["seed"]


def _run_key(c: dict) -> tuple:
    return tuple(c[k] for k in ("mode",) + PAIR_KEYS)


# --- the experiment -----------------------------------------------------------------------------------------------

def run(config: dict | None = None) -> pd.DataFrame:
    """Run chapter 3's sweep; one row per distinct ``(seed, mode, brightness, contrast, steps)``.

    ``config`` may hold ``profile`` (``quick`` | ``full``), ``seeds`` (count or
    list; default by profile), ``brightness_levels`` / ``contrast_levels`` /
    ``both_levels`` (line strengths, default :data:`DEFAULT_LEVELS`; an empty
    sequence skips that line), ``grid_brightness`` / ``grid_contrast`` (heatmap
    axes, default :data:`DEFAULT_GRID`; both empty: no grid), ``line_modes``
    (default all four), ``grid_modes`` (default :data:`GRID_MODES`),
    ``mismatch_batches`` (default :data:`MISMATCH_BATCHES`), ``budget_levels``
    and ``budget_steps`` (the training-budget check, default
    :data:`DEFAULT_BUDGET_LEVELS` x :data:`DEFAULT_BUDGET_STEPS`; empty: none),
    ``cache_dir``,
    ``n_jobs``, ``pack_size``, ``backend``, ``progress``, and any key of
    :data:`bnstudy.train.DEFAULTS` except the swept ``seed``, ``mode``,
    ``brightness`` and ``contrast``.

    Columns: those of :func:`bnstudy.train.transfer`; the mismatch columns of
    :func:`mismatch_row`; ``on_brightness`` / ``on_contrast`` / ``on_both``
    (whether the run's shift is one of that line's levels), ``both_strength``
    (``t`` where the shift is a level of the ``both`` line or of the budget check,
    NaN elsewhere), ``in_grid``, and ``part``: ``"main"`` for runs
    with the sweep's ``steps``, ``"budget"`` for the budget check's other step counts.
    Raises ``ValueError`` for an unknown key, mode, profile or shift type, or bad levels.
    """
    config = dict(config or {})
    unknown = set(config) - set(RUN_KEYS) - set(train.DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(RUN_KEYS + tuple(train.DEFAULTS))}")
    seeds = seeds_for(config.get("profile", "quick"), config.get("seeds"))
    levels = {t: config.get(f"{t}_levels", DEFAULT_LEVELS[t]) for t in SHIFT_TYPES}
    levels = {t: v for t, v in levels.items() if len(v)}
    gb, gc = config.get("grid_brightness", DEFAULT_GRID["brightness"]), config.get("grid_contrast", DEFAULT_GRID["contrast"])
    if bool(len(gb)) != bool(len(gc)):
        raise ValueError("grid_brightness and grid_contrast must both be given or both be empty")
    grid = {"brightness": gb, "contrast": gc} if len(gb) else {}
    n_batches = config.get("mismatch_batches", MISMATCH_BATCHES)
    if not isinstance(n_batches, int) or isinstance(n_batches, bool) or n_batches < 1:
        raise ValueError(f"mismatch_batches must be a positive integer, got {n_batches!r}")
    overrides = {k: v for k, v in config.items() if k in train.DEFAULTS}
    blocks = make_config_blocks(seeds, levels, grid, config.get("line_modes", MODE_NAMES),
                                config.get("grid_modes", GRID_MODES), **overrides)
    if not blocks:
        raise ValueError("nothing to run: every line's levels and the grid are empty")
    cfgs = [c for b in blocks for c in b]
    main_steps = cfgs[0]["steps"]
    b_steps = tuple(config.get("budget_steps", DEFAULT_BUDGET_STEPS))
    b_levels = tuple(config.get("budget_levels", DEFAULT_BUDGET_LEVELS))
    if b_steps and b_levels:
        # The budget check compares step counts at the same points, the sweep's own steps included.
        seen = {_run_key(c) for c in cfgs}
        budget = [c for c in make_budget_configs(seeds, b_levels, tuple(sorted({main_steps, *b_steps})), GRID_MODES,
                                                 **{k: v for k, v in overrides.items() if k != "steps"})
                  if _run_key(c) not in seen]
        if budget:
            blocks.append(budget)
            cfgs += budget
    version = code_version()  # one code version for every cache key of this run
    sweep_kw = dict(cache_dir=config.get("cache_dir"), n_jobs=config.get("n_jobs"),
                    backend=config.get("backend", "loky"), progress=config.get("progress", True), version=version)
    # One sweep per block, so that every mode in a block is packed alike (see make_config_blocks).
    df = pd.concat([run_transfer_sweep(b, namespace=NAMESPACE, pack_size=config.get("pack_size"), **sweep_kw)
                    for b in blocks], ignore_index=True)

    # The mismatch needs only the cached source backbones (stage 1 ran above) and unlabelled task-B images.
    root = str(sweep_kw["cache_dir"] if sweep_kw["cache_dir"] is not None else default_cache_dir())
    mcfgs = list({repr(sorted(mismatch_config(c, n_batches).items())): mismatch_config(c, n_batches)
                  for c in cfgs}.values())
    mm = run_sweep(mcfgs, mismatch_pack, namespace=MISMATCH_NAMESPACE, cache_dir=root, pack_by=_seed_key,
                   pack_size=64, n_jobs=sweep_kw["n_jobs"], backend=sweep_kw["backend"],
                   progress=sweep_kw["progress"], desc="statistics mismatch",
                   pack_kwargs={"cache_root": root, "version": version}, version=version)
    mm = pd.concat([pd.DataFrame([{k: c[k] for k in ("seed", "brightness", "contrast")} for c in mcfgs]), mm], axis=1)
    df = df.merge(mm, on=["seed", "brightness", "contrast"], how="left", validate="many_to_one")

    pts = {t: {shift_of(t, s): s for s in ls} for t, ls in levels.items()}
    key = list(zip(df["brightness"].map(_r), df["contrast"].map(_r)))
    for t in SHIFT_TYPES:
        df[f"on_{t}"] = [k in pts.get(t, {}) for k in key]
    on_path = {**{shift_of("both", s): s for s in (b_levels if b_steps else ())}, **pts.get("both", {})}
    df["both_strength"] = [on_path.get(k, math.nan) for k in key]
    gpts = {(_r(b), _r(c)) for b in grid.get("brightness", ()) for c in grid.get("contrast", ())}
    df["in_grid"] = [k in gpts for k in key]
    df["part"] = np.where(df["steps"] == main_steps, "main", "budget")
    return df


# --- analysis: paired effects, lines, crossover -------------------------------------------------------------------

def paired_effects(df: pd.DataFrame, pinned: str = "backbone_eval") -> pd.DataFrame:
    """Cost and benefit of drifting statistics, paired within each ``(seed, brightness, contrast)``.

    ``df``: run rows with ``seed``, ``brightness``, ``contrast``, ``mode``,
    ``task_a_before``, ``task_a_after``, ``task_b`` (accuracies, fractions 0..1)
    and, if present, ``steps`` (runs pair only with runs of the same step count).
    Returns one row per ``(seed, brightness, contrast[, steps])`` that has both a
    ``train_mode`` and a ``pinned`` run: ``cost = task_a_after(pinned) -
    task_a_after(train_mode)``, ``benefit = task_b(train_mode) - task_b(pinned)``,
    ``net = benefit - cost`` (accuracy fractions; positive net means drifting
    pays), the accuracies behind them, and every other column of the
    ``train_mode`` row that is constant across modes (mismatch, line flags).
    Raises ``ValueError`` if ``pinned`` is not a pinned mode or no pair exists.
    """
    if pinned not in PINNED_MODES:
        raise ValueError(f"pinned={pinned!r} is not allowed; choose one of {list(PINNED_MODES)}")
    keys = [k for k in PAIR_KEYS if k in df.columns]
    tm = df[df["mode"] == "train_mode"].set_index(keys)
    pn = df[df["mode"] == pinned].set_index(keys)
    both = tm.index.intersection(pn.index)
    if len(both) == 0:
        raise ValueError(f"paired_effects needs train_mode and {pinned} runs at the same (seed, brightness, contrast)")
    tm, pn = tm.loc[both], pn.loc[both]
    shared = [c for c in tm.columns if c.startswith("mismatch_") or c.startswith("on_") or
              c in ("both_strength", "in_grid", "task_a_before", "part")]
    out = tm[shared].copy()
    out["task_a_after_train_mode"] = tm["task_a_after"]
    out["task_a_after_pinned"] = pn["task_a_after"]
    out["task_b_train_mode"] = tm["task_b"]
    out["task_b_pinned"] = pn["task_b"]
    out["cost"] = pn["task_a_after"] - tm["task_a_after"]
    out["benefit"] = tm["task_b"] - pn["task_b"]
    out["net"] = out["benefit"] - out["cost"]
    out["pinned"] = pinned
    return out.reset_index()


def strength_of(effects: pd.DataFrame, shift_type: str) -> pd.Series:
    """The strength of each row on ``shift_type``'s line (NaN off the line)."""
    if shift_type not in SHIFT_TYPES:
        raise ValueError(f"shift_type={shift_type!r} is not allowed; choose one of {list(SHIFT_TYPES)}")
    on = effects[f"on_{shift_type}"].astype(bool)
    s = {"brightness": effects["brightness"], "contrast": effects["contrast"], "both": effects["both_strength"]}[shift_type]
    return s.where(on)


def line_matrix(effects: pd.DataFrame, shift_type: str, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(strengths (L,), seeds (S,), values (S, L))`` of ``column`` along a line, seeds as rows.

    Raises ``ValueError`` if a seed lacks a level (the bootstrap needs complete, paired rows).
    """
    s = strength_of(effects, shift_type)
    sub = effects.assign(strength=s).dropna(subset=["strength"])
    wide = sub.pivot_table(index="seed", columns="strength", values=column, aggfunc="first")
    if wide.isna().any().any():
        raise ValueError(f"line {shift_type!r}: some seeds lack some levels of {column!r}")
    return wide.columns.to_numpy(float), wide.index.to_numpy(), wide.to_numpy(float)


def first_crossing(strength, cost_mean, benefit_mean, min_effect: float = 0.01) -> float:
    """The weakest strength where the mean ``benefit - cost`` changes sign; NaN if it never does.

    Levels where both ``|cost|`` and ``|benefit|`` are below ``min_effect``
    (accuracy fraction) are ties, not evidence for either side, and are skipped:
    otherwise two curves that both sit at zero for weak shifts would "cross" at
    every wobble of evaluation noise. Between the two resolved levels that
    bracket a sign change the crossing is found by linear interpolation of
    ``benefit - cost``.
    """
    x = np.asarray(strength, float)
    c, b = np.asarray(cost_mean, float), np.asarray(benefit_mean, float)
    keep = (np.abs(c) >= min_effect) | (np.abs(b) >= min_effect)
    x, d = x[keep], (b - c)[keep]
    for i in range(len(d) - 1):
        if d[i] == 0:
            return float(x[i])
        if d[i] * d[i + 1] < 0:
            return float(x[i] + (x[i + 1] - x[i]) * d[i] / (d[i] - d[i + 1]))
    if len(d) and d[-1] == 0:
        return float(x[-1])
    return math.nan


def crossover(strength, cost, benefit, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
              min_effect: float = 0.01) -> dict:
    """The crossover strength of the cost and benefit curves, with a bootstrap interval over seeds.

    ``strength (L,)`` increasing; ``cost (S, L)`` and ``benefit (S, L)``:
    per-seed paired effects (rows are seeds, the same seed in both). The point
    estimate is :func:`first_crossing` of the mean curves. The interval resamples
    seeds with replacement ``n_boot`` times (numpy ``default_rng(seed)``; cost and
    benefit resampled together, keeping the pairing) and takes the percentile
    interval of the crossings of the resampled mean curves, among the resamples
    that cross at all.

    Returns ``estimate``, ``ci_low``, ``ci_high`` (NaN where undefined),
    ``p_cross`` (fraction of resamples whose curves cross), ``n_boot``,
    ``dominant`` (``"cost"`` or ``"benefit"``: which mean curve is higher at the
    strongest level), ``first_resolved`` (the weakest strength where either mean
    reaches ``min_effect``; NaN if none) and ``min_effect``.
    Raises ``ValueError`` for mismatched shapes, fewer than 2 seeds or levels,
    ``n_boot < 1`` or ``confidence`` outside (0, 1).
    """
    x = np.asarray(strength, float)
    c, b = np.asarray(cost, float), np.asarray(benefit, float)
    if c.ndim != 2 or c.shape != b.shape or c.shape[1] != len(x):
        raise ValueError(f"cost and benefit must both be (seeds, levels) with levels = len(strength) = {len(x)}; "
                         f"got {c.shape} and {b.shape}")
    if c.shape[0] < 2 or len(x) < 2:
        raise ValueError(f"crossover needs at least 2 seeds and 2 levels, got {c.shape}")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if np.any(np.diff(x) <= 0):
        raise ValueError("strength must be strictly increasing")
    cm, bm = c.mean(0), b.mean(0)
    est = first_crossing(x, cm, bm, min_effect)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, c.shape[0], size=(n_boot, c.shape[0]))
    boots = np.array([first_crossing(x, c[i].mean(0), b[i].mean(0), min_effect) for i in idx])
    crossed = boots[~np.isnan(boots)]
    alpha = (1 - confidence) / 2
    lo, hi = (np.quantile(crossed, [alpha, 1 - alpha]) if len(crossed) else (math.nan, math.nan))
    resolved = x[(np.abs(cm) >= min_effect) | (np.abs(bm) >= min_effect)]
    return dict(estimate=est, ci_low=float(lo), ci_high=float(hi), p_cross=float(len(crossed) / n_boot),
                n_boot=n_boot, dominant="cost" if cm[-1] >= bm[-1] else "benefit",
                first_resolved=float(resolved[0]) if len(resolved) else math.nan, min_effect=min_effect)


def mode_effects(df: pd.DataFrame, reference: str = "backbone_eval") -> pd.DataFrame:
    """Per run: ``task_a_change = task_a_after - task_a_before`` and ``task_b_gain``
    (``task_b`` minus ``task_b`` of ``reference`` at the same seed and shift), for the
    retention-versus-adaptation scatter. Rows without a ``reference`` run are dropped.
    Raises ``ValueError`` for an unknown ``reference`` mode.
    """
    get_mode(reference)
    keys = [k for k in PAIR_KEYS if k in df.columns]
    ref = df[df["mode"] == reference].set_index(keys)["task_b"].rename("task_b_reference")
    out = df.join(ref, on=keys, how="inner")
    out["task_a_change"] = out["task_a_after"] - out["task_a_before"]
    out["task_b_gain"] = out["task_b"] - out["task_b_reference"]
    return out
