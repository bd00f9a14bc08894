"""Chapter 3: where the crossover sits. Drifting BatchNorm statistics against shift strength.

Chapter 1 shows that the one-line freeze (``train_mode``) lets the backbone's
``running_mean``/``running_var`` drift to task B's statistics: that costs task A and helps
task B. This module measures both as the shift between the tasks grows, along three lines
("shift types"), each from no shift to beyond chapter 1's shift ``REFERENCE_SHIFT = (b0, c0)``:

* ``brightness``: task-B inputs offset by ``b`` (contrast 1), strength ``b``;
* ``contrast``: task-B inputs multiplied by ``c`` (brightness 0), strength ``c``;
* ``both``: strength ``t`` with ``brightness = t * b0`` and ``contrast = 1 + t * (c0 - 1)``
  (``t = 1`` is chapter 1's shift);

plus a brightness x contrast grid for heatmaps and a training-budget check (points of the
``both`` line rerun with longer stage-2 training). Each distinct ``(seed, mode, brightness,
contrast, steps)`` runs once, through :func:`bnstudy.engine.transfer_sweep`; every run also
carries the statistics mismatch between its source backbone's stored statistics and its
task-B data (:func:`bnstudy.stats.mismatch_from_statistics`), which needs no training.

Within a seed every mode and shift starts from the same trained backbone, head-B
initialisation and task-B batch stream, so effects are paired differences per seed
(:func:`paired_effects`)::

    cost    = task_a_after(pinned) - task_a_after(train_mode)
    benefit = task_b(train_mode)   - task_b(pinned)

with ``pinned = "backbone_eval"``. ``Config`` -> :func:`run` -> results table ->
:func:`findings` (every number and verdict the chapter's prose cites) and the tidy figure
tables :func:`line_table`, :func:`budget_table`, :func:`grid_table`, :func:`condition_table`,
:func:`scatter_table`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import stats as sps

from ..analysis import Interval, mean_ci
from ..config import Execution, RunConfig, SourceConfig, _Frozen, check_choice, check_float, check_int, \
    check_seeds, check_sequence, from_profile, seeds_label
from ..engine import load_source, transfer_sweep
from ..models import ConvBackbone
from ..modes import MODE_NAMES
from ..stats import bn_input_statistics, mismatch_from_statistics
from ..sweep import code_version, default_cache_dir, run_sweep
from ..tasks import BatchStream, generator, make_task

NAMESPACE = "ch03_shift_strength"
MISMATCH_NAMESPACE = "ch03_mismatch"
SHIFT_TYPES = ("brightness", "contrast", "both")
PINNED_MODES = ("backbone_eval", "all_eval")
#: Modes the grid and the budget check run (all the cost and benefit need).
GRID_MODES = ("train_mode", "backbone_eval")
#: Chapter 1's shift, the ``t = 1`` point of the ``both`` line, and its stage-2 steps (RunConfig's defaults).
REFERENCE_SHIFT = (RunConfig.brightness, RunConfig.contrast)
CH1_STEPS = RunConfig.steps
#: What identifies a run apart from its mode: the keys paired comparisons match on.
PAIR_KEYS = ("seed", "brightness", "contrast", "steps")
EFFECTS = ("cost", "benefit", "net")
#: Each line's axis label and where chapter 1's shift sits on it (figures).
LINE_XLABELS = {"brightness": "brightness offset b (contrast 1)", "contrast": "contrast gain c (brightness 0)",
                "both": f"strength t (b = {REFERENCE_SHIFT[0]:g}t, c = 1 + {REFERENCE_SHIFT[1] - 1:g}t)"}
REFERENCE_STRENGTH = {"brightness": REFERENCE_SHIFT[0], "contrast": REFERENCE_SHIFT[1], "both": 1.0}

#: The profiles' sweep sizes (the only place they are set). quick: 144 runs, about a minute on
#: 2 cores; full: 1,080 runs, measured at 10.1 min of wall time on 2 cores from an empty cache.
PROFILES = {
    "quick": dict(seeds=3, steps=100, brightness_levels=(0.0, 1.0, 2.0, 4.0), contrast_levels=(1.0, 1.5, 2.0, 5.0),
                  both_levels=(0.0, 0.25, 0.5, 1.0), grid_brightness=(0.0, 2.0, 4.0), grid_contrast=(1.0, 2.0, 5.0),
                  budget_levels=(1.0,), budget_steps=(300,)),
    "full": dict(seeds=10, steps=300, brightness_levels=(0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 4.0, 6.0),
                 contrast_levels=(1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0),
                 both_levels=(0.0, 0.0625, 0.125, 0.25, 0.375, 0.5, 1.0, 1.5),
                 grid_brightness=(0.0, 1.0, 2.0, 4.0), grid_contrast=(1.0, 2.0, 3.0, 5.0),
                 budget_levels=(0.25, 1.0), budget_steps=(800, 1600)),
}


def _r(v: float) -> float:
    # Shift values are keys (cache, pairing, line membership): round away float noise from t * b0.
    return round(float(v), 9)


def shift_of(shift_type: str, strength: float) -> tuple[float, float]:
    """``(brightness, contrast)`` of the point at ``strength`` on the line ``shift_type``.

    Raises ``ValueError`` for an unknown shift type or a strength that gives a non-positive contrast.
    """
    check_choice("shift_type", shift_type, SHIFT_TYPES)
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


def _levels(name: str, value, shift_type: str) -> tuple[float, ...]:
    """Strictly increasing, finite levels valid on ``shift_type``'s line; empty (skip) or at least 2."""
    out = check_sequence(name, value, check_float)
    if len(out) == 1:
        raise ValueError(f"{name} needs at least 2 levels (or none, to skip it), got {list(out)!r}")
    if list(out) != sorted(set(out)):
        raise ValueError(f"{name} must be strictly increasing, got {list(out)!r}")
    for v in out:
        try:
            shift_of(shift_type, v)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    return out


