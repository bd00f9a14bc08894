"""Chapter 3, what is trained: ``train_mode``'s cost on task A and benefit on task B along lines of growing shift
from none to beyond chapter 1's ``REFERENCE_SHIFT = (b0, c0)``: ``brightness`` (offset ``b``), ``contrast`` (gain
``c``), ``both`` (strength ``t``: brightness ``t * b0``, contrast ``1 + t * (c0 - 1)``), ``blur`` and ``noise``
(issue 10: corruptions no per-channel affine map undoes) and the same-class family (``same_both``, ``same_noise``:
:func:`bnstudy.study.tasks.make_task_b`); plus a brightness x contrast grid and a training-budget check. Each distinct
``(seed, mode, shift, steps)`` runs once and carries the statistics mismatch between its source backbone's stored
statistics and its task-B data. This module imports neither :mod:`.findings` nor :mod:`.figures`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...config import Execution, RunConfig, SourceConfig, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label
from ...design import REQUIRED, ChapterConfig, Rule
from ...engine import ensure_sources, load_source, source_version, transfer_sweep
from ...models import ConvBackbone
from ...modes import MODE_NAMES
from ....running_stats import bn_input_statistics, mismatch_from_statistics
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, generator, make_task_b

NAMESPACE = "ch03_shift_strength"
MISMATCH_NAMESPACE = "ch03_mismatch"
SHIFT_TYPES = ("brightness", "contrast", "both")
#: ``blur``: a Gaussian blur std in pixels; ``noise``: an extra pixel-noise std.
LINES = SHIFT_TYPES + ("blur", "noise", "same_both", "same_noise")
#: ``line: (task_b_classes, kind)``; kind is ``brightness``/``contrast``/``both`` (affine) or a corruption.
LINE_SPEC = {"brightness": ("new", "brightness"), "contrast": ("new", "contrast"), "both": ("new", "both"),
             "blur": ("new", "blur"), "noise": ("new", "noise"), "same_both": ("same", "both"),
             "same_noise": ("same", "noise")}
#: The lines that only need the cost and the benefit (they run :data:`GRID_MODES`).
EXTRA_LINES = LINES[len(SHIFT_TYPES):]
#: What identifies a shift: task B's classes, the corruption and its level, brightness, contrast (RunConfig fields).
POINT_COLS = ("task_b_classes", "corruption", "corruption_level", "brightness", "contrast")
PINNED_MODES = ("backbone_eval", "all_eval")
#: Modes the grid and the budget check run (all the cost and benefit need).
GRID_MODES = ("train_mode", "backbone_eval")
#: Chapter 1's shift, the ``t = 1`` point of the ``both`` line, and its stage-2 steps (RunConfig's defaults).
REFERENCE_SHIFT = (RunConfig.brightness, RunConfig.contrast)
CH1_STEPS = RunConfig.steps

#: The sweep sizes (only set here). quick: the grid's corners only, a short budget check; full: the published book.
PROFILES = {
    "quick": dict(seeds=3, steps=100, brightness_levels=(0.0, 1.0, 2.0, 4.0), contrast_levels=(1.0, 1.5, 2.0, 5.0),
                  both_levels=(0.0, 0.25, 0.5, 1.0), grid_brightness=(0.0, 4.0), grid_contrast=(1.0, 5.0),
                  budget_levels=(0.25, 1.0), budget_steps=(200,), blur_levels=(0.0, 1.0, 2.0),
                  noise_levels=(0.0, 3.0, 6.0), same_both_levels=(0.0, 0.25, 1.0), same_noise_levels=(0.0, 3.0, 6.0)),
    "full": dict(seeds=16, steps=300, brightness_levels=(0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 4.0, 6.0),
                 contrast_levels=(1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0),
                 both_levels=(0.0, 0.0625, 0.125, 0.25, 0.375, 0.5, 1.0, 1.5),
                 grid_brightness=(0.0, 1.0, 2.0, 4.0), grid_contrast=(1.0, 2.0, 3.0, 5.0),
                 budget_levels=(0.0625, 0.25, 1.0), budget_steps=(800, 1600),
                 blur_levels=(0.0, 0.5, 1.0, 1.5, 2.0, 3.0), noise_levels=(0.0, 1.0, 2.0, 3.0, 4.5, 6.0),
                 same_both_levels=(0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 1.5),
                 same_noise_levels=(0.0, 1.0, 2.0, 3.0, 4.5, 6.0)),
}


def _r(v: float) -> float:
    # Shift values are keys (cache, pairing, line membership): round away float noise from t * b0.
    return round(float(v), 9)


def shift_of(shift_type: str, strength: float) -> tuple[float, float]:
    """``(brightness, contrast)`` of the point at ``strength`` on the line ``shift_type``. Raises ``ValueError`` for
    an unknown shift type or a strength that gives a non-positive contrast."""
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


def point_of(line: str, strength: float) -> tuple:
    """The shift at ``strength`` on ``line``: ``(task_b_classes, corruption, corruption_level, brightness, contrast)``
    (:data:`POINT_COLS`). A corruption at level 0 is no corruption, so every line of a family starts at its
    no-shift point. Raises ``ValueError`` for an unknown line or a bad strength (negative corruption level,
    non-positive contrast)."""
    check_choice("line", line, LINES)
    classes, kind = LINE_SPEC[line]
    if kind in SHIFT_TYPES:
        return (classes, "none", 0.0, *shift_of(kind, strength))
    s = float(strength)
    if not s >= 0:
        raise ValueError(f"strength={strength!r} on the {line} line: a {kind} level must be >= 0")
    return (classes, kind, _r(s), 0.0, 1.0) if s > 0 else (classes, "none", 0.0, 0.0, 1.0)


def _key(row) -> tuple:
    return (row["task_b_classes"], row["corruption"], _r(row["corruption_level"]), _r(row["brightness"]),
            _r(row["contrast"]))


def _levels(name: str, value, shift_type: str = "both", ordered: bool = True) -> tuple[float, ...]:
    """Levels valid on ``shift_type``'s line (:func:`point_of`); ``ordered``: empty (skip) or at least 2, strictly
    increasing."""
    out = check_sequence(name, value, check_float)
    if ordered and len(out) == 1:
        raise ValueError(f"{name} needs at least 2 levels (or none, to skip it), got {list(out)!r}")
    if ordered and list(out) != sorted(set(out)):
        raise ValueError(f"{name} must be strictly increasing, got {list(out)!r}")
    for v in out:
        try:
            point_of(shift_type, v)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    return out


def _modes(name: str, value) -> tuple[str, ...]:
    modes = check_sequence(name, value, lambda n, v: check_choice(n, v, MODE_NAMES), 1)
    if set(GRID_MODES) - set(modes):
        raise ValueError(f"{name} must include {list(GRID_MODES)} (cost and benefit compare them), got {list(modes)}")
    return modes


class Config(ChapterConfig):
    """Chapter 3's parameters (the notebook's parameters cell, one for one, and a few run sizes). ``<line>_levels``:
    strictly increasing strengths, empty skips the line; ``grid_brightness`` / ``grid_contrast`` both empty: no grid;
    ``budget_levels`` (``both``-line strengths) or ``budget_steps`` empty: no budget check; ``line_modes`` /
    ``grid_modes`` must include :data:`GRID_MODES`; ``min_effect`` / ``tie_margin``: crossover tie tolerance and TOST
    margin (accuracy fractions). Raises ``ValueError`` naming the parameter for any bad value, before any work starts.
    """

    PARAMETERS = dict(profile=REQUIRED, seeds=REQUIRED, steps=REQUIRED, brightness_levels=REQUIRED,
                      contrast_levels=REQUIRED, both_levels=REQUIRED, grid_brightness=REQUIRED,
                      grid_contrast=REQUIRED, budget_levels=REQUIRED, budget_steps=REQUIRED, blur_levels=(),
                      noise_levels=(), same_both_levels=(), same_noise_levels=(), line_modes=MODE_NAMES,
                      grid_modes=GRID_MODES, mismatch_batches=8, n_boot=2000, n_boot_select=500, min_effect=0.01,
                      tie_margin=0.02, noise=RunConfig.noise, momentum=RunConfig.momentum, widths=RunConfig.widths,
                      batch_size=RunConfig.batch_size, stage1_steps=RunConfig.stage1_steps,
                      stage1_batch_size=RunConfig.stage1_batch_size, n_eval=RunConfig.n_eval)

    PROFILES = PROFILES
    REPEATS_OK = ("widths",)
    NORMALIZE = {"seeds": check_seeds, "steps": lambda v: check_int("steps", v, 1),
                 **{f"{t}_levels": functools.partial(_levels, f"{t}_levels", shift_type=t) for t in LINES},
                 "grid_brightness": functools.partial(_levels, "grid_brightness", shift_type="brightness"),
                 "grid_contrast": functools.partial(_levels, "grid_contrast", shift_type="contrast"),
                 "budget_levels": functools.partial(_levels, "budget_levels", ordered=False),
                 "budget_steps": lambda v: check_sequence("budget_steps", v, lambda n, x: check_int(n, x, 1)),
                 "line_modes": functools.partial(_modes, "line_modes"),
                 "grid_modes": functools.partial(_modes, "grid_modes"),
                 "momentum": lambda v: v}  # None allowed: RunConfig checks it
    RULES = (
        Rule("grid_contrast", "given exactly when grid_brightness is (both be given or both be empty)",
             lambda c: bool(c.grid_brightness) == bool(c.grid_contrast)),
        *(Rule(n, "an integer >= 1", lambda c, n=n: getattr(c, n) >= 1)
          for n in ("mismatch_batches", "n_boot", "n_boot_select")),
        Rule("min_effect", ">= 0", lambda c: c.min_effect >= 0),
        Rule("tie_margin", "a finite number > 0", lambda c: c.tie_margin > 0),
        Rule("widths", "one or more integers >= 1", lambda c: c.widths and min(c.widths) >= 1),
    )

    def __post_init__(self):
        super().__post_init__()
        RunConfig(**self._base())  # noise, momentum, sizes: checked with the engine's own messages
        if not self.points():
            raise ValueError("nothing to run: every line's levels and the grid are empty")

    def _base(self) -> dict:
        return dict(noise=self.noise, momentum=self.momentum, widths=self.widths, batch_size=self.batch_size,
                    stage1_steps=self.stage1_steps, stage1_batch_size=self.stage1_batch_size, n_eval=self.n_eval)

    def levels(self) -> dict[str, tuple]:
        """``{line: strengths}`` of the lines that run (:data:`LINES` order)."""
        return {t: getattr(self, f"{t}_levels") for t in LINES if getattr(self, f"{t}_levels")}

    def points(self) -> dict[tuple, set]:
        """``{(*point_of(...), steps): modes}``: every distinct run point and the modes it needs, once (affine
        lines ``line_modes``; issue-10 lines and the grid ``grid_modes``; budget points :data:`GRID_MODES` at the
        sweep's steps and each budget step count)."""
        pts: dict[tuple, set] = {}
        for t, ls in self.levels().items():
            for s in ls:
                pts.setdefault((*point_of(t, s), self.steps), set()).update(
                    self.line_modes if t in SHIFT_TYPES else self.grid_modes)
        for b in self.grid_brightness:
            for c in self.grid_contrast:
                pts.setdefault(("new", "none", 0.0, _r(b), _r(c), self.steps), set()).update(self.grid_modes)
        if self.budget_levels and self.budget_steps:
            for n in sorted({self.steps, *self.budget_steps}):
                for t in self.budget_levels:
                    pts.setdefault((*point_of("both", t), n), set()).update(GRID_MODES)
        return pts

    def run_configs(self) -> list[RunConfig]:
        """One :class:`RunConfig` per distinct point and mode, seeds outermost."""
        base = self._base()
        return [RunConfig(seed=s, mode=m, steps=n, brightness=b, contrast=c, task_b_classes=cl, corruption=co,
                          corruption_level=lv, **base)
                for s in self.seeds for (cl, co, lv, b, c, n), modes in self.points().items()
                for m in MODE_NAMES if m in modes]

    def mismatch_config(self, seed: int, brightness: float, contrast: float, task_b_classes: str = "new",
                        corruption: str = "none", corruption_level: float = 0.0) -> "MismatchConfig":
        """The mismatch measurement of ``seed``'s source backbone at one shift."""
        src = RunConfig(seed=seed, **self._base()).source
        return MismatchConfig(**src.asdict(), brightness=brightness, contrast=contrast, batch_size=self.batch_size,
                              mismatch_batches=self.mismatch_batches, task_b_classes=task_b_classes,
                              corruption=corruption, corruption_level=corruption_level)

    def describe(self) -> str:
        """The parameters for the page's run line (lines as level spans, not :class:`ChapterConfig`'s lists)."""
        def span(v):
            return f"{len(v)} levels {min(v):g} to {max(v):g}" if v else "none"
        grid = f"{len(self.grid_brightness)}x{len(self.grid_contrast)}" if self.grid_brightness else "none"
        budget = ("/".join(map(str, self.budget_steps)) + " steps at t=" + "/".join(f"{t:g}" for t in self.budget_levels)
                  if self.budget_levels and self.budget_steps else "none")
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, "
                f"brightness {span(self.brightness_levels)}, contrast {span(self.contrast_levels)}, "
                f"both t {span(self.both_levels)}, blur {span(self.blur_levels)}, added noise {span(self.noise_levels)}, "
                f"same classes: both t {span(self.same_both_levels)}, added noise {span(self.same_noise_levels)}"
                + "".join(f", {t} {span(getattr(self, f'{t}_levels'))}" for t in LINES if t not in _DESCRIBED) + "; "
                f"grid {grid}, budget {budget}, noise={self.noise:g}, mismatch_batches={self.mismatch_batches}, "
                f"n_boot={self.n_boot}, n_boot_select={self.n_boot_select}, min_effect={self.min_effect:g}, tie_margin={self.tie_margin:g}, "
                f"head optimizer sgd lr {RunConfig.lr:g}")


