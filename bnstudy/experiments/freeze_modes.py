"""Chapter 1: does a frozen backbone stay frozen? The four freeze modes, paired over seeds.

Stage 1 trains backbone + head A on task A; stage 2 freezes the backbone in one of the four
modes (:mod:`bnstudy.modes`), trains a new head on task B (shifted in brightness and
contrast) and measures task A again on the same held-out set. Within a seed every mode starts
from the same trained backbone, head-B initialisation and task-B batch stream.

``Config`` -> :func:`run` -> results table -> :func:`findings` (every number and verdict the
chapter's prose cites) and the tidy figure tables :func:`drift_table` and
:func:`logit_quantile_table`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analysis import Interval, mean_ci, paired, summarize, verdict
from ..config import Execution, RunConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label, HEAD_KINDS, OPTIMIZERS
from ..engine import DRIFT_STEPS, transfer_sweep
from ..modes import MODE_NAMES

NAMESPACE = "ch01_freeze_modes"
#: The profiles' settings (everything else is a ``Config`` default).
PROFILES = {"quick": dict(seeds=3), "full": dict(seeds=10)}
#: The weight left on the old running statistics that counts as "gone" in the prose.
GONE = 1e-3
#: The drift figure's noise floor is read at recorded steps where (1 - m)^t is below this.
FLOOR_WEIGHT = 1e-4
METRICS = ("task_a_before", "task_a_after", "task_b", "max_param_change", "max_buffer_change",
           "max_old_logit_change")


def steps_until(momentum: float, weight: float = GONE) -> int:
    """The first step ``t`` at which ``(1 - momentum) ** t`` falls below ``weight``.

    Raises ``ValueError`` unless ``0 < momentum <= 1`` and ``0 < weight < 1``.
    """
    check_float("momentum", momentum, 0.0, 1.0, low_open=True)
    check_float("weight", weight, 0.0, 1.0, low_open=True)
    if momentum == 1.0:
        return 1
    return math.floor(math.log(weight) / math.log(1 - momentum)) + 1


def floor_steps(momentum: float, steps: int) -> list[int]:
    """Recorded drift steps (:data:`bnstudy.engine.DRIFT_STEPS`) up to ``steps`` where ``(1 - m)^t < 1e-4``."""
    return [t for t in DRIFT_STEPS if 0 < t <= steps and (1 - momentum) ** t < FLOOR_WEIGHT]


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 1's parameters (the notebook's parameters cell, one for one).

    ``seeds``: an int ``n`` (seeds 0..n-1) or a list. ``modes``: freeze modes to run.
    ``steps``: stage-2 steps. ``brightness`` (template std units) and ``contrast`` (a gain):
    task B's shift. ``noise``: per-pixel noise std of both tasks. ``momentum``: BatchNorm
    momentum, in (0, 1] here (the drift analysis needs a fixed momentum; the library also
    accepts ``None``). ``head``, ``optimizer``, ``lr``: the new head and how it is trained.
    Raises ``ValueError`` naming the parameter for any bad value, before any work starts.
    """

    profile: str = "quick"
    seeds: tuple = (0, 1, 2)
    modes: tuple = MODE_NAMES
    steps: int = 800
    brightness: float = 4.0
    contrast: float = 5.0
    noise: float = 3.0
    momentum: float = 0.1
    head: str = "linear"
    optimizer: str = "sgd"
    lr: float = 0.05

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("modes", check_sequence("modes", self.modes, lambda n, v: check_choice(n, v, MODE_NAMES), 1))
        if self.momentum is None:
            raise ValueError("momentum must be a number in (0, 1] for this chapter (its drift analysis compares "
                             "with (1 - momentum)^t); momentum=None (a cumulative average) is accepted by the "
                             "library but not here")
        self._set("momentum", check_float("momentum", self.momentum, 0.0, 1.0, low_open=True))
        self._set("steps", check_int("steps", self.steps, 1))
        check_choice("head", self.head, HEAD_KINDS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        self.run_configs()  # validates every run's values with the engine's own messages
        if "train_mode" in self.modes and not floor_steps(self.momentum, self.steps):
            need = min((t for t in DRIFT_STEPS if (1 - self.momentum) ** t < FLOOR_WEIGHT), default=None)
            if need is None:
                raise ValueError(f"momentum={self.momentum} is too small for this chapter's drift analysis: "
                                 f"(1 - momentum)^t never falls below {FLOOR_WEIGHT} within "
                                 f"{max(DRIFT_STEPS)} recorded steps")
            raise ValueError(f"steps must be >= {need} for this chapter's drift analysis with "
                             f"momentum={self.momentum} (a recorded step where (1 - momentum)^t < {FLOOR_WEIGHT}), "
                             f"got {self.steps}")

    def run_configs(self) -> list[RunConfig]:
        """One :class:`RunConfig` per (seed, mode), seeds outermost."""
        return [RunConfig(seed=s, mode=m, steps=self.steps, brightness=self.brightness, contrast=self.contrast,
                          noise=self.noise, momentum=self.momentum, head=self.head, optimizer=self.optimizer,
                          lr=self.lr)
                for s in self.seeds for m in self.modes]

    def describe(self) -> str:
        """The parameters for the page's run line."""
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, "
                f"brightness={self.brightness:g}, contrast={self.contrast:g}, noise={self.noise:g}, "
                f"momentum={self.momentum:g}, head={self.head}, optimizer={self.optimizer}, lr={self.lr:g}")


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``seeds=None``: the profile's)."""
    return from_profile(Config, PROFILES, profile, **overrides)


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run chapter 1's experiment; one row per (seed, mode), columns of :func:`bnstudy.engine.transfer`."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs a freeze_modes.Config (see make_config), got {type(config).__name__}")
    return transfer_sweep(config.run_configs(), NAMESPACE, execution)


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without the list-valued columns (those are in the tidy tables below)."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]