def _modes(name: str, value) -> tuple[str, ...]:
    modes = check_sequence(name, value, lambda n, v: check_choice(n, v, MODE_NAMES), 1)
    missing = [m for m in GRID_MODES if m not in modes]
    if missing:
        raise ValueError(f"{name} must include {list(GRID_MODES)} (cost and benefit compare them), got {list(modes)}")
    return modes


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 3's parameters (the notebook's parameters cell, one for one, and a few run sizes).

    Profile-sized (no defaults; :data:`PROFILES` sets them): ``seeds``; ``steps`` (stage-2 steps of
    the sweep); ``brightness_levels`` / ``contrast_levels`` / ``both_levels`` (strengths on each line,
    strictly increasing, an empty list skips the line); ``grid_brightness`` / ``grid_contrast`` (the
    heatmap axes, both empty: no grid); ``budget_levels`` (``both``-line strengths of the budget check)
    and ``budget_steps`` (its longer step counts; either empty: no check). Others: ``line_modes`` and
    ``grid_modes`` (must include ``train_mode`` and ``backbone_eval``), ``mismatch_batches`` (unlabelled
    task-B batches per mismatch measurement), ``n_boot`` and ``min_effect`` (the crossover's bootstrap
    and tie tolerance, accuracy fraction), and the run sizes ``noise``, ``momentum``, ``widths``,
    ``batch_size``, ``stage1_steps``, ``stage1_batch_size``, ``n_eval`` (defaults: :class:`RunConfig`'s).
    Raises ``ValueError`` naming the parameter for any bad value, before any work starts.
    """

    profile: str
    seeds: tuple
    steps: int
    brightness_levels: tuple
    contrast_levels: tuple
    both_levels: tuple
    grid_brightness: tuple
    grid_contrast: tuple
    budget_levels: tuple
    budget_steps: tuple
    line_modes: tuple = MODE_NAMES
    grid_modes: tuple = GRID_MODES
    mismatch_batches: int = 8
    n_boot: int = 2000
    min_effect: float = 0.01
    noise: float = RunConfig.noise
    momentum: float | None = RunConfig.momentum
    widths: tuple = RunConfig.widths
    batch_size: int = RunConfig.batch_size
    stage1_steps: int = RunConfig.stage1_steps
    stage1_batch_size: int = RunConfig.stage1_batch_size
    n_eval: int = RunConfig.n_eval

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("steps", check_int("steps", self.steps, 1))
        for t in SHIFT_TYPES:
            self._set(f"{t}_levels", _levels(f"{t}_levels", getattr(self, f"{t}_levels"), t))
        self._set("grid_brightness", _levels("grid_brightness", self.grid_brightness, "brightness"))
        self._set("grid_contrast", _levels("grid_contrast", self.grid_contrast, "contrast"))
        if bool(self.grid_brightness) != bool(self.grid_contrast):
            raise ValueError("grid_brightness and grid_contrast must both be given or both be empty")
        bl = check_sequence("budget_levels", self.budget_levels, check_float)
        for v in bl:
            try:
                shift_of("both", v)
            except ValueError as e:
                raise ValueError(f"budget_levels: {e}") from None
        if len(set(bl)) != len(bl):
            raise ValueError(f"budget_levels must not repeat a level, got {list(bl)}")
        self._set("budget_levels", bl)
        self._set("budget_steps", check_sequence("budget_steps", self.budget_steps, lambda n, v: check_int(n, v, 1)))
        self._set("line_modes", _modes("line_modes", self.line_modes))
        self._set("grid_modes", _modes("grid_modes", self.grid_modes))
        self._set("mismatch_batches", check_int("mismatch_batches", self.mismatch_batches, 1))
        self._set("n_boot", check_int("n_boot", self.n_boot, 1))
        self._set("min_effect", check_float("min_effect", self.min_effect, 0.0))
        self._set("widths", check_sequence("widths", self.widths, lambda n, v: check_int(n, v, 1), 1))
        RunConfig(**self._base())  # noise, momentum, sizes: checked with the engine's own messages
        if not self.points():
            raise ValueError("nothing to run: every line's levels and the grid are empty")

    def _base(self) -> dict:
        return dict(noise=self.noise, momentum=self.momentum, widths=self.widths, batch_size=self.batch_size,
                    stage1_steps=self.stage1_steps, stage1_batch_size=self.stage1_batch_size, n_eval=self.n_eval)

    def levels(self) -> dict[str, tuple]:
        """``{shift_type: strengths}`` of the lines that run."""
        return {t: getattr(self, f"{t}_levels") for t in SHIFT_TYPES if getattr(self, f"{t}_levels")}

    def points(self) -> dict[tuple, set]:
        """``{(brightness, contrast, steps): modes}``: every distinct run point and the modes it needs.

        Line points run ``line_modes``, grid points ``grid_modes``, budget points :data:`GRID_MODES` at
        the sweep's steps and each budget step count; a point on several runs the union, once.
        """
        pts: dict[tuple, set] = {}
        for t, ls in self.levels().items():
            for s in ls:
                pts.setdefault((*shift_of(t, s), self.steps), set()).update(self.line_modes)
        for b in self.grid_brightness:
            for c in self.grid_contrast:
                pts.setdefault((_r(b), _r(c), self.steps), set()).update(self.grid_modes)
        if self.budget_levels and self.budget_steps:
            for n in sorted({self.steps, *self.budget_steps}):
                for t in self.budget_levels:
                    pts.setdefault((*shift_of("both", t), n), set()).update(GRID_MODES)
        return pts

    def run_configs(self) -> list[RunConfig]:
        """One :class:`RunConfig` per distinct ``(seed, brightness, contrast, steps, mode)``, seeds outermost."""
        base = self._base()
        return [RunConfig(seed=s, mode=m, steps=n, brightness=b, contrast=c, **base)
                for s in self.seeds for (b, c, n), modes in self.points().items() for m in MODE_NAMES if m in modes]

    def mismatch_config(self, seed: int, brightness: float, contrast: float) -> "MismatchConfig":
        """The mismatch measurement of ``seed``'s source backbone at one shift."""
        src = RunConfig(seed=seed, **self._base()).source
        return MismatchConfig(**src.asdict(), brightness=brightness, contrast=contrast, batch_size=self.batch_size,
                              mismatch_batches=self.mismatch_batches)

    def describe(self) -> str:
        """The parameters for the page's run line."""
        def span(v):
            return f"{len(v)} levels {min(v):g} to {max(v):g}" if v else "none"
        grid = f"{len(self.grid_brightness)}x{len(self.grid_contrast)}" if self.grid_brightness else "none"
        budget = ("/".join(map(str, self.budget_steps)) + " steps at t=" + "/".join(f"{t:g}" for t in self.budget_levels)
                  if self.budget_levels and self.budget_steps else "none")
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, "
                f"brightness {span(self.brightness_levels)}, contrast {span(self.contrast_levels)}, "
                f"both t {span(self.both_levels)}, grid {grid}, budget {budget}, noise={self.noise:g}, "
                f"mismatch_batches={self.mismatch_batches}, n_boot={self.n_boot}, min_effect={self.min_effect:g}")


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the statistics mismatch of each run -------------------------------------------------------------------------