#: The lines :meth:`Config.describe` names in its own words; any other line of :data:`LINES` follows by its name.
_DESCRIBED = ("brightness", "contrast", "both", "blur", "noise", "same_both", "same_noise")


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
    task_b_classes: str = "new"
    corruption: str = "none"
    corruption_level: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        self._set("corruption_level", check_float("corruption_level", self.corruption_level, 0.0))
        self._set("brightness", check_float("brightness", self.brightness))
        self._set("contrast", check_float("contrast", self.contrast, 0.0, low_open=True))
        self._set("batch_size", check_int("batch_size", self.batch_size, 1))
        self._set("mismatch_batches", check_int("mismatch_batches", self.mismatch_batches, 1))

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(**{k: getattr(self, k) for k in SourceConfig.__dataclass_fields__})


def mismatch_batches(cfg: MismatchConfig) -> list[torch.Tensor]:
    """``cfg.mismatch_batches`` unlabelled task-B batches ``(batch_size, 3, 32, 32)`` of ``cfg``'s seed and shift, from
    their own generator (``seed, "mismatch", "B"``): the same images, shifted differently, serve every level."""
    task = make_task_b(cfg.seed, cfg.n_classes, cfg.noise, cfg.brightness, cfg.contrast, cfg.task_b_classes,
                       cfg.corruption, cfg.corruption_level)
    stream = BatchStream(task, cfg.batch_size, generator(cfg.seed, "mismatch", "B"))
    return [stream.next()[0] for _ in range(cfg.mismatch_batches)]