def drift_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy drift table of ``train_mode`` runs: ``seed, layer, step, weight`` (weight left on task A's running_mean)."""
    tm = df[df["mode"] == "train_mode"]
    cols = sorted(c for c in df.columns if c.startswith("drift_weight_l"))
    recs = [dict(seed=r["seed"], layer=f"block {int(col.rsplit('l', 1)[1]) + 1}", step=t, weight=w)
            for _, r in tm.iterrows() for col in cols for t, w in zip(r["drift_steps"], r[col])]
    return pd.DataFrame(recs, columns=["seed", "layer", "step", "weight"])


def logit_quantile_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy table of the old head's absolute logit change: ``mode, seed, quantile, change``."""
    qs = np.linspace(0, 1, 21)
    recs = [dict(mode=r["mode"], seed=r["seed"], quantile=q, change=v)
            for _, r in df.iterrows() for q, v in zip(qs, r["old_logit_change_q"])]
    return pd.DataFrame(recs, columns=["mode", "seed", "quantile", "change"])


@dataclass(frozen=True)
class Findings:
    """Every number and verdict chapter 1's prose cites (accuracies are fractions 0..1).

    ``summary``: per mode and metric, mean and 95% interval over seeds. Verdicts are
    ``"holds"`` / ``"does not hold"`` (``f2_chance`` may also be ``"holds in part"``: task A
    falls significantly but not to about chance). ``gap_b``: paired ``task_b(train_mode) -
    task_b(pinned)`` per pinned mode; ``diff_b_separate``: ``task_b(separate_stats) -
    task_b(train_mode)``.
    """

    n_seeds: int
    chance: float
    momentum: float
    steps_gone: int
    summary: pd.DataFrame
    f1_weights_unchanged: str
    f2_chance: str
    f2_buffers_move: str
    f3_pinned_keep_a: str
    f3_pinned_lower_b: str
    f4_separate_exact: str
    f4_separate_matches_b: str
    separate_equals_train_b_every_seed: bool
    gap_b: dict
    diff_b_separate: Interval


def findings(df: pd.DataFrame) -> Findings:
    """Chapter 1's findings from its results table (all four modes and at least two seeds needed).

    The seed article's four findings, each with its test:
    1. every weight unchanged (== 0, every seed and mode); 2. in ``train_mode`` task A falls to
    about chance (mean within 1.5x chance; "in part" if it only falls significantly below
    where it started), and the running statistics move by more than one unit in every seed;
    3. the pinned modes keep task A exactly (after == before in every seed) and score lower on
    task B than ``train_mode`` (paired 95% interval above zero, each pinned mode); 4.
    ``separate_stats`` keeps task A's logits bit-identical (== 0) and matches ``train_mode`` on
    task B (paired interval contains zero). Raises ``ValueError`` if a mode is missing.
    """
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    chance = 1 / int(df["n_classes"].iloc[0])
    m = float(df["momentum"].iloc[0])
    piv = {c: df.pivot(index="seed", columns="mode", values=c) for c in METRICS}
    a_tm = mean_ci(piv["task_a_after"]["train_mode"])
    if a_tm.mean <= 1.5 * chance:
        f2 = "holds"
    elif a_tm.high < mean_ci(piv["task_a_before"]["train_mode"]).low:
        f2 = "holds in part"
    else:
        f2 = "does not hold"
    gaps = {p: mean_ci(paired(df, "task_b", "mode", "train_mode", p)) for p in ("backbone_eval", "all_eval")}
    d4 = mean_ci(paired(df, "task_b", "mode", "separate_stats", "train_mode"))
    return Findings(
        n_seeds=int(df["seed"].nunique()), chance=chance, momentum=m, steps_gone=steps_until(m),
        summary=summarize(df, "mode", METRICS),
        f1_weights_unchanged=verdict(bool((df["max_param_change"] == 0).all())),
        f2_chance=f2,
        f2_buffers_move=verdict(bool(piv["max_buffer_change"]["train_mode"].min() > 1)),
        f3_pinned_keep_a=verdict(all((piv["task_a_after"][p] == piv["task_a_before"][p]).all()
                                     for p in ("backbone_eval", "all_eval"))),
        f3_pinned_lower_b=verdict(all(g.low > 0 for g in gaps.values())),
        f4_separate_exact=verdict(bool((piv["max_old_logit_change"]["separate_stats"] == 0).all())),
        f4_separate_matches_b=verdict(d4.low <= 0 <= d4.high),
        separate_equals_train_b_every_seed=bool((piv["task_b"]["separate_stats"] == piv["task_b"]["train_mode"]).all()),
        gap_b=gaps, diff_b_separate=d4,
    )


@dataclass(frozen=True)
class DriftFindings:
    """The drift figure's numbers: weight left on task A's running_mean against ``(1 - m)^t``.

    ``floor`` per layer: RMS of the measured weight at recorded steps where the prediction is
    below 1e-4 (the moving average's own noise); ``last_step``: the last recorded step whose
    prediction is above every layer's floor.
    """

    floor: pd.Series
    floor_first_step: int
    floor_last_step: int
    weight_12: pd.Series
    theory_12: float
    last_step: int
    theory_last: float
    weight_last: pd.Series


def drift_findings(drift: pd.DataFrame, momentum: float, steps: int) -> DriftFindings:
    """Numbers for the drift figure from :func:`drift_table`'s output.

    Raises ``ValueError`` if no recorded step up to ``steps`` has ``(1 - momentum)^t < 1e-4``.
    """
    fs = floor_steps(momentum, steps)
    if not fs:
        raise ValueError(f"no recorded step up to steps={steps} has (1 - momentum)^t < {FLOOR_WEIGHT}")
    floor = drift[drift.step.isin(fs)].groupby("layer")["weight"].apply(lambda v: float(np.sqrt(np.mean(v ** 2))))
    above = [s for s in sorted(drift.step.unique()) if (1 - momentum) ** s > floor.max()]
    last = max(above)
    mean_at = lambda t: drift[drift.step == t].groupby("layer")["weight"].mean()
    return DriftFindings(floor=floor, floor_first_step=min(fs), floor_last_step=max(fs), weight_12=mean_at(12),
                         theory_12=(1 - momentum) ** 12, last_step=int(last), theory_last=(1 - momentum) ** last,
                         weight_last=mean_at(last))