@dataclass(frozen=True)
class MismatchConfig(SourceConfig):
    """One mismatch measurement: a source backbone (:class:`SourceConfig`) and ``mismatch_batches``
    unlabelled task-B batches of ``batch_size`` at ``(brightness, contrast)``."""

    brightness: float = RunConfig.brightness
    contrast: float = RunConfig.contrast
    batch_size: int = RunConfig.batch_size
    mismatch_batches: int = 8

    def __post_init__(self):
        super().__post_init__()
        self._set("brightness", check_float("brightness", self.brightness))
        self._set("contrast", check_float("contrast", self.contrast, 0.0, low_open=True))
        self._set("batch_size", check_int("batch_size", self.batch_size, 1))
        self._set("mismatch_batches", check_int("mismatch_batches", self.mismatch_batches, 1))

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(**{k: getattr(self, k) for k in SourceConfig.__dataclass_fields__})


def mismatch_batches(cfg: MismatchConfig) -> list[torch.Tensor]:
    """``cfg.mismatch_batches`` unlabelled task-B batches ``(batch_size, 3, 32, 32)`` of ``cfg``'s seed and shift.

    Drawn from their own generator (``seed, "mismatch", "B"``), so the same images, shifted
    differently, serve every shift level of a seed.
    """
    task = make_task(cfg.seed, "B", cfg.n_classes, cfg.noise, cfg.brightness, cfg.contrast)
    stream = BatchStream(task, cfg.batch_size, generator(cfg.seed, "mismatch", "B"))
    return [stream.next()[0] for _ in range(cfg.mismatch_batches)]


def source_backbone(cfg: SourceConfig, cache_dir=None, version: str | None = None) -> ConvBackbone:
    """The trained (stage-1) backbone of ``cfg`` from the run cache, in eval mode."""
    backbone = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
    backbone.load_state_dict(load_source(cfg.source if hasattr(cfg, "source") else cfg, cache_dir, version)["backbone"])
    return backbone.eval()