def source_backbone(cfg: SourceConfig, cache_dir=None, version: str | None = None) -> ConvBackbone:
    """The trained (stage-1) backbone of ``cfg`` in eval mode: read from the run cache, trained into it first
    when absent (as when the page analyses an earlier run's rows and this code version has no source yet)."""
    src = cfg.source if hasattr(cfg, "source") else cfg
    ensure_sources([src], Execution(cache_dir=cache_dir, progress=False), version)
    backbone = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
    backbone.load_state_dict(load_source(src, cache_dir, version)["backbone"])
    return backbone.eval()


def mismatch_row(backbone: torch.nn.Module, batches: list[torch.Tensor]) -> dict:
    """The mismatch columns of one run: ``mismatch_kl`` (the mean over BN layers of the channel-averaged ``KL(new ||
    stored)``, eval pass; ``mismatch_kl_l<i>`` per layer), the eval pass's mean shift, log variance ratio and
    Wasserstein distance, and ``mismatch_kl_train`` (train pass: against the statistics ``train_mode`` drifts to)."""
    row = {}
    stats_eval = bn_input_statistics(backbone, batches, "eval")
    kl = mismatch_from_statistics(backbone, stats_eval, "kl")
    row["mismatch_kl"] = float(np.mean(list(kl.values())))
    for i, v in enumerate(kl.values()):
        row[f"mismatch_kl_l{i}"] = v
    row["mismatch_mean_shift"] = float(np.mean(list(mismatch_from_statistics(backbone, stats_eval, "mean_shift").values())))
    for m in ("log_var_ratio", "wasserstein"):
        row[f"mismatch_{m}"] = float(np.mean(list(mismatch_from_statistics(backbone, stats_eval, m).values())))
    kl_train = mismatch_from_statistics(backbone, bn_input_statistics(backbone, batches, "train"), "kl")
    row["mismatch_kl_train"] = float(np.mean(list(kl_train.values())))
    return row