def mismatch_row(backbone: torch.nn.Module, batches: list[torch.Tensor]) -> dict:
    """The mismatch columns of one run: Gaussian KL (eval and train pass) and standardised mean shift.

    ``mismatch_kl`` (the chapter's measure): mean over BN layers of the per-layer,
    channel-averaged ``KL(new || stored)`` in the eval pass; ``mismatch_kl_l<i>``: per layer;
    ``mismatch_mean_shift``: mean over layers of the standardised mean shift (eval pass);
    ``mismatch_kl_train``: the KL in the train pass (against the statistics ``train_mode`` drifts to).
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


def _mismatch_group(configs: list[MismatchConfig], cache_root: str, version: str) -> list[dict]:
    """Mismatch rows for configs of one seed (a :func:`bnstudy.sweep.run_sweep` group): one backbone load."""
    rows, backbones = [], {}
    for c in configs:
        if c.source not in backbones:
            backbones[c.source] = source_backbone(c.source, cache_root, version)
        rows.append(mismatch_row(backbones[c.source], mismatch_batches(c)))
    return rows


# --- the experiment -----------------------------------------------------------------------------------------------

def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run chapter 3's sweep; one row per distinct ``(seed, mode, brightness, contrast, steps)``.

    Columns: those of :func:`bnstudy.engine.transfer`; the mismatch columns of :func:`mismatch_row`;
    ``on_brightness`` / ``on_contrast`` / ``on_both`` (whether the run's shift is one of that line's
    levels), ``both_strength`` (``t`` where the shift is a level of the ``both`` line or of the budget
    check, NaN elsewhere), ``in_grid``, and ``part``: ``"main"`` for runs with the sweep's ``steps``,
    ``"budget"`` for the budget check's other step counts.
    """
    if not isinstance(config, Config):
        raise TypeError(f"run needs a shift_strength.Config (see make_config), got {type(config).__name__}")
    ex = execution or Execution()
    version = code_version()  # one code version for every cache key of this run
    df = transfer_sweep(config.run_configs(), NAMESPACE, ex, version=version)

    # The mismatch needs only the cached source backbones (stage 1 ran above) and unlabelled task-B images.
    root = str(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    mcfgs = list(dict.fromkeys(config.mismatch_config(s, b, c) for s in config.seeds
                               for (b, c, _n) in config.points()))
    by_seed: dict = {}
    for i, c in enumerate(mcfgs):
        by_seed.setdefault(c.seed, []).append(i)
    mm = run_sweep(mcfgs, _mismatch_group, namespace=MISMATCH_NAMESPACE, cache_dir=root, execution=ex,
                   groups=list(by_seed.values()), desc="statistics mismatch",
                   group_kwargs={"cache_root": root, "version": version}, version=version)
    keys = pd.DataFrame([dict(seed=c.seed, brightness=c.brightness, contrast=c.contrast) for c in mcfgs])
    df = df.merge(pd.concat([keys, mm], axis=1), on=["seed", "brightness", "contrast"], how="left",
                  validate="many_to_one")
    return annotate(df, config)


def annotate(df: pd.DataFrame, config: Config) -> pd.DataFrame:
    """``df`` with the columns saying where each run sits: ``on_<line>``, ``both_strength``, ``in_grid``, ``part``."""
    df = df.copy()
    pts = {t: {shift_of(t, s): s for s in ls} for t, ls in config.levels().items()}
    key = list(zip(df["brightness"].map(_r), df["contrast"].map(_r)))
    for t in SHIFT_TYPES:
        df[f"on_{t}"] = [k in pts.get(t, {}) for k in key]
    budget = config.budget_levels if config.budget_steps else ()
    on_path = {**{shift_of("both", s): s for s in budget}, **pts.get("both", {})}
    df["both_strength"] = [on_path.get(k, math.nan) for k in key]
    gpts = {(_r(b), _r(c)) for b in config.grid_brightness for c in config.grid_contrast}
    df["in_grid"] = [k in gpts for k in key]
    df["part"] = np.where(df["steps"] == config.steps, "main", "budget")
    return df


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without the list-valued columns (drift traces and logit quantiles; chapter 1 draws them)."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]


# --- analysis: paired effects, lines, crossover -------------------------------------------------------------------

def paired_effects(df: pd.DataFrame, pinned: str = "backbone_eval") -> pd.DataFrame:
    """Cost and benefit of drifting statistics, paired within each ``(seed, brightness, contrast[, steps])``.

    Returns one row per pair point that has both a ``train_mode`` and a ``pinned`` run:
    ``cost = task_a_after(pinned) - task_a_after(train_mode)``, ``benefit = task_b(train_mode) -
    task_b(pinned)``, ``net = benefit - cost`` (accuracy fractions; positive net means drifting
    pays), the accuracies behind them, and the ``train_mode`` row's columns that are constant across
    modes (mismatch, line flags). Raises ``ValueError`` if ``pinned`` is not a pinned mode or no pair exists.
    """
    check_choice("pinned", pinned, PINNED_MODES)
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
    check_choice("shift_type", shift_type, SHIFT_TYPES)
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

    Levels where both ``|cost|`` and ``|benefit|`` are below ``min_effect`` (accuracy fraction)
    are ties and are skipped. Between the two resolved levels that bracket a sign change the
    crossing is found by linear interpolation of ``benefit - cost``.
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

    ``strength (L,)`` increasing; ``cost (S, L)`` and ``benefit (S, L)``: per-seed paired effects.
    The point estimate is :func:`first_crossing` of the mean curves; the interval resamples seeds
    with replacement ``n_boot`` times (numpy ``default_rng(seed)``, cost and benefit together) and
    takes the percentile interval of the crossings among the resamples that cross at all.

    Returns ``estimate``, ``ci_low``, ``ci_high`` (NaN where undefined), ``p_cross`` (fraction of
    resamples that cross), ``n_boot``, ``dominant`` (``"cost"`` or ``"benefit"``: the higher mean
    curve at the strongest level), ``first_resolved`` (weakest strength where either mean reaches
    ``min_effect``; NaN if none) and ``min_effect``. Raises ``ValueError`` for mismatched shapes,
    fewer than 2 seeds or levels, ``n_boot < 1`` or ``confidence`` outside (0, 1).
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
    """Per run: ``task_a_change = task_a_after - task_a_before`` and ``task_b_gain`` (``task_b`` minus
    ``task_b`` of ``reference`` at the same seed and shift). Rows without a ``reference`` run are dropped.
    Raises ``ValueError`` for an unknown ``reference`` mode.
    """
    check_choice("reference", reference, MODE_NAMES)
    keys = [k for k in PAIR_KEYS if k in df.columns]
    ref = df[df["mode"] == reference].set_index(keys)["task_b"].rename("task_b_reference")
    out = df.join(ref, on=keys, how="inner")
    out["task_a_change"] = out["task_a_after"] - out["task_a_before"]
    out["task_b_gain"] = out["task_b"] - out["task_b_reference"]
    return out


# --- tidy tables behind the figures --------------------------------------------------------------------------------

def _ci_long(df: pd.DataFrame, by: list, metrics) -> pd.DataFrame:
    recs = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            iv = mean_ci(g[m])
            recs.append(dict(zip(by, key), metric=m, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(recs, columns=[*by, "metric", "mean", "ci_low", "ci_high", "n_seeds"])


def _main(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["part"] == "main"] if "part" in df.columns else df


def line_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net along each line: ``shift, strength, metric, mean, ci_low, ci_high, n_seeds``
    (95% Student-t intervals over seeds of the per-seed paired effects; the sweep's own steps only)."""
    eff = paired_effects(_main(df))
    parts = [_ci_long(eff.assign(shift=t, strength=strength_of(eff, t)).dropna(subset=["strength"]),
                      ["shift", "strength"], EFFECTS) for t in SHIFT_TYPES if eff[f"on_{t}"].any()]
    return pd.concat(parts, ignore_index=True)


def budget_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost and benefit at the budget check's ``both``-line strengths per stage-2 step count:
    ``t, steps, metric, mean, ci_low, ci_high, n_seeds`` (empty without a budget check)."""
    levels = sorted(df.loc[df["part"] == "budget", "both_strength"].dropna().unique())
    if not levels:
        return pd.DataFrame(columns=["t", "steps", "metric", "mean", "ci_low", "ci_high", "n_seeds"])
    bud = paired_effects(df[df["both_strength"].isin(levels)])
    return _ci_long(bud.rename(columns={"both_strength": "t"}), ["t", "steps"], ("cost", "benefit"))


def grid_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net on the brightness x contrast grid: ``brightness, contrast, metric, mean, ci_low,
    ci_high, n_seeds``."""
    eff = paired_effects(_main(df))
    return _ci_long(eff[eff["in_grid"].astype(bool)], ["brightness", "contrast"], EFFECTS)


def condition_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per shift of the sweep: ``brightness, contrast, kind`` (which line it illustrates: ``no shift``,
    ``brightness``, ``contrast``, ``both`` or ``grid only``), the ``on_<line>`` flags, and mean and 95% interval
    (``<col>``, ``<col>_lo``, ``<col>_hi``) of ``mismatch_kl``, ``cost``, ``benefit``, plus ``mismatch_kl_train``."""
    eff = paired_effects(_main(df))
    kind = np.select([eff.on_brightness & ~eff.on_contrast & (eff.brightness > 0),
                      eff.on_contrast & ~eff.on_brightness & (eff.contrast != 1),
                      eff.on_both & (eff.both_strength > 0),
                      (eff.brightness == 0) & (eff.contrast == 1)],
                     ["brightness", "contrast", "both", "no shift"], default="grid only")
    recs = []
    for (b, c), g in eff.assign(kind=kind).groupby(["brightness", "contrast"]):
        r = dict(brightness=b, contrast=c, kind=g["kind"].iloc[0], **{f"on_{t}": bool(g[f"on_{t}"].iloc[0])
                                                                      for t in SHIFT_TYPES})
        for col in ("mismatch_kl", "cost", "benefit"):
            r[col], r[col + "_lo"], r[col + "_hi"] = mean_ci(g[col])
        r["mismatch_kl_train"] = float(g["mismatch_kl_train"].mean())
        recs.append(r)
    return pd.DataFrame(recs)


def scatter_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per mode and line shift: task-A change and task-B gain over ``backbone_eval``, long:
    ``mode, brightness, contrast, metric, mean, ci_low, ci_high, n_seeds``."""
    me = mode_effects(_main(df))
    me = me[me[["on_brightness", "on_contrast", "on_both"]].any(axis=1)]
    return _ci_long(me, ["mode", "brightness", "contrast"], ("task_a_change", "task_b_gain"))


def _wide(long: pd.DataFrame, by: list, metric: str) -> pd.DataFrame:
    return long[long["metric"] == metric].set_index(by)[["mean", "ci_low", "ci_high"]]


# --- findings --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Findings:
    """Every number and verdict chapter 3's prose cites (accuracies and effects are fractions 0..1).

    ``cross[line]``: :func:`crossover`'s result; ``curves_cross[line]``: ``"cross"`` / ``"do not cross"``;
    ``crossing_lines``: the lines whose mean curves cross (``"none"`` if none); ``lines[line]``: levels and
    how many have the net effect's 95% interval below zero (``n_cost_wins``) or above (``n_benefit_wins``).
    ``cost`` / ``benefit``: intervals at ``noshift``, ``t1`` (chapter 1's shift) and ``<line>_max`` (the
    strongest level). ``budget``: the budget check at its largest strength ``budget_t`` between
    ``budget_s_lo`` and ``budget_s_hi`` steps, ``budget_direction`` how the benefit moves (``"shrinks"``,
    ``"grows"``, ``"does not change significantly"``). Grid: ``grid_compound`` is ``"more"`` / ``"no more"``
    (corner cell's cost against the larger pure shift). Mismatch: Spearman correlations, the ``safe``
    (cost below ``min_effect`` with 95% confidence) and ``harm`` groups, ``threshold_clean`` (``"do not
    overlap"`` / ``"overlap"``), ``bright_vs_both_word`` (``"more"`` / ``"less"``). Separate statistics:
    ``sep_gain_without_loss`` (``"holds"`` if task A never changes and task B is within 0.01 of
    ``train_mode``'s everywhere). NaN where the sweep lacks what a number needs.
    """

    n_seeds: int
    n_runs: int
    steps: int
    ch1_steps: int
    chance: float
    ref_brightness: float
    ref_contrast: float
    min_effect: float
    n_boot: int
    max_pinned_diff: float
    cross: dict
    curves_cross: dict
    crossing_lines: str
    any_crossover: bool
    lines: dict
    near: dict
    cost: dict
    benefit: dict
    net_best: float
    net_worst: float
    taskb_train_min: float
    taskb_train_max: float
    taskb_pinned_noshift: float
    taskb_pinned_min: float
    taska_train_min: float
    taska_before_mean: float
    budget_t: float
    budget_s_lo: float
    budget_s_hi: float
    budget: dict
    budget_direction: str
    grid_n_cells: int
    grid_n_net_negative: int
    grid_n_net_positive: int
    grid_net_max: float
    grid_bmax: float
    grid_cmax: float
    grid_cost_corner: float
    grid_cost_bonly: float
    grid_cost_conly: float
    grid_compound: str
    scatter_n_points: int
    scatter_n_below: int
    scatter_n_above: int
    sep_max_task_a_change: float
    sep_vs_train_max_b_diff: float
    sep_gain_without_loss: str
    n_conditions: int
    rho_cost: float
    rho_benefit: float
    rho_eval_train: float
    rho_cost_line_min: float
    noshift_kl: float
    safe_max_kl: float
    harm_min_kl: float
    threshold_clean: str
    bright_vs_both_gap: float
    bright_vs_both_n: int
    bright_vs_both_word: str
    worker_min: float


NAN_IV = Interval(math.nan, math.nan, math.nan, 0)


def _iv(values) -> Interval:
    return mean_ci(values) if len(values) else NAN_IV


def _budget_findings(df: pd.DataFrame) -> dict:
    bt = budget_table(df)
    if bt.empty:
        return dict(budget_t=math.nan, budget_s_lo=math.nan, budget_s_hi=math.nan, budget={},
                    budget_direction="not measured")
    t, s_lo, s_hi = float(bt["t"].max()), int(bt["steps"].min()), int(bt["steps"].max())
    B = bt.set_index(["t", "steps", "metric"])
    iv = lambda n, m: Interval(*B.loc[(t, n, m), ["mean", "ci_low", "ci_high"]].astype(float), int(B.loc[(t, n, m), "n_seeds"]))
    bud = paired_effects(df[df["both_strength"] == t])
    wide = bud.pivot(index="seed", columns="steps", values="benefit")
    dm = mean_ci(wide[s_hi] - wide[s_lo])
    tbw = df[df["both_strength"] == t].groupby(["steps", "mode"])["task_b"].mean().unstack()
    budget = {"cost_lo": iv(s_lo, "cost"), "cost_hi": iv(s_hi, "cost"), "benefit_lo": iv(s_lo, "benefit"),
              "benefit_hi": iv(s_hi, "benefit"), "benefit_change": dm,
              "taskb_train_lo": float(tbw.loc[s_lo, "train_mode"]), "taskb_train_hi": float(tbw.loc[s_hi, "train_mode"]),
              "taskb_pinned_lo": float(tbw.loc[s_lo, "backbone_eval"]),
              "taskb_pinned_hi": float(tbw.loc[s_hi, "backbone_eval"])}
    direction = "shrinks" if dm.high < 0 else ("grows" if dm.low > 0 else "does not change significantly")
    return dict(budget_t=t, budget_s_lo=s_lo, budget_s_hi=s_hi, budget=budget, budget_direction=direction)


def _grid_findings(df: pd.DataFrame) -> dict:
    if not df["in_grid"].astype(bool).any():
        return dict(grid_n_cells=0, grid_n_net_negative=0, grid_n_net_positive=0, grid_net_max=math.nan,
                    grid_bmax=math.nan, grid_cmax=math.nan, grid_cost_corner=math.nan, grid_cost_bonly=math.nan,
                    grid_cost_conly=math.nan, grid_compound="not measured")
    gt = grid_table(df)
    net, cm = _wide(gt, ["brightness", "contrast"], "net"), _wide(gt, ["brightness", "contrast"], "cost")["mean"]
    bmax, cmax = float(gt["brightness"].max()), float(gt["contrast"].max())
    corner = float(cm.loc[(bmax, cmax)])
    bonly, conly = float(cm.get((bmax, 1.0), math.nan)), float(cm.get((0.0, cmax), math.nan))
    return dict(grid_n_cells=len(net), grid_n_net_negative=int((net["ci_high"] < 0).sum()),
                grid_n_net_positive=int((net["ci_low"] > 0).sum()), grid_net_max=float(net["mean"].max()),
                grid_bmax=bmax, grid_cmax=cmax, grid_cost_corner=corner, grid_cost_bonly=bonly, grid_cost_conly=conly,
                grid_compound="more" if corner > np.nanmax([bonly, conly]) else "no more")


def _mismatch_findings(df: pd.DataFrame, min_effect: float) -> dict:
    pc = condition_table(df)
    rho = lambda a, b: float(sps.spearmanr(a, b).statistic)
    safe = pc[pc["cost_hi"] < min_effect]["mismatch_kl"]
    harm = pc[pc["cost_lo"] > min_effect]["mismatch_kl"]
    overlap = len(safe) and len(harm) and harm.min() < safe.max()
    line_rho = [rho(g["mismatch_kl"], g["cost"]) for t in SHIFT_TYPES
                for g in [pc[pc[f"on_{t}"]]] if len(g) >= 2]
    both_pts = pc[pc.kind.isin(["both", "no shift"])].sort_values("mismatch_kl")
    bri = pc[(pc.kind == "brightness") & pc.mismatch_kl.between(both_pts.mismatch_kl.min(), both_pts.mismatch_kl.max())]
    gap = bri["cost"] - np.interp(np.log(bri["mismatch_kl"]), np.log(both_pts["mismatch_kl"]), both_pts["cost"])
    return dict(n_conditions=len(pc), rho_cost=rho(pc["mismatch_kl"], pc["cost"]),
                rho_benefit=rho(pc["mismatch_kl"], pc["benefit"]),
                rho_eval_train=rho(pc["mismatch_kl"], pc["mismatch_kl_train"]),
                rho_cost_line_min=min(line_rho) if line_rho else math.nan,
                noshift_kl=float(pc[pc.kind == "no shift"]["mismatch_kl"].mean()),
                safe_max_kl=float(safe.max()) if len(safe) else math.nan,
                harm_min_kl=float(harm.min()) if len(harm) else math.nan,
                threshold_clean="overlap" if overlap else "do not overlap",
                bright_vs_both_gap=float(gap.mean()) if len(gap) else math.nan, bright_vs_both_n=len(gap),
                bright_vs_both_word="more" if len(gap) and gap.mean() > 0 else "less")


def findings(df: pd.DataFrame, n_boot: int = 2000, min_effect: float = 0.01) -> Findings:
    """Chapter 3's findings from its results table (:func:`run`'s columns; all three lines with at least
    2 levels and 2 seeds, and the modes ``train_mode``, ``backbone_eval``, ``separate_stats`` on the lines).

    ``n_boot`` and ``min_effect``: the crossover's bootstrap resamples (seed 0) and tie tolerance.
    Raises ``ValueError`` if a line or one of those modes is missing.
    """
    main = _main(df)
    for t in SHIFT_TYPES:
        if main[f"on_{t}"].sum() == 0:
            raise ValueError(f"findings needs all three lines; the {t} line has no runs")
    missing = {"train_mode", "backbone_eval", "separate_stats"} - set(main["mode"])
    if missing:
        raise ValueError(f"findings needs the modes {sorted(missing)} on the lines")
    eff = paired_effects(main)
    cross, lines, near, cost, benefit, nets = {}, {}, {}, {}, {}, []
    lt = line_table(df)
    for t in SHIFT_TYPES:
        x, _, c = line_matrix(eff, t, "cost")
        _, _, b = line_matrix(eff, t, "benefit")
        cr = cross[t] = crossover(x, c, b, n_boot=n_boot, seed=0, min_effect=min_effect)
        net = _wide(lt[lt["shift"] == t], ["strength"], "net")
        lines[t] = dict(n_levels=len(x), min_strength=float(x[0]), max_strength=float(x[-1]),
                        n_cost_wins=int((net["ci_high"] < 0).sum()), n_benefit_wins=int((net["ci_low"] > 0).sum()))
        nets.append((b - c).mean(0))
        # Largest mean effects up to the first level beyond where crossing resamples cross.
        upto = x <= x[np.searchsorted(x, cr["ci_high"])] if cr["ci_high"] <= x[-1] else np.ones_like(x, bool)
        near[t] = dict(cost=float(c.mean(0)[upto].max()), benefit=float(b.mean(0)[upto].max()))
        cost[f"{t}_max"], benefit[f"{t}_max"] = mean_ci(c[:, -1]), mean_ci(b[:, -1])
    ns = eff[(eff.brightness == 0) & (eff.contrast == 1)]
    at1 = eff[np.isclose(eff["both_strength"], 1.0)]
    for name, d in (("cost", cost), ("benefit", benefit)):
        d["noshift"], d["t1"] = _iv(ns[name]), _iv(at1[name])
    crossing = [t for t in SHIFT_TYPES if not math.isnan(cross[t]["estimate"])]
    all_net = np.concatenate(nets)

    pb = main.pivot_table(index=["seed", "brightness", "contrast"], columns="mode", values="task_b")
    pinned = pb[[m for m in PINNED_MODES if m in pb.columns]].dropna()
    on_line = main[main[["on_brightness", "on_contrast", "on_both"]].any(axis=1)]
    cond = on_line.groupby(["brightness", "contrast", "mode"])[["task_b", "task_a_after"]].mean().reset_index()
    noshift = cond[(cond.brightness == 0) & (cond.contrast == 1)].set_index("mode")

    me = mode_effects(on_line)
    sep = me[me["mode"] == "separate_stats"].set_index(["seed", "brightness", "contrast"])
    tmm = me[me["mode"] == "train_mode"].set_index(["seed", "brightness", "contrast"])
    sep_a, sep_b = float(sep["task_a_change"].abs().max()), float((sep["task_b"] - tmm.loc[sep.index, "task_b"]).abs().max())
    tm_net = me[me["mode"] == "train_mode"].assign(net=lambda d: d["task_b_gain"] + d["task_a_change"])
    scat = _ci_long(tm_net, ["brightness", "contrast"], ["net"])

    return Findings(
        n_seeds=int(df["seed"].nunique()), n_runs=len(df), steps=int(main["steps"].iloc[0]), ch1_steps=CH1_STEPS,
        chance=1 / int(df["n_classes"].iloc[0]), ref_brightness=REFERENCE_SHIFT[0], ref_contrast=REFERENCE_SHIFT[1],
        min_effect=min_effect, n_boot=n_boot,
        max_pinned_diff=float((pinned["backbone_eval"] - pinned["all_eval"]).abs().max())
        if pinned.shape[1] == 2 and len(pinned) else math.nan,
        cross=cross, curves_cross={t: "cross" if t in crossing else "do not cross" for t in SHIFT_TYPES},
        crossing_lines=" and ".join(crossing) if crossing else "none", any_crossover=bool(crossing),
        lines=lines, near=near, cost=cost, benefit=benefit,
        net_best=float(all_net.max()), net_worst=float(all_net.min()),
        taskb_train_min=float(cond[cond["mode"] == "train_mode"]["task_b"].min()),
        taskb_train_max=float(cond[cond["mode"] == "train_mode"]["task_b"].max()),
        taskb_pinned_noshift=float(noshift.loc["backbone_eval", "task_b"]) if "backbone_eval" in noshift.index else math.nan,
        taskb_pinned_min=float(cond[cond["mode"] == "backbone_eval"]["task_b"].min()),
        taska_train_min=float(cond[cond["mode"] == "train_mode"]["task_a_after"].min()),
        taska_before_mean=float(main["task_a_before"].mean()),
        **_budget_findings(df), **_grid_findings(df),
        scatter_n_points=len(scat), scatter_n_below=int((scat["ci_high"] < 0).sum()),
        scatter_n_above=int((scat["ci_low"] > 0).sum()),
        sep_max_task_a_change=sep_a, sep_vs_train_max_b_diff=sep_b,
        sep_gain_without_loss="holds" if sep_a == 0 and sep_b < 0.01 else "does not hold",
        **_mismatch_findings(df, min_effect),
        worker_min=float(df["wall_s"].sum()) / 60 if "wall_s" in df.columns else math.nan,
    )


def crossover_table(F: Findings) -> pd.DataFrame:
    """The page's crossover table (display cells), one row per line, from :class:`Findings`."""
    rows = []
    for t in SHIFT_TYPES:
        cr, L = F.cross[t], F.lines[t]
        rows.append({"shift": t, "levels": f"{L['n_levels']}: {L['min_strength']:g} to {L['max_strength']:g}",
                     "cost > benefit": f"{L['n_cost_wins']} levels", "benefit > cost": f"{L['n_benefit_wins']} levels",
                     "crossover [95% CI]": ("none in range" if math.isnan(cr["estimate"]) else
                                            f"{cr['estimate']:.3f} [{cr['ci_low']:.3f}, {cr['ci_high']:.3f}]"),
                     "resamples crossing: share, 95% range": (f"{cr['p_cross']:.1%}" + (
                         f", {cr['ci_low']:.3g} to {cr['ci_high']:.3g}" if cr["p_cross"] > 0 else ""))})
    return pd.DataFrame(rows).set_index("shift")


def crossover_long(F: Findings) -> pd.DataFrame:
    """The crossover numbers as a tidy table: ``shift, estimate, ci_low, ci_high, p_cross, first_resolved,
    dominant, n_cost_wins, n_benefit_wins``."""
    return pd.DataFrame([dict(shift=t, **{k: F.cross[t][k] for k in ("estimate", "ci_low", "ci_high", "p_cross",
                                                                     "first_resolved", "dominant")},
                              n_cost_wins=F.lines[t]["n_cost_wins"], n_benefit_wins=F.lines[t]["n_benefit_wins"])
                         for t in SHIFT_TYPES])