def _mismatch_group(configs: list[MismatchConfig], cache_root: str, version: str) -> list[dict]:
    """Mismatch rows for configs of one seed (a :func:`bnstudy.study.sweep.run_sweep` group): one backbone load."""
    rows, backbones = [], {}
    for c in configs:
        if c.source not in backbones:
            backbones[c.source] = source_backbone(c.source, cache_root, version)
        rows.append(mismatch_row(backbones[c.source], mismatch_batches(c)))
    return rows


# --- the experiment -----------------------------------------------------------------------------------------------

def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Chapter 3's sweep, one row per distinct ``(seed, mode, shift, steps)``: the columns of
    :func:`bnstudy.study.engine.transfer`, of :func:`mismatch_row` and of :func:`annotate`."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs a shift_strength.Config (see make_config), got {type(config).__name__}")
    ex = execution or Execution()
    version = source_version()  # stage 1's code version: the mismatch sweep reads the backbones with it
    df = transfer_sweep(config.run_configs(), NAMESPACE, ex)  # each namespace keyed on the code its runs reach

    # The mismatch needs only the cached source backbones (stage 1 ran above) and unlabelled task-B images.
    root = str(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    mcfgs = list(dict.fromkeys(config.mismatch_config(s, b, c, cl, co, lv) for s in config.seeds
                               for (cl, co, lv, b, c, _n) in config.points()))
    groups = [[i for i, c in enumerate(mcfgs) if c.seed == s] for s in dict.fromkeys(c.seed for c in mcfgs)]
    mm = run_sweep(mcfgs, _mismatch_group, namespace=MISMATCH_NAMESPACE, cache_dir=root, execution=ex,
                   groups=groups, desc="statistics mismatch",
                   group_kwargs={"cache_root": root, "version": version})
    keys = pd.DataFrame([dict(seed=c.seed, **{k: getattr(c, k) for k in POINT_COLS}) for c in mcfgs])
    df = df.merge(pd.concat([keys, mm], axis=1), on=["seed", *POINT_COLS], how="left", validate="many_to_one")
    return annotate(df, config)


def annotate(df: pd.DataFrame, config: Config) -> pd.DataFrame:
    """``df`` with where each run sits: ``s_<line>`` (its strength on the line, NaN off it) and ``on_<line>``,
    ``both_strength`` (``t`` on the ``both`` line or the budget check), ``in_grid`` and ``part`` (``"main"`` at the
    sweep's steps, ``"budget"`` at the budget check's other step counts)."""
    df = df.copy()
    pts = {t: {point_of(t, s): s for s in ls} for t, ls in config.levels().items()}
    key = [_key(r) for r in df[list(POINT_COLS)].to_dict("records")]
    for t in LINES:
        df[f"s_{t}"] = [pts.get(t, {}).get(k, math.nan) for k in key]
        df[f"on_{t}"] = df[f"s_{t}"].notna()
    budget = config.budget_levels if config.budget_steps else ()
    on_path = {**{point_of("both", s): s for s in budget}, **pts.get("both", {})}
    df["both_strength"] = [on_path.get(k, math.nan) for k in key]
    gpts = {("new", "none", 0.0, _r(b), _r(c)) for b in config.grid_brightness for c in config.grid_contrast}
    df["in_grid"] = [k in gpts for k in key]
    df["part"] = np.where(df["steps"] == config.steps, "main", "budget")
    return df


#: Config fields only the analysis reads: a page analysing an earlier run's rows may change them.
ANALYSIS_PARAMETERS = ("n_boot", "n_boot_select", "min_effect", "tie_margin")
#: Parameters added after the release's rows were computed, with the value those rows had (docs/chapter-code.md).
READ_DEFAULTS: dict = {}


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without the list-valued columns (drift traces and logit quantiles; chapter 1 draws them)."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]
