"""Chapter 4: does the head absorb the shift? Head depth, the head's own normalization, and its optimizer.

Chapter 1 found that pinning the backbone's statistics (``backbone_eval``, ``all_eval``) keeps
task A exactly but leaves the new head with task-B features normalized by task A's
statistics, and that with SGD and momentum the new head then scores lower on task B than
with task B's own statistics (the seed article's finding 3). This module asks whether a
different head or a different head optimizer closes that gap:

* heads (:func:`bnstudy.models.make_head`, ``hidden`` units per hidden layer, 64 by default):
  ``linear``; ``mlp`` (one hidden layer); ``mlp2`` (two); ``mlp_bn`` (one, with its own
  BatchNorm1d and running statistics); ``mlp_ln`` (one, with its own LayerNorm);
* optimizers (:func:`bnstudy.engine.make_optimizer`): ``sgd`` (momentum 0.9), ``sgd_plain``
  (no momentum), ``adam``, each at a learning rate chosen per head, mode and shift by the same
  small search (:func:`lr_search`, :func:`chosen_lrs_by_shift`) on held-out tuning seeds and a
  task-B *validation* set (``RunConfig(eval_split="validation")``), never on the reported seeds
  or the test set;
* the four freeze modes; three shifts: none, chapter 1's ``(brightness 4, contrast 5)`` and one
  point between on chapter 3's ``both`` line (:func:`bnstudy.experiments.shift_strength.shift_of`).

Within a seed every head, optimizer and mode sees the same trained backbone and the same
task-B batch stream, and every mode and optimizer of a head the same head initialization
(the engine draws it from ``(seed, "init", "head_b", head)``): comparisons are paired per seed.

The *gap* of a (shift, head, optimizer) cell is ``task_b(best pinned mode) -
task_b(separate_stats)`` per seed, the best pinned mode being the one of ``backbone_eval`` /
``all_eval`` with the higher mean over seeds. Its interval is Bonferroni-corrected over the
head x optimizer cells of that shift. ``Config`` -> :func:`run` -> results table ->
:func:`findings`; the tidy figure tables :func:`gap_table`, :func:`accuracy_table`,
:func:`search_table`; the measured explanation :func:`feature_geometry`; the buffer audit
:func:`audit_buffers`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.stats as sps
import torch

from ..analysis import Interval, mean_ci
from ..config import Execution, RunConfig, SourceConfig, _Frozen, check_choice, check_float, check_int, \
    check_seeds, check_sequence, from_profile, seeds_label, HEAD_KINDS, OPTIMIZERS as ALL_OPTIMIZERS
from ..engine import seeded, train_source, transfer_sweep
from ..models import ConvBackbone, make_head
from ..modes import MODE_NAMES, TransferModel, get_mode
from ..sweep import reset_sweep_counts, run_sweep, sweep_counts
from ..tasks import BatchStream, eval_set, generator, make_task
from .shift_strength import shift_of

NAMESPACE = "ch04_heads"
SEARCH_NAMESPACE = "ch04_lr_search"
FEATURE_NAMESPACE = "ch04_features"
#: Parameters that only change the analysis: a page given ``rows`` (an earlier run's tables) may differ from
#: that run in these, in nothing else.
ANALYSIS_PARAMETERS = ("margin",)
#: The tables a run saves beside ``04_heads.csv`` (``04_heads_<suffix>.csv``) that the page's analysis needs
#: (:func:`run_tables`): the search's runs, the step-count check's runs, the per-seed feature geometry and the
#: units the run computed or read from the cache.
SIBLING_TABLES = ("search_runs", "steps", "features", "units")
# How the run went, not what it computed: a verification (rebuilt from cached units) skips them.
RUN_STATE_COLUMNS = {"units": ("computed",)}
HEADS = ("linear", "mlp", "mlp2", "mlp_bn", "mlp_ln")
OPTIMIZERS = ("sgd", "sgd_plain", "adam")
PINNED_MODES = ("backbone_eval", "all_eval")
#: Chapter 1's shift (RunConfig's defaults).
REFERENCE_SHIFT = (RunConfig.brightness, RunConfig.contrast)
#: Names of the three shifts in results, glue keys and figures.
SHIFT_NAMES = ("none", "mid", "ref")
#: Verdict words of a gap cell. ``within margin``: the corrected interval lies inside ``±margin`` (an
#: equivalence test; not a claim of a tie beyond that margin); ``inconclusive``: the interval spans zero and
#: reaches past the margin. ``CLOSED`` and ``UNRESOLVED`` are the older names of the same two words.
WITHIN, LOWER, HIGHER, INCONCLUSIVE = "within margin", "pinned lower", "pinned higher", "inconclusive"
CLOSED, UNRESOLVED = WITHIN, INCONCLUSIVE
#: Verdict words of the optimizer interaction (gap with Adam minus gap with SGD + momentum, per seed).
ADAM_HIGHER, ADAM_LOWER = "gap higher with Adam", "gap lower with Adam"

#: Learning-rate grids of the search, half a decade apart. SGD with momentum 0.9 takes steps about
#: 1 / (1 - 0.9) = 10 times larger than plain SGD at the same rate, so plain SGD's grid is ten times higher.
LR_GRIDS = {"sgd": (0.005, 0.016, 0.05, 0.16), "sgd_plain": (0.05, 0.16, 0.5, 1.6),
            "adam": (0.001, 0.003, 0.01, 0.03)}

#: Profile sizes (the only place they are set). quick: 2 heads, 2 seeds, 150 steps, one tuning seed;
#: full: every head, 10 seeds, chapter 1's 800 steps, three tuning seeds, and wider grids. The full run at
#: c40bf27 (rates chosen per mode on its search) found the best rate at an end of the grid for separate
#: statistics at the top (linear/sgd 0.16, linear/adam 0.1) and for pinned statistics at the bottom
#: (sgd_plain 0.016), so the full grids reach one point further on those sides: sgd 0.0016..0.5,
#: sgd_plain 0.005..1.6, adam 0.0003..0.3. ``steps_check``: the longer budget of the step-count check
#: (:func:`steps_check`) on the first ``steps_check_seeds`` seeds.
PROFILES = {
    "quick": dict(seeds=2, steps=150, heads=("linear", "mlp_bn"), tuning_seeds=(1000,), feature_seeds=2,
                  steps_check=600, steps_check_seeds=2),
    "full": dict(seeds=10, steps=800, heads=HEADS, tuning_seeds=(1000, 1001, 1002), feature_seeds=10,
                 lr_sgd=(0.0016, *LR_GRIDS["sgd"], 0.5), lr_sgd_plain=(0.005, 0.016, *LR_GRIDS["sgd_plain"]),
                 lr_adam=(0.0003, *LR_GRIDS["adam"], 0.1, 0.3), steps_check=3200, steps_check_seeds=3),
}
#: The head and optimizers of the step-count check (the seed's head; the two optimizers of the chapter 1
#: contrast) and its modes (the other two give the same task-B numbers for a linear head, see the checks).
#: The heads every page configuration must include: the seed's linear head (finding 3, the step check, the link
#: test) and the head with its own BatchNorm (where backbone_eval and all_eval differ).
PAGE_HEADS = ("linear", "mlp_bn")
STEPS_CHECK_HEAD, STEPS_CHECK_OPTIMIZERS, STEPS_CHECK_MODES = "linear", ("sgd", "adam"), ("backbone_eval",
                                                                                         "separate_stats")


def _grid(name: str, value) -> tuple:
    out = check_sequence(name, value, lambda n, v: check_float(n, v, 0.0, low_open=True), 1)
    if list(out) != sorted(set(out)):
        raise ValueError(f"{name} must be strictly increasing, got {list(out)!r}")
    return out


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 4's parameters (the notebook's parameters cell, one for one).

    ``seeds``: reported seeds (int n: 0..n-1, or a list). ``steps``: stage-2 steps. ``heads`` and
    ``optimizers``: subsets of :data:`HEADS` / :data:`OPTIMIZERS`. ``mid_strength``: the middle shift
    as a strength ``t`` on chapter 3's ``both`` line (brightness ``4t``, contrast ``1 + 4t``), in
    (0, 1). ``tuning_seeds``: held-out seeds of the learning-rate search (disjoint from ``seeds``).
    ``lr_sgd``, ``lr_sgd_plain``, ``lr_adam``: each optimizer's grid (increasing). ``feature_seeds``:
    seeds (the first of ``seeds``) of the feature-geometry measurement. ``margin``: the equivalence
    margin (accuracy fraction) within which a gap counts as "within margin". ``steps_check`` (> ``steps``)
    and ``steps_check_seeds`` (2 up to the number of seeds): the step-count check's budget and seeds. ``hidden``, ``noise``,
    ``momentum``, ``batch_size``, ``n_eval``, ``stage1_steps``: run sizes (RunConfig's defaults).
    Raises ``ValueError`` naming the parameter for any bad value, before any work starts.
    """

    profile: str
    seeds: tuple
    steps: int
    heads: tuple
    tuning_seeds: tuple
    feature_seeds: int
    optimizers: tuple = OPTIMIZERS
    mid_strength: float = 0.25
    lr_sgd: tuple = LR_GRIDS["sgd"]
    lr_sgd_plain: tuple = LR_GRIDS["sgd_plain"]
    lr_adam: tuple = LR_GRIDS["adam"]
    margin: float = 0.02
    steps_check: int = 3200
    steps_check_seeds: int = 3
    hidden: int = RunConfig.hidden
    noise: float = RunConfig.noise
    momentum: float = RunConfig.momentum
    batch_size: int = RunConfig.batch_size
    n_eval: int = RunConfig.n_eval
    stage1_steps: int = RunConfig.stage1_steps

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("steps", check_int("steps", self.steps, 1))
        for name, allowed in (("heads", HEADS), ("optimizers", OPTIMIZERS)):
            v = check_sequence(name, getattr(self, name), lambda n, x, a=allowed: check_choice(n, x, a), 1)
            if len(set(v)) != len(v):
                raise ValueError(f"{name} must not repeat an entry, got {list(v)}")
            self._set(name, v)
        missing = [h for h in PAGE_HEADS if h not in self.heads]
        if missing:
            raise ValueError(f"heads must include {' and '.join(map(repr, PAGE_HEADS))} (the page's verdicts are "
                             f"read from the seed's linear head and its BatchNorm section from mlp_bn; the other "
                             f"heads are optional); {missing} missing from {list(self.heads)}")
        missing = [o for o in OPTIMIZERS if o not in self.optimizers]
        if missing:
            raise ValueError(f"optimizers must list all of {list(OPTIMIZERS)} (the page reports each; the order "
                             f"sets the tables' order); {missing} missing from {list(self.optimizers)}")
        ts = check_sequence("tuning_seeds", self.tuning_seeds, lambda n, v: check_int(n, v, 0), 1)
        if set(ts) & set(self.seeds):
            raise ValueError(f"tuning_seeds must be disjoint from seeds (a learning rate chosen on a reported seed "
                             f"biases it); both contain {sorted(set(ts) & set(self.seeds))}")
        self._set("tuning_seeds", ts)
        self._set("feature_seeds", check_int("feature_seeds", self.feature_seeds, 1))
        self._set("mid_strength", check_float("mid_strength", self.mid_strength, 0.0, 1.0, low_open=True))
        if self.mid_strength >= 1.0:
            raise ValueError(f"mid_strength must be a number > 0.0 and < 1.0 (between no shift and chapter 1's), "
                             f"got {self.mid_strength!r}")
        for opt in OPTIMIZERS:
            self._set(f"lr_{opt}", _grid(f"lr_{opt}", getattr(self, f"lr_{opt}")))
        self._set("margin", check_float("margin", self.margin, 0.0, 1.0, low_open=True))
        self._set("steps_check", check_int("steps_check", self.steps_check, 1))
        if self.steps_check <= self.steps:
            raise ValueError(f"steps_check must be larger than steps ({self.steps}): it checks a longer budget, "
                             f"got {self.steps_check}")
        # at least 2: the step check's 95% intervals are over these seeds (one value has no interval)
        self._set("steps_check_seeds", check_int("steps_check_seeds", self.steps_check_seeds, 2))
        if self.steps_check_seeds > len(self.seeds):
            raise ValueError(f"steps_check_seeds must be at most the number of seeds ({len(self.seeds)}), "
                             f"got {self.steps_check_seeds}")
        self._set("hidden", check_int("hidden", self.hidden, 1))
        RunConfig(**self._base())  # sizes checked with the engine's own messages
        self.shifts()

    def _base(self) -> dict:
        return dict(noise=self.noise, momentum=self.momentum, batch_size=self.batch_size, n_eval=self.n_eval,
                    hidden=self.hidden, steps=self.steps, stage1_steps=self.stage1_steps)

    def shifts(self) -> dict[str, tuple[float, float]]:
        """``{name: (brightness, contrast)}`` for ``none``, ``mid`` and ``ref`` (chapter 1's)."""
        return {"none": (0.0, 1.0), "mid": shift_of("both", self.mid_strength), "ref": REFERENCE_SHIFT}

    def lr_grid(self, optimizer: str) -> tuple:
        """The learning-rate grid searched for ``optimizer``."""
        return getattr(self, f"lr_{optimizer}")

    def search_configs(self) -> list[RunConfig]:
        """The search: tuning seeds x shifts x heads x optimizers x grid x modes, scored on the validation set.
        Every shift gets its own search: a rate tuned on one shift's pinned features (steep at chapter 1's)
        would be a mismatch on another's."""
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr, mode=m, brightness=b, contrast=c,
                          eval_split="validation", **self._base())
                for s in self.tuning_seeds for (b, c) in self.shifts().values() for h in self.heads
                for o in self.optimizers for lr in self.lr_grid(o) for m in MODE_NAMES]

    def _per_shift(self, lrs: dict) -> dict:
        """``lrs`` as ``{shift: rates}``: a dict keyed by every shift name is taken as per shift; any other
        (``{(head, opt, mode): lr}`` or ``{(head, opt): lr}``) is used at every shift."""
        names = set(self.shifts())
        return lrs if lrs and set(lrs) == names else {n: lrs for n in names}

    def run_configs(self, lrs: dict) -> list[RunConfig]:
        """The sweep: seeds x shifts x heads x optimizers x modes. ``lrs``: :func:`chosen_lrs_by_shift`'s
        ``{shift: {(head, opt, mode): lr}}`` (each shift's own search, the chapter's), or one
        ``{(head, opt, mode): lr}`` / mode-averaged ``{(head, opt): lr}`` used at every shift."""
        per = self._per_shift(lrs)
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr_of(per[n], h, o, m), mode=m, brightness=b,
                          contrast=c, **self._base())
                for s in self.seeds for n, (b, c) in self.shifts().items() for h in self.heads
                for o in self.optimizers for m in MODE_NAMES]

    def steps_check_configs(self, lrs: dict) -> list[RunConfig]:
        """The step-count check: the first ``steps_check_seeds`` seeds, chapter 1's shift, the linear head,
        SGD + momentum and Adam (those of ``optimizers``), ``backbone_eval`` and ``separate_stats``, each at its
        chosen rate, for ``steps_check`` steps (the same stream, longer)."""
        b, c = REFERENCE_SHIFT
        base = {**self._base(), "steps": self.steps_check}
        opts = [o for o in STEPS_CHECK_OPTIMIZERS if o in self.optimizers]
        if STEPS_CHECK_HEAD not in self.heads or not opts:
            return []
        h, ref = STEPS_CHECK_HEAD, self._per_shift(lrs)["ref"]
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr_of(ref, h, o, m), mode=m, brightness=b, contrast=c,
                          **base)
                for s in self.seeds[:self.steps_check_seeds] for o in opts for m in STEPS_CHECK_MODES]

    def describe(self) -> str:
        """The parameters for the page's run line."""
        b, c = self.shifts()["mid"]
        grids = "; ".join(f"{o} " + "/".join(f"{v:g}" for v in self.lr_grid(o)) for o in self.optimizers)
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, heads={'/'.join(self.heads)}, "
                f"optimizers={'/'.join(self.optimizers)}, shifts none/(b={b:g}, c={c:g})/(b={REFERENCE_SHIFT[0]:g}, "
                f"c={REFERENCE_SHIFT[1]:g}), tuning seeds {'/'.join(map(str, self.tuning_seeds))}, lr grids {grids}, "
                f"hidden={self.hidden}, margin={self.margin:g}, steps check {self.steps_check} steps on "
                f"{self.steps_check_seeds} seeds, noise={self.noise:g}")


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the learning-rate search ------------------------------------------------------------------------------------

def lr_search(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run the learning-rate search (cached); one row per run, ``task_b`` on the task-B *validation* set, with
    ``shift`` (:func:`annotate`): each shift is searched on its own."""
    if not isinstance(config, Config):
        raise TypeError(f"lr_search needs a heads.Config (see make_config), got {type(config).__name__}")
    return annotate(transfer_sweep(config.search_configs(), SEARCH_NAMESPACE, execution,
                                   desc="stage 2 (learning-rate search)"), config)


def search_table(search: pd.DataFrame) -> pd.DataFrame:
    """Tidy search table: ``[shift,] head, optimizer, lr, mode, val_accuracy`` (mean over tuning seeds; ``shift``
    when the search has that column), plus ``mode="mean"``: the mean over the four modes, the criterion of a
    single compromise rate."""
    by = (["shift"] if "shift" in search.columns else []) + ["head", "optimizer", "lr"]
    t = search.groupby(by + ["mode"], sort=False)["task_b"].mean().rename("val_accuracy").reset_index()
    crit = t.groupby(by, sort=False)["val_accuracy"].mean().reset_index().assign(mode="mean")
    return pd.concat([t, crit[t.columns]], ignore_index=True)


def search_at(search: pd.DataFrame, shift: str | None) -> pd.DataFrame:
    """The search's rows at one ``shift`` (without the column). ``shift=None`` accepts only a search of a single
    shift (or one without the column). Raises ``ValueError`` naming the shifts present otherwise."""
    if "shift" not in search.columns:
        return search
    present = list(dict.fromkeys(search["shift"]))
    if shift is None:
        if len(present) > 1:
            raise ValueError(f"the search covers shifts {present}; give shift= (one of them) or use "
                             f"chosen_lrs_by_shift")
        return search.drop(columns="shift")
    if shift not in present:
        raise ValueError(f"shift must be one of the searched shifts {present}, got {shift!r}")
    return search[search["shift"] == shift].drop(columns="shift")


def lr_of(lrs: dict, head: str, optimizer: str, mode: str) -> float:
    """The rate of one run: ``lrs[(head, optimizer, mode)]`` if chosen per mode, else ``lrs[(head, optimizer)]``.
    Raises ``KeyError`` naming the run if neither is there."""
    for k in ((head, optimizer, mode), (head, optimizer)):
        if k in lrs:
            return float(lrs[k])
    raise KeyError(f"no learning rate for head={head!r}, optimizer={optimizer!r}, mode={mode!r}")


def chosen_lrs(search: pd.DataFrame, rule: str = "per_mode", shift: str | None = None) -> dict:
    """The learning rates chosen on the search (validation accuracy, tuning seeds; ties: the smaller rate).

    ``rule="per_mode"`` (the chapter's): ``{(head, optimizer, mode): lr}``, each mode at the grid value with
    its own highest mean validation accuracy. This answers "can each mode be made as good as possible?": a
    single rate per head would be a compromise between the pinned and the separate optimum, which sit far
    apart. ``rule="mean"`` (the first full run's rule, kept as a sensitivity view): ``{(head, optimizer):
    lr}``, the value with the highest accuracy averaged over the four modes. ``shift``: the shift whose search
    decides (:func:`search_at`; ``None`` for a search of one shift). Raises ``ValueError`` for another rule,
    a search not scored on the validation set, or a missing or ambiguous ``shift``.
    """
    check_choice("rule", rule, ("per_mode", "mean"))
    search = search_at(search, shift)
    if set(search.get("eval_split", pd.Series(["validation"]))) != {"validation"}:
        raise ValueError("chosen_lrs: the search must be scored on the validation set (eval_split='validation')")
    t = search_table(search)
    if rule == "mean":
        t, keys = t[t["mode"] == "mean"], ["head", "optimizer"]
    else:
        t, keys = t[t["mode"] != "mean"], ["head", "optimizer", "mode"]
    out = {}
    for k, g in t.sort_values("lr").groupby(keys, sort=False):
        out[tuple(k)] = float(g[g["val_accuracy"] == g["val_accuracy"].max()]["lr"].min())
    return out


def chosen_lrs_by_shift(search: pd.DataFrame, rule: str = "per_mode") -> dict:
    """:func:`chosen_lrs` for every shift the search covers: ``{shift: {(head, optimizer, mode): lr}}`` (the
    chapter's sweep runs each shift at its own rates). Raises ``ValueError`` if the search has no ``shift``."""
    if "shift" not in search.columns:
        raise ValueError("chosen_lrs_by_shift needs the search's shift column (lr_search adds it)")
    return {s: chosen_lrs(search, rule, s) for s in dict.fromkeys(search["shift"])}


def lr_edges(lrs: dict, grids: dict) -> list[tuple]:
    """The chosen rates at an end of their grid: ``[(key, lr, "top" | "bottom"), ...]`` (``key`` as in
    ``lrs``), in ``lrs``' order. A rate at the top (bottom) end might be beaten by a larger (smaller) one."""
    out = []
    for k, v in lrs.items():
        g = grids.get(k[1])
        if g is None or len(g) < 2:
            continue
        if v == max(g):
            out.append((k, v, "top"))
        elif v == min(g):
            out.append((k, v, "bottom"))
    return out


@dataclass(frozen=True)
class LrChoice:
    """One shift's chosen rates for the page: ``lrs`` (``{"<head>_<optimizer>_<mode>": lr}``), ``n_lr`` of
    them, ``n_lr_at_edge`` at an end of their grid and ``lr_edge_cells`` naming those (:func:`lr_edges`)."""

    lrs: dict
    n_lr: int
    n_lr_at_edge: int
    lr_edge_cells: str


def lr_choice_findings(lrs: dict, grids: dict) -> LrChoice:
    """:class:`LrChoice` from one shift's :func:`chosen_lrs` and the grids (``{optimizer: grid}``)."""
    edges = lr_edges(lrs, grids)
    return LrChoice(lrs={"_".join(k): float(v) for k, v in lrs.items()}, n_lr=len(lrs), n_lr_at_edge=len(edges),
                    lr_edge_cells=_edge_text(edges))


@dataclass(frozen=True)
class SearchFindings:
    """The learning-rate search read as a sensitivity check (tuning seeds, validation set; fractions 0..1).

    Per ``"<head>_<optimizer>"``: ``gap_own_rates`` = best pinned mode at its own best rate minus
    ``separate_stats`` at its own best rate (the chapter's rule); ``gap_mean_rate`` = the same two modes at the
    one rate the mode-averaged rule picks (the first full run's rule); ``lr_mean_rule`` that rate;
    ``lr_pinned`` / ``lr_separate`` each side's own best rate. No intervals: the search has few tuning seeds
    and selects its maxima, so these are descriptions of the search, not tests.
    """

    gap_own_rates: dict
    gap_mean_rate: dict
    lr_mean_rule: dict
    lr_pinned: dict
    lr_separate: dict


def search_findings(search: pd.DataFrame) -> SearchFindings:
    """:class:`SearchFindings` from :func:`lr_search`'s rows at one shift (:func:`search_at`; or any table with
    ``head, optimizer, lr, mode, task_b``). Raises ``ValueError`` if a pinned mode or ``separate_stats`` is
    missing, or the table covers several shifts."""
    search = search_at(search, None)
    missing = set((*PINNED_MODES, "separate_stats")) - set(search["mode"])
    if missing:
        raise ValueError(f"search_findings needs modes {sorted(missing)} in the search")
    t = search_table(search)
    own, at_mean, lr_mean, lr_p, lr_s = {}, {}, {}, {}, {}
    mean_rule = chosen_lrs(search, "mean")
    for (h, o), g in t[t["mode"] != "mean"].groupby(["head", "optimizer"], sort=False):
        piv = g.pivot(index="lr", columns="mode", values="val_accuracy").sort_index()
        pinned = piv[list(PINNED_MODES)].max(axis=1)
        k = f"{h}_{o}"
        own[k] = float(pinned.max() - piv["separate_stats"].max())
        lr_p[k] = float(pinned[pinned == pinned.max()].index.min())
        lr_s[k] = float(piv.index[piv["separate_stats"] == piv["separate_stats"].max()].min())
        lr_mean[k] = mean_rule[(h, o)]
        at_mean[k] = float(pinned[lr_mean[k]] - piv.loc[lr_mean[k], "separate_stats"])
    return SearchFindings(gap_own_rates=own, gap_mean_rate=at_mean, lr_mean_rule=lr_mean, lr_pinned=lr_p,
                          lr_separate=lr_s)


def run(config: Config, execution: Execution | None = None, lrs: dict | None = None) -> pd.DataFrame:
    """Chapter 4's sweep at the chosen learning rates (``lrs``: default, each mode's own at each shift,
    :func:`chosen_lrs_by_shift` of :func:`lr_search`; see :meth:`Config.run_configs` for the forms).

    One row per (seed, shift, head, optimizer, mode) with :func:`bnstudy.engine.transfer`'s columns
    and ``shift`` (:data:`SHIFT_NAMES`).
    """
    if not isinstance(config, Config):
        raise TypeError(f"run needs a heads.Config (see make_config), got {type(config).__name__}")
    if lrs is None:
        lrs = chosen_lrs_by_shift(lr_search(config, execution))
    df = transfer_sweep(config.run_configs(lrs), NAMESPACE, execution)
    return annotate(df, config)


STEPS_NAMESPACE = "ch04_steps"


def steps_check(config: Config, execution: Execution | None = None, lrs: dict | None = None) -> pd.DataFrame:
    """The step-count check (cached, namespace ``ch04_steps``): :meth:`Config.steps_check_configs` run for
    ``config.steps_check`` steps; rows as :func:`run`'s (with ``shift``): the linear head with SGD + momentum
    and Adam, which every :class:`Config` includes."""
    if not isinstance(config, Config):
        raise TypeError(f"steps_check needs a heads.Config (see make_config), got {type(config).__name__}")
    if lrs is None:
        lrs = chosen_lrs_by_shift(lr_search(config, execution))
    cfgs = config.steps_check_configs(lrs)
    if not cfgs:
        return pd.DataFrame()
    return annotate(transfer_sweep(cfgs, STEPS_NAMESPACE, execution, desc="stage 2 (step-count check)"), config)


@dataclass(frozen=True)
class StepsFindings:
    """The step-count check at chapter 1's shift, linear head, per optimizer (``"sgd"``, ``"adam"``), on the
    check's seeds; 95% Student-t intervals over those seeds (fractions 0..1).

    ``steps_short`` / ``steps_long``: the two budgets; ``n_seeds``. ``gap_short`` / ``gap_long``:
    ``task_b(backbone_eval) - task_b(separate_stats)`` per seed at each budget; ``gap_change``: long minus
    short, per seed; ``change_verdict``: ``narrows`` / ``widens`` (the interval of ``gap_change`` excludes 0
    and the gap moves toward / away from zero) or ``inconclusive``; ``separate_gain`` / ``pinned_gain``:
    task-B accuracy long minus short for each mode (how far from converged the short budget is).
    """

    steps_short: int
    steps_long: int
    n_seeds: int
    gap_short: dict
    gap_long: dict
    gap_change: dict
    change_verdict: dict
    separate_gain: dict
    pinned_gain: dict


def steps_findings(short: pd.DataFrame, long: pd.DataFrame) -> StepsFindings:
    """:class:`StepsFindings` from the main sweep's rows (``short``) and :func:`steps_check`'s (``long``),
    paired on the long table's seeds. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    if not len(long):
        raise ValueError("steps_findings: the step-count check has no rows (linear head and sgd/adam needed)")
    seeds = sorted(set(long["seed"]))
    sel = lambda d, o, m: d[(d["shift"] == "ref") & (d["head"] == STEPS_CHECK_HEAD) & (d["optimizer"] == o)
                            & (d["mode"] == m) & d["seed"].isin(seeds)].set_index("seed")["task_b"].reindex(seeds)
    gs, gl, gc, vd, sep, pin = {}, {}, {}, {}, {}, {}
    for o in [o for o in STEPS_CHECK_OPTIMIZERS if o in set(long["optimizer"])]:
        ps, ss, pl, sl = sel(short, o, "backbone_eval"), sel(short, o, "separate_stats"), \
            sel(long, o, "backbone_eval"), sel(long, o, "separate_stats")
        if pd.concat([ps, ss, pl, sl]).isna().any():
            raise ValueError(f"steps_findings: optimizer {o!r} lacks backbone_eval or separate_stats for some seed")
        gs[o], gl[o], gc[o] = mean_ci(ps - ss), mean_ci(pl - sl), mean_ci((pl - sl) - (ps - ss))
        toward = np.sign(gc[o].mean) == -np.sign(gs[o].mean)
        vd[o] = INCONCLUSIVE if len(seeds) < 3 or (gc[o].low <= 0 <= gc[o].high) else \
            ("narrows" if toward else "widens")
        sep[o], pin[o] = mean_ci(sl - ss), mean_ci(pl - ps)
    return StepsFindings(steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]),
                         n_seeds=len(seeds), gap_short=gs, gap_long=gl, gap_change=gc, change_verdict=vd,
                         separate_gain=sep, pinned_gain=pin)


def annotate(df: pd.DataFrame, config: Config) -> pd.DataFrame:
    """``df`` with a ``shift`` column naming each row's shift (``none``, ``mid``, ``ref``)."""
    names = {v: k for k, v in config.shifts().items()}
    out = df.copy()
    out["shift"] = [names[(float(b), float(c))] for b, c in zip(out["brightness"], out["contrast"])]
    return out


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without list-valued columns (drift traces and logit quantiles; chapter 1 draws them)."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]


def units_table(counts: dict) -> pd.DataFrame:
    """``namespace, computed, total`` per run-cache namespace, from :func:`bnstudy.sweep.sweep_counts`'s
    ``{namespace: (computed, total)}`` (units given to the sweeps, and how many were computed, not read from
    the cache)."""
    return pd.DataFrame([dict(namespace=k, computed=int(c), total=int(t)) for k, (c, t) in counts.items()],
                        columns=["namespace", "computed", "total"])


def units_counts(table: pd.DataFrame) -> dict:
    """:func:`units_table`'s inverse: ``{namespace: (computed, total)}`` for :func:`cost_findings`."""
    return {str(r.namespace): (int(r.computed), int(r.total)) for r in table.itertuples(index=False)}


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """Everything chapter 4's page analyses, as the tables it saves: ``(results_table(runs), {"search_runs":
    results_table(search), "steps": results_table(step check), "features": feature geometry rows, "units":
    units_table(...)})`` (keys: :data:`SIBLING_TABLES`).

    Runs :func:`lr_search`, :func:`run` at each mode's own chosen rate (:func:`chosen_lrs`),
    :func:`steps_check` and :func:`feature_geometry`, all cached. ``units`` counts the cached units this
    call computed or read (it resets :func:`bnstudy.sweep.sweep_counts`).
    """
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs a heads.Config (see make_config), got {type(config).__name__}")
    reset_sweep_counts()
    search = lr_search(config, execution)
    lrs = chosen_lrs_by_shift(search)
    df = run(config, execution, lrs)
    long = steps_check(config, execution, lrs)
    geom = feature_geometry(config, execution)
    return results_table(df), dict(search_runs=results_table(search), steps=results_table(long), features=geom,
                                   units=units_table(sweep_counts()))


# --- the gap and the findings ------------------------------------------------------------------------------------

def _confidence(n_cells: int, alpha: float = 0.05) -> float:
    return 1 - alpha / n_cells


def gap_values(df: pd.DataFrame, shift: str, head: str, optimizer: str) -> tuple[str, pd.Series]:
    """The best pinned mode of a cell and its per-seed gap ``task_b(pinned) - task_b(separate_stats)``.

    The best pinned mode has the higher mean task-B accuracy over seeds (``backbone_eval`` on a tie).
    Raises ``ValueError`` if the cell lacks a pinned mode or ``separate_stats`` for some seed.
    """
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    piv = cell.pivot(index="seed", columns="mode", values="task_b")
    for m in (*PINNED_MODES, "separate_stats"):
        if m not in piv.columns or piv[m].isna().any():
            raise ValueError(f"gap: mode {m!r} missing for some seed in cell ({shift}, {head}, {optimizer})")
    best = max(PINNED_MODES, key=lambda m: (piv[m].mean(), m == "backbone_eval"))
    return best, piv[best] - piv["separate_stats"]


def gap_verdict(iv: Interval, margin: float) -> str:
    """``within margin`` if the interval lies inside ``(-margin, margin)`` (an equivalence test, conservative:
    a corrected two-sided interval where TOST needs a one-sided one); ``pinned lower`` / ``pinned higher`` if it
    excludes zero; else ``inconclusive`` (it spans zero and reaches past the margin: neither a cost nor a tie is
    shown). With fewer than 3 seeds always ``inconclusive``: a 2-seed interval has one degree of freedom and
    collapses to a point whenever the two differences agree."""
    if iv.n < 3:
        return INCONCLUSIVE
    if -margin < iv.low and iv.high < margin:
        return WITHIN
    if iv.high < 0:
        return LOWER
    if iv.low > 0:
        return HIGHER
    return INCONCLUSIVE


def equivalence_max_sd(margin: float, n: int, confidence: float) -> float:
    """The largest per-seed standard deviation of a gap whose mean is exactly 0 that the equivalence test can
    still call ``within margin``: ``margin * sqrt(n) / t(confidence, n - 1)`` (the test's feasibility for the
    design). NaN for ``n < 2``."""
    if n < 2:
        return math.nan
    return float(margin * math.sqrt(n) / sps.t.ppf((1 + confidence) / 2, n - 1))


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Tidy gap table, one row per (shift, head, optimizer): ``best_pinned, mean, ci_low, ci_high, sd, n_seeds,
    confidence, verdict, task_b_pinned, task_b_separate``. Intervals are Student-t over seeds at confidence
    ``1 - alpha / m`` (Bonferroni over the ``m`` head x optimizer cells of each shift: the family is one
    shift); ``sd`` is the per-seed standard deviation of the gap."""
    rows = []
    for shift, g in df.groupby("shift", sort=False):
        cells = list(g[["head", "optimizer"]].drop_duplicates().itertuples(index=False))
        conf = _confidence(len(cells), alpha)
        for head, opt in cells:
            best, d = gap_values(df, shift, head, opt)
            iv = mean_ci(d, conf)
            c = g[(g["head"] == head) & (g["optimizer"] == opt)]
            rows.append(dict(shift=shift, head=head, optimizer=opt, best_pinned=best, mean=iv.mean, ci_low=iv.low,
                             ci_high=iv.high, sd=float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                             n_seeds=iv.n, confidence=conf, verdict=gap_verdict(iv, margin),
                             task_b_pinned=float(c[c["mode"] == best]["task_b"].mean()),
                             task_b_separate=float(c[c["mode"] == "separate_stats"]["task_b"].mean())))
    return pd.DataFrame(rows)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy task-B and task-A accuracy per ``shift, head, optimizer, mode``: ``metric, mean, ci_low, ci_high,
    n_seeds`` (95% Student-t over seeds, not corrected; for display)."""
    rows = []
    for key, g in df.groupby(["shift", "head", "optimizer", "mode"], sort=False):
        for metric in ("task_b", "task_a_after"):
            iv = mean_ci(g[metric])
            rows.append(dict(zip(("shift", "head", "optimizer", "mode"), key), metric=metric, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


def interaction_table(df: pd.DataFrame, a: str = "adam", b: str = "sgd", shift: str = "ref",
                      alpha: float = 0.05) -> pd.DataFrame:
    """The optimizer interaction per head at ``shift``: per seed, ``gap(a) - gap(b)`` (each cell's own best
    pinned mode), Student-t interval at confidence ``1 - alpha / n_heads`` (Bonferroni over the heads).
    Columns ``head, mean, ci_low, ci_high, n_seeds, confidence, verdict`` (``gap higher with Adam`` /
    ``gap lower with Adam`` / ``inconclusive``; no verdict below 3 seeds). Empty if ``a`` or ``b`` is
    missing."""
    d = df[df["shift"] == shift]
    if not {a, b} <= set(d["optimizer"]):
        return pd.DataFrame(columns=["head", "mean", "ci_low", "ci_high", "n_seeds", "confidence", "verdict"])
    heads = [h for h in dict.fromkeys(d["head"]) if {a, b} <= set(d[d["head"] == h]["optimizer"])]
    conf = _confidence(len(heads), alpha)
    rows = []
    for h in heads:
        diff = gap_values(df, shift, h, a)[1] - gap_values(df, shift, h, b)[1]
        iv = mean_ci(diff.dropna(), conf)
        word = INCONCLUSIVE if iv.n < 3 or iv.low <= 0 <= iv.high else (ADAM_HIGHER if iv.low > 0 else ADAM_LOWER)
        rows.append(dict(head=h, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n, confidence=conf,
                         verdict=word))
    return pd.DataFrame(rows)


HEAD_SMALLER, HEAD_LARGER = "smaller gap than linear", "larger gap than linear"


def head_contrast_table(df: pd.DataFrame, reference: str = STEPS_CHECK_HEAD, shift: str = "ref",
                        alpha: float = 0.05) -> pd.DataFrame:
    """Does a head change the gap? Per optimizer and head, per seed ``gap(head) - gap(reference)`` at ``shift``
    (each cell's own best pinned mode, :func:`gap_values`), Student-t interval at confidence
    ``1 - alpha / n`` (Bonferroni over the ``n`` head x optimizer contrasts). Columns ``head, optimizer, mean,
    ci_low, ci_high, n_seeds, confidence, verdict`` (``smaller gap than linear``: pinning costs less with that
    head; ``larger gap than linear``; ``inconclusive``, always below 3 seeds), ``separate`` /
    ``separate_reference``: the two heads' mean ``separate_stats`` task-B accuracy (a smaller gap can come from a
    worse separate side). Raises ``ValueError`` if
    ``reference`` has no rows at ``shift``."""
    d = df[df["shift"] == shift]
    if reference not in set(d["head"]):
        raise ValueError(f"head_contrast_table: reference head {reference!r} has no rows at shift {shift!r}")
    heads = [h for h in dict.fromkeys(d["head"]) if h != reference]
    opts = list(dict.fromkeys(d["optimizer"]))
    conf = _confidence(max(len(heads) * len(opts), 1), alpha)
    rows = []
    for o in opts:
        base = gap_values(df, shift, reference, o)[1]
        for h in heads:
            iv = mean_ci((gap_values(df, shift, h, o)[1] - base).dropna(), conf)
            word = INCONCLUSIVE if iv.n < 3 or iv.low <= 0 <= iv.high else (HEAD_SMALLER if iv.low > 0 else HEAD_LARGER)
            sep = lambda head: float(d[(d["head"] == head) & (d["optimizer"] == o)
                                       & (d["mode"] == "separate_stats")]["task_b"].mean())
            rows.append(dict(head=h, optimizer=o, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n,
                             confidence=conf, verdict=word, separate=sep(h), separate_reference=sep(reference)))
    return pd.DataFrame(rows, columns=["head", "optimizer", "mean", "ci_low", "ci_high", "n_seeds", "confidence",
                                       "verdict", "separate", "separate_reference"])


SHIFT_LARGER, SHIFT_SMALLER = "larger gap at the shift", "smaller gap at the shift"


def shift_contrast_table(df: pd.DataFrame, shift: str = "ref", base: str = "none", alpha: float = 0.05) -> pd.DataFrame:
    """Does the shift make the gap? Per head and optimizer, per seed ``gap(shift) - gap(base)`` (each cell's own
    best pinned mode at each shift, :func:`gap_values`; the pairing is the seed: same backbone, head
    initialization and task-B stream), Student-t interval at confidence ``1 - alpha / n`` (Bonferroni over the
    ``n`` cells). Columns ``head, optimizer, mean, ci_low, ci_high, n_seeds, confidence, verdict``
    (``larger gap at the shift``: the interval lies below zero, pinning costs more at ``shift``; ``smaller gap at
    the shift``; ``inconclusive``, always below 3 seeds). Raises ``ValueError`` if either shift has no rows."""
    for name in (shift, base):
        if name not in set(df["shift"]):
            raise ValueError(f"shift_contrast_table: no rows at shift {name!r}")
    d = df[df["shift"] == shift]
    cells = list(dict.fromkeys(zip(d["head"], d["optimizer"])))
    conf = _confidence(max(len(cells), 1), alpha)
    rows = []
    for h, o in cells:
        iv = mean_ci((gap_values(df, shift, h, o)[1] - gap_values(df, base, h, o)[1]).dropna(), conf)
        word = INCONCLUSIVE if iv.n < 3 or iv.low <= 0 <= iv.high else (SHIFT_LARGER if iv.high < 0 else SHIFT_SMALLER)
        rows.append(dict(head=h, optimizer=o, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n,
                         confidence=conf, verdict=word))
    return pd.DataFrame(rows, columns=["head", "optimizer", "mean", "ci_low", "ci_high", "n_seeds", "confidence",
                                       "verdict"])


@dataclass(frozen=True)
class ShiftContrast:
    """:func:`shift_contrast_table` for the prose: ``n_cells``, ``confidence``, counts and ``head/optimizer``
    lists of cells whose gap is larger / smaller at the shift (``none`` if empty), and the linear head's
    contrast with SGD + momentum (``linear_sgd``, an :class:`Interval`; NaN if absent)."""

    n_cells: int
    confidence: float
    n_larger: int
    n_smaller: int
    larger_cells: str
    smaller_cells: str
    linear_sgd: Interval


def shift_contrast_findings(table: pd.DataFrame) -> ShiftContrast:
    """:class:`ShiftContrast` from :func:`shift_contrast_table`'s output."""
    cells = lambda w: [f"{h}/{o}" for h, o, v in zip(table["head"], table["optimizer"], table["verdict"]) if v == w]
    lin = table[(table["head"] == "linear") & (table["optimizer"] == "sgd")]
    iv = (Interval(float(lin["mean"].iloc[0]), float(lin["ci_low"].iloc[0]), float(lin["ci_high"].iloc[0]),
                   int(lin["n_seeds"].iloc[0])) if len(lin) else Interval(math.nan, math.nan, math.nan, 0))
    return ShiftContrast(n_cells=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                         n_larger=len(cells(SHIFT_LARGER)), n_smaller=len(cells(SHIFT_SMALLER)),
                         larger_cells=_cells(cells(SHIFT_LARGER)), smaller_cells=_cells(cells(SHIFT_SMALLER)),
                         linear_sgd=iv)


def contrast_display(table: pd.DataFrame) -> pd.DataFrame:
    """A contrast table for the page (:func:`head_contrast_table`, :func:`shift_contrast_table`): heads in rows,
    optimizers in columns, ``mean [low, high] verdict``."""
    t = table.assign(cell=[f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] {v}" for m, lo, hi, v in
                           zip(table["mean"], table["ci_low"], table["ci_high"], table["verdict"])])
    return t.pivot(index="head", columns="optimizer", values="cell").reindex(
        index=list(dict.fromkeys(table["head"])), columns=list(dict.fromkeys(table["optimizer"])))


@dataclass(frozen=True)
class HeadContrast:
    """:func:`head_contrast_table` for the prose: ``n_contrasts``, ``confidence``, and the contrasts (``head/
    optimizer``) with a smaller / larger gap than the linear head (``smaller_cells`` / ``larger_cells``,
    ``none`` if empty) and their counts; ``n_smaller_worse_separate`` / ``smaller_worse_separate_cells``: those
    smaller-gap contrasts whose head reaches a lower ``separate_stats`` accuracy than the linear head (the gap
    shrinks from the separate side)."""

    n_contrasts: int
    confidence: float
    n_smaller: int
    n_larger: int
    smaller_cells: str
    larger_cells: str
    n_smaller_worse_separate: int
    smaller_worse_separate_cells: str


def head_contrast_findings(table: pd.DataFrame) -> HeadContrast:
    """:class:`HeadContrast` from :func:`head_contrast_table`'s output."""
    cells = lambda w: [f"{h}/{o}" for h, o, v in zip(table["head"], table["optimizer"], table["verdict"]) if v == w]
    worse = [f"{r.head}/{r.optimizer}" for r in table.itertuples()
             if r.verdict == HEAD_SMALLER and r.separate < r.separate_reference]
    return HeadContrast(n_contrasts=int(len(table)),
                        confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                        n_smaller=len(cells(HEAD_SMALLER)), n_larger=len(cells(HEAD_LARGER)),
                        smaller_cells=_cells(cells(HEAD_SMALLER)), larger_cells=_cells(cells(HEAD_LARGER)),
                        n_smaller_worse_separate=len(worse), smaller_worse_separate_cells=_cells(worse))


def head_contrast_display(table: pd.DataFrame) -> pd.DataFrame:
    """The page's head-contrast table: heads in rows, optimizers in columns, ``mean [low, high] verdict``
    (:func:`contrast_display`)."""
    return contrast_display(table)


@dataclass(frozen=True)
class Findings:
    """Every number and verdict chapter 4's prose cites (accuracies are fractions 0..1).

    Gap (``task_b(best pinned) - task_b(separate_stats)`` per seed): ``gap`` ``{"<shift>_<head>_<optimizer>":
    Interval}`` (Bonferroni-corrected over the cells of one shift, see :func:`gap_table`), ``gap_verdict`` the
    matching words (``within margin`` / ``pinned lower`` / ``pinned higher`` / ``inconclusive``), ``best_pinned``
    the pinned mode used, ``acc_pinned`` / ``acc_separate`` the two absolute task-B means. Counts per shift:
    ``n_within``, ``n_lower``, ``n_higher``, ``n_inconclusive``; ``within_ref`` / ``lower_ref``: those cells at
    chapter 1's shift as ``head/optimizer`` lists (``none`` if empty).

    Equivalence feasibility: ``equiv_max_sd``, the largest per-seed SD for which a gap of mean exactly 0 could be
    shown within the margin at this design (:func:`equivalence_max_sd`); ``equiv_sd_median`` and
    ``n_equiv_feasible`` per shift: the median observed SD and the cells whose SD is below ``equiv_max_sd``.

    Optimizer interaction at chapter 1's shift (:func:`interaction_table`): ``adam_vs_sgd`` per head and
    ``adam_vs_sgd_verdict``; ``interaction_confidence``.

    Finding 3 (the seed's, with its linear head at chapter 1's shift) per optimizer: ``f3_lower_b`` read from the
    same gap and the same corrected interval (``holds`` = pinned lower; ``inconclusive``; ``not shown`` = within
    margin; ``reversed`` = pinned higher); ``f3_heads_holding``: for how many heads the gap is ``pinned lower``;
    ``f3_rate_edge``: per optimizer, ``a rate at the grid's edge`` if one of the linear head's chosen rates (the
    verdict's pinned mode or ``separate_stats``) sits at an end of its grid (``lrs``, ``grids``), else
    ``rates inside the grid``.

    Checks (identities of the code, each ``holds`` / ``does not hold``, exact ``==``): ``check_train_is_separate``
    (``train_mode`` and ``separate_stats`` give the same task-B accuracy in every row: the same backbone
    statistics see the same stream), ``check_pinned_keep_a`` (task A after == before for both pinned modes),
    ``check_task_a_loss_shared`` (``train_mode``'s task-A accuracy after stage 2 is the same for every head and
    optimizer within a seed and shift: the head does not touch the backbone's buffers).
    ``train_mode_task_a_loss``: ``task_a_before - task_a_after`` of ``train_mode`` at chapter 1's shift (one
    head and optimizer, positive = lost).

    ``bn_head_modes_differ``: ``"<shift>_<optimizer>"`` -> ``task_b(backbone_eval) - task_b(all_eval)`` of
    ``mlp_bn`` (95%, uncorrected; NaN without ``mlp_bn``).

    Best absolute accuracy at chapter 1's shift: ``best_pinned_cell`` (``head/optimizer`` with the highest
    ``acc_pinned``), ``best_pinned_acc``, ``best_pinned_gap`` (its gap interval) and ``best_pinned_verdict``, ``best_separate_cell``,
    ``best_separate_acc``.

    ``lrs``: the chosen rates (``"<head>_<optimizer>[_<mode>]"``); ``n_lr_at_edge`` and ``lr_edge_cells`` (the
    runs' rates at an end of their grid, named, or ``none``).

    ``n_eval``: test images per accuracy (``n_eval`` column; 0 if absent); ``eval_se``: the binomial standard
    error ``sqrt(p (1 - p) / n_eval)`` of one accuracy at ``p`` = the mean ``separate_stats`` task-B accuracy
    at chapter 1's shift (NaN without ``n_eval``), the scale against which the margin is set; ``margin_in_se``:
    ``margin / eval_se`` (NaN without ``n_eval``).
    """

    n_seeds: int
    n_cells: int
    confidence: float
    margin: float
    chance: float
    gap: dict
    gap_verdict: dict
    best_pinned: dict
    acc_pinned: dict
    acc_separate: dict
    n_within: dict
    n_lower: dict
    n_higher: dict
    n_inconclusive: dict
    within_ref: str
    lower_ref: str
    equiv_max_sd: float
    equiv_sd_median: dict
    n_equiv_feasible: dict
    adam_vs_sgd: dict
    adam_vs_sgd_verdict: dict
    interaction_confidence: float
    f3_lower_b: dict
    f3_heads_holding: dict
    f3_rate_edge: dict
    check_train_is_separate: str
    check_pinned_keep_a: str
    check_task_a_loss_shared: str
    train_mode_task_a_loss: Interval
    bn_head_modes_differ: dict
    best_pinned_cell: str
    best_pinned_acc: float
    best_pinned_gap: Interval
    best_pinned_verdict: str
    best_separate_cell: str
    best_separate_acc: float
    lrs: dict
    n_lr_at_edge: int
    lr_edge_cells: str
    n_eval: int
    eval_se: float
    margin_in_se: float


def _cells(names) -> str:
    return ", ".join(names) if names else "none"


F3_WORDS = {LOWER: "holds", INCONCLUSIVE: "inconclusive", WITHIN: "not shown", HIGHER: "reversed"}


def _holds(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def _edge_text(edges) -> str:
    return _cells([f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges])


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05) -> Findings:
    """Chapter 4's findings from :func:`run`'s table (``shift`` column; all four modes; at least two seeds).

    ``lrs``: :func:`chosen_lrs`' output (per mode or per head and optimizer) and ``grids``
    (``{optimizer: grid}``) for the search's numbers. Raises ``ValueError`` if a mode or chapter 1's shift
    (``shift == "ref"``) is missing.
    """
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    if "ref" not in set(df["shift"]):
        raise ValueError("findings needs chapter 1's shift (rows with shift == 'ref')")
    gt = gap_table(df, margin, alpha)
    key = lambda r: f"{r['shift']}_{r['head']}_{r['optimizer']}"
    gap = {key(r): Interval(r["mean"], r["ci_low"], r["ci_high"], int(r["n_seeds"])) for _, r in gt.iterrows()}
    words = {key(r): r["verdict"] for _, r in gt.iterrows()}
    count = lambda w: {s: int((g["verdict"] == w).sum()) for s, g in gt.groupby("shift", sort=False)}
    ref = gt[gt["shift"] == "ref"]
    label = lambda d: [f"{h}/{o}" for h, o in zip(d["head"], d["optimizer"])]
    n = int(df["seed"].nunique())
    conf = float(ref["confidence"].iloc[0])
    max_sd = equivalence_max_sd(margin, n, conf)

    inter = interaction_table(df, alpha=alpha)
    opts = sorted(set(df["optimizer"]), key=lambda o: OPTIMIZERS.index(o) if o in OPTIMIZERS else 99)
    f3 = {o: (F3_WORDS[words[f"ref_linear_{o}"]] if f"ref_linear_{o}" in words else "not measured") for o in opts}
    holding = {o: int(((ref["optimizer"] == o) & (ref["verdict"] == LOWER)).sum()) for o in opts}

    piv = df.pivot_table(index=["shift", "head", "optimizer", "seed"], columns="mode", values="task_b",
                         aggfunc="first")
    pinned = df[df["mode"].isin(PINNED_MODES)]
    tm = df[df["mode"] == "train_mode"]
    shared = bool((tm.groupby(["shift", "seed"])["task_a_after"].nunique() == 1).all())
    first = tm[(tm["shift"] == "ref")]
    first = first[(first["head"] == first["head"].iloc[0]) & (first["optimizer"] == first["optimizer"].iloc[0])]
    loss = mean_ci(first["task_a_before"] - first["task_a_after"])

    bn = {}
    for shift in dict.fromkeys(df["shift"]):
        for o in opts:
            c = df[(df["shift"] == shift) & (df["optimizer"] == o) & (df["head"] == "mlp_bn")]
            if len(c):
                p = c.pivot(index="seed", columns="mode", values="task_b")
                bn[f"{shift}_{o}"] = mean_ci(p["backbone_eval"] - p["all_eval"])
            else:
                bn[f"{shift}_{o}"] = Interval(math.nan, math.nan, math.nan, 0)

    bp = ref.loc[ref["task_b_pinned"].idxmax()]
    bs = ref.loc[ref["task_b_separate"].idxmax()]
    lrs = lrs or {}
    edges = lr_edges(lrs, grids or {})
    edge_keys = {k for k, _, _ in edges}
    f3_edge = {}
    for o in opts:
        pm = gt[(gt["shift"] == "ref") & (gt["head"] == "linear") & (gt["optimizer"] == o)]["best_pinned"]
        ks = {("linear", o, m) for m in list(pm) + ["separate_stats"]} | {("linear", o)}
        f3_edge[o] = "a rate at the grid's edge" if ks & edge_keys else "rates inside the grid"
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df else 0
    p_sep = float(ref["task_b_separate"].mean())
    se = math.sqrt(p_sep * (1 - p_sep) / n_eval) if n_eval else math.nan
    return Findings(
        n_seeds=n, n_cells=int(len(ref)), confidence=conf, margin=margin,
        chance=1 / int(df["n_classes"].iloc[0]) if "n_classes" in df else 0.1,
        gap=gap, gap_verdict=words, best_pinned={key(r): r["best_pinned"] for _, r in gt.iterrows()},
        acc_pinned={key(r): float(r["task_b_pinned"]) for _, r in gt.iterrows()},
        acc_separate={key(r): float(r["task_b_separate"]) for _, r in gt.iterrows()},
        n_within=count(WITHIN), n_lower=count(LOWER), n_higher=count(HIGHER), n_inconclusive=count(INCONCLUSIVE),
        within_ref=_cells(label(ref[ref["verdict"] == WITHIN])), lower_ref=_cells(label(ref[ref["verdict"] == LOWER])),
        equiv_max_sd=max_sd,
        equiv_sd_median={s: float(g["sd"].median()) for s, g in gt.groupby("shift", sort=False)},
        n_equiv_feasible={s: int((g["sd"] < max_sd).sum()) for s, g in gt.groupby("shift", sort=False)},
        adam_vs_sgd={r["head"]: Interval(r["mean"], r["ci_low"], r["ci_high"], int(r["n_seeds"]))
                     for _, r in inter.iterrows()},
        adam_vs_sgd_verdict={r["head"]: r["verdict"] for _, r in inter.iterrows()},
        interaction_confidence=float(inter["confidence"].iloc[0]) if len(inter) else math.nan,
        f3_lower_b=f3, f3_heads_holding=holding, f3_rate_edge=f3_edge,
        check_train_is_separate=_holds(bool((piv["train_mode"] == piv["separate_stats"]).all())),
        check_pinned_keep_a=_holds(bool((pinned["task_a_after"] == pinned["task_a_before"]).all())),
        check_task_a_loss_shared=_holds(shared), train_mode_task_a_loss=loss, bn_head_modes_differ=bn,
        best_pinned_cell=f"{bp['head']}/{bp['optimizer']}", best_pinned_acc=float(bp["task_b_pinned"]),
        best_pinned_gap=gap[key(bp)], best_pinned_verdict=words[key(bp)], best_separate_cell=f"{bs['head']}/{bs['optimizer']}",
        best_separate_acc=float(bs["task_b_separate"]),
        lrs={"_".join(k): v for k, v in lrs.items()}, n_lr_at_edge=len(edges), lr_edge_cells=_edge_text(edges),
        n_eval=n_eval, eval_se=se, margin_in_se=margin / se if se > 0 else math.nan,
    )


def gap_display(F: Findings, heads, optimizers, shift: str = "ref") -> pd.DataFrame:
    """The page's gap table at ``shift``: one row per head, one column per optimizer, cells
    ``mean [low, high] verdict (pinned a / separate b)`` from :class:`Findings` (display only; the numbers
    are the findings')."""
    rows = {}
    for h in heads:
        rows[h] = {o: (f"{F.gap[k].mean:+.3f} [{F.gap[k].low:+.3f}, {F.gap[k].high:+.3f}] {F.gap_verdict[k]} "
                       f"(pinned {F.acc_pinned[k]:.3f} / separate {F.acc_separate[k]:.3f})"
                       if (k := f"{shift}_{h}_{o}") in F.gap else "") for o in optimizers}
    return pd.DataFrame.from_dict(rows, orient="index")


def interaction_display(F: Findings) -> pd.DataFrame:
    """The page's interaction table: per head, gap with Adam minus gap with SGD + momentum at chapter 1's
    shift, ``mean [low, high]`` and verdict (display only)."""
    return pd.DataFrame({h: {"Adam - SGD + momentum (gap difference)": f"{iv.mean:+.3f} [{iv.low:+.3f}, "
                                                                         f"{iv.high:+.3f}]",
                             "verdict": F.adam_vs_sgd_verdict[h]} for h, iv in F.adam_vs_sgd.items()}).T


def grid_text(grid) -> str:
    """A learning-rate grid for the page: ``0.005, 0.016, 0.05, 0.16``."""
    return ", ".join(f"{v:g}" for v in grid)


# --- why: what the pinned features look like to the head ---------------------------------------------------------

@dataclass(frozen=True)
class FeatureConfig(SourceConfig):
    """One feature-geometry measurement: a source backbone (:class:`SourceConfig`) at task-B shifts
    ``shifts`` (``((brightness, contrast), ...)``), ``n_features`` samples per set, ``population_batches``
    batches of ``batch_size`` for task B's own statistics."""

    shifts: tuple = (REFERENCE_SHIFT,)
    n_features: int = 2000
    population_batches: int = 20
    batch_size: int = RunConfig.batch_size

    def __post_init__(self):
        super().__post_init__()
        self._set("shifts", tuple(tuple(float(v) for v in s) for s in self.shifts))
        self._set("n_features", check_int("n_features", self.n_features, 2))
        self._set("population_batches", check_int("population_batches", self.population_batches, 1))
        self._set("batch_size", check_int("batch_size", self.batch_size, 2))

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(**{k: getattr(self, k) for k in SourceConfig.__dataclass_fields__})


@torch.no_grad()
def _features(backbone, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([backbone(x[i:i + 500]) for i in range(0, len(x), 500)]).double()


def _ridge_probe(f_train, y_train, f_test, y_test, n_classes: int, ridge: float = 1e-3) -> float:
    """Accuracy of a least-squares one-hot classifier on z-scored features (train statistics): what a linear
    head could reach with exact optimization, invariant to each feature's scale and offset."""
    mu, sd = f_train.mean(0), f_train.std(0).clamp_min(1e-12)
    z = lambda f: torch.cat([(f - mu) / sd, torch.ones(len(f), 1, dtype=f.dtype)], 1)
    X, Y = z(f_train), torch.nn.functional.one_hot(y_train, n_classes).double()
    W = torch.linalg.solve(X.T @ X + ridge * len(X) * torch.eye(X.shape[1], dtype=X.dtype), X.T @ Y)
    return float(((z(f_test) @ W).argmax(1) == y_test).double().mean())


def geometry_rows(cfg: FeatureConfig, source: dict) -> list[dict]:
    """Feature geometry of ``source``'s backbone on task B under pinned (task A's) and separate (task B's
    precise-BN) statistics, per shift. One row per (shift, statistics); see :func:`feature_geometry`."""
    from ..stats import update_bn_stats
    pinned = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
    pinned.load_state_dict(source["backbone"])
    pinned.eval()
    rows = []
    for b, c in cfg.shifts:
        task = make_task(cfg.seed, "B", cfg.n_classes, cfg.noise, b, c)
        stream = BatchStream(task, cfg.batch_size, generator(cfg.seed, "features", "population"))
        separate = copy.deepcopy(pinned)
        update_bn_stats(separate, [stream.next()[0] for _ in range(cfg.population_batches)])
        separate.eval()
        xtr, ytr = eval_set(task, cfg.n_features, cfg.seed, "B/features-train")
        xte, yte = eval_set(task, cfg.n_features, cfg.seed, "B/features-test")
        F = {name: (_features(m, xtr), _features(m, xte)) for name, m in (("pinned", pinned), ("separate", separate))}
        s_mu, s_sd = F["separate"][0].mean(0), F["separate"][0].std(0)
        live = s_sd > 1e-9
        for name, (ftr, fte) in F.items():
            mu, sd = ftr.mean(0), ftr.std(0)
            cov = torch.cov(ftr.T)
            second = ftr.T @ ftr / len(ftr)
            xs = F["separate"][0]
            r2 = []
            for j in torch.nonzero(live).flatten().tolist():  # affine fit of this feature on the separate one
                if sd[j] <= 1e-12:
                    r2.append(0.0)
                    continue
                r = torch.corrcoef(torch.stack([ftr[:, j], xs[:, j]]))[0, 1]
                r2.append(float(r ** 2))
            rows.append(dict(seed=cfg.seed, brightness=b, contrast=c, statistics=name,
                             scale_ratio=float((sd[live] / s_sd[live]).median()),
                             offset_sd=float(((mu[live] - s_mu[live]).abs() / s_sd[live]).median()),
                             dead_fraction=float((sd <= 1e-9).double().mean()),
                             affine_r2=float(np.median(r2)) if r2 else math.nan,
                             curvature=float(torch.linalg.eigvalsh(second)[-1]),
                             curvature_centered=float(torch.linalg.eigvalsh(cov)[-1]),
                             mean_share=float((mu @ mu) / torch.trace(second)),
                             probe_accuracy=_ridge_probe(ftr, ytr, fte, yte, cfg.n_classes)))
    return rows


def _feature_group(configs: list[FeatureConfig]) -> list[dict]:
    out = []
    for cfg in configs:
        rows = geometry_rows(cfg, train_source(cfg.source))
        out.append(dict(rows=rows))
    return out


def feature_geometry(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """What the backbone's 64 output features look like on task B under pinned and separate statistics.

    For the first ``config.feature_seeds`` seeds and each shift: ``scale_ratio`` (median over features of
    their standard deviation under these statistics over that under task B's own), ``offset_sd`` (median
    |mean difference| in separate-statistics standard deviations), ``dead_fraction`` (features constant at
    zero), ``affine_r2`` (median squared correlation with the same feature under separate statistics: 1 means
    an exact per-feature affine change, which one linear layer can undo), ``curvature`` (largest eigenvalue of
    the features' second moment E[f f^T], which bounds the stable step of gradient descent on a linear head)
    and ``curvature_centered`` (of the covariance: without the mean's rank-one part), ``mean_share``
    (||E f||^2 / E||f||^2) and ``probe_accuracy`` (a closed-form least-squares classifier on z-scored features:
    what exact optimization of a linear head reaches). Cached; one row per (seed, shift, statistics).
    """
    seeds = config.seeds[:config.feature_seeds]
    shifts = tuple(config.shifts().values())
    src = RunConfig(**config._base()).source
    cfgs = [FeatureConfig(**{**src.asdict(), "seed": s}, shifts=shifts, batch_size=config.batch_size) for s in seeds]
    res = run_sweep(cfgs, _feature_group, namespace=FEATURE_NAMESPACE, execution=execution,
                    cache_dir=None if execution is None else execution.cache_dir, desc="feature geometry")
    df = pd.DataFrame([r for rows in res["rows"] for r in rows])
    return annotate(df, config)


def geometry_summary(geom: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% interval over seeds of each geometry measure per ``shift, statistics`` (tidy)."""
    rows = []
    for key, g in geom.groupby(["shift", "statistics"], sort=False):
        for metric in ("scale_ratio", "offset_sd", "dead_fraction", "affine_r2", "curvature", "curvature_centered",
                       "mean_share", "probe_accuracy"):
            iv = mean_ci(g[metric])
            rows.append(dict(shift=key[0], statistics=key[1], metric=metric, mean=iv.mean, ci_low=iv.low,
                             ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class GeometryFindings:
    """The explanation's numbers at chapter 1's shift (means over seeds; intervals 95% Student-t)."""

    scale_ratio: float
    offset_sd: float
    dead_fraction: float
    affine_r2: float
    curvature_ratio: float
    curvature_centered_ratio: float
    mean_share_pinned: float
    mean_share_separate: float
    probe_pinned: float
    probe_separate: float
    probe_diff: Interval


def geometry_findings(geom: pd.DataFrame, shift: str = "ref") -> GeometryFindings:
    """The numbers the "why" section cites, from :func:`feature_geometry`'s table at ``shift``."""
    g = geom[geom["shift"] == shift]
    p = g[g["statistics"] == "pinned"].set_index("seed")
    s = g[g["statistics"] == "separate"].set_index("seed").loc[p.index]
    return GeometryFindings(
        scale_ratio=float(p["scale_ratio"].mean()), offset_sd=float(p["offset_sd"].mean()),
        dead_fraction=float(p["dead_fraction"].mean()), affine_r2=float(p["affine_r2"].mean()),
        curvature_ratio=float((p["curvature"] / s["curvature"]).mean()),
        curvature_centered_ratio=float((p["curvature_centered"] / s["curvature_centered"]).mean()),
        mean_share_pinned=float(p["mean_share"].mean()), mean_share_separate=float(s["mean_share"].mean()),
        probe_pinned=float(p["probe_accuracy"].mean()), probe_separate=float(s["probe_accuracy"].mean()),
        probe_diff=mean_ci(p["probe_accuracy"] - s["probe_accuracy"]))


#: The geometry measures the link test relates to the gap, and the sign of the correlation each explanation
#: predicts: a larger curvature ratio (steeper pinned features, the optimization story) should go with a more
#: negative gap; a more negative probe difference (information lost, the information story) likewise, so a
#: positive correlation.
LINK_MEASURES = {"curvature_ratio": -1, "probe_diff": 1}
#: Verdict words of the link test.
LINK_HOLDS, LINK_OPPOSITE, LINK_NOT_SHOWN, LINK_TOO_FEW = "holds", "opposite sign", "not shown", "too few seeds"


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (Pearson correlation of average ranks); NaN below 3 points or for a constant side."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    rx, ry = sps.rankdata(x), sps.rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx @ ry) / math.sqrt((rx @ rx) * (ry @ ry)))


def _spearman_rows(x: np.ndarray, y: np.ndarray, draws: list) -> np.ndarray:
    """:func:`_spearman` of ``(x[ix], y[ix])`` for every index array ``ix`` in ``draws`` (vectorized when the
    draws have equal lengths)."""
    if len({len(ix) for ix in draws}) != 1 or len(draws[0]) < 3:
        return np.array([_spearman(x[ix], y[ix]) for ix in draws])
    ix = np.stack(draws)
    rx, ry = sps.rankdata(x[ix], axis=1), sps.rankdata(y[ix], axis=1)
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    den = np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(1) / np.where(den > 0, den, 1.0), np.nan)


def link_table(df: pd.DataFrame, geom: pd.DataFrame, head: str = "linear", n_boot: int = 2000,
               confidence: float = 0.95, min_seeds: int = 5, seed: int = 0) -> pd.DataFrame:
    """Does the feature geometry track the gap? Spearman rank correlation between a per-seed geometry measure
    and the per-seed gap of ``head`` (``task_b(best pinned) - task_b(separate_stats)``, :func:`gap_values`),
    per optimizer, from rows the run already has (no training).

    Measures (:data:`LINK_MEASURES`), per seed and shift from :func:`feature_geometry`'s table:
    ``curvature_ratio`` = pinned / separate largest eigenvalue of E[f f^T]; ``probe_diff`` = pinned minus
    separate closed-form probe accuracy. Scopes: ``ref`` (chapter 1's shift, one point per seed: the
    seed-to-seed link) and ``all`` (every shift, one point per seed and shift; this mixes in the shift's own
    effect on both sides). Interval: percentile bootstrap over seeds (a seed keeps all its shifts), ``n_boot``
    resamples from ``numpy.random.default_rng(seed)`` (the same resamples for both measures), at ``confidence`` (not corrected over the rows).
    ``verdict``: ``holds`` (the interval excludes 0 on the predicted side), ``opposite sign``, ``not shown``
    (it spans 0), ``too few seeds`` (fewer than ``min_seeds`` seeds: NaN interval).

    Columns ``scope, optimizer, measure, predicted_sign, rho, ci_low, ci_high, n_seeds, n_points, verdict``.
    Empty (those columns) if ``head`` is not in ``df``. Raises ``ValueError`` if ``geom`` lacks a measure's
    columns.
    """
    cols = ["scope", "optimizer", "measure", "predicted_sign", "rho", "ci_low", "ci_high", "n_seeds", "n_points",
            "verdict"]
    need = {"seed", "shift", "statistics", "curvature", "probe_accuracy"} - set(geom.columns)
    if need:
        raise ValueError(f"link_table: the geometry table lacks columns {sorted(need)}")
    if head not in set(df["head"]):
        return pd.DataFrame(columns=cols)
    p = geom[geom["statistics"] == "pinned"].set_index(["seed", "shift"])
    q = geom[geom["statistics"] == "separate"].set_index(["seed", "shift"]).reindex(p.index)
    meas = pd.DataFrame({"curvature_ratio": p["curvature"] / q["curvature"],
                         "probe_diff": p["probe_accuracy"] - q["probe_accuracy"]}).reset_index()
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2
    rows = []
    opts = [o for o in OPTIMIZERS if o in set(df[df["head"] == head]["optimizer"])]
    for o in opts:
        gaps = []
        for shift in dict.fromkeys(df["shift"]):
            gv = gap_values(df, shift, head, o)[1]
            gaps.append(pd.DataFrame({"seed": gv.index, "shift": shift, "gap": gv.to_numpy()}))
        tab = meas.merge(pd.concat(gaps), on=["seed", "shift"]).dropna()
        for scope in ("ref", "all"):
            t = tab[tab["shift"] == "ref"] if scope == "ref" else tab
            seeds = np.array(sorted(set(t["seed"])))
            rows_of = [np.flatnonzero(t["seed"].to_numpy() == s) for s in seeds]
            draws = [np.concatenate([rows_of[i] for i in rng.integers(0, len(seeds), len(seeds))])
                     for _ in range(n_boot)] if len(seeds) >= min_seeds else []
            y = t["gap"].to_numpy()
            for m, sign in LINK_MEASURES.items():
                x = t[m].to_numpy()
                rho = _spearman(x, y)
                lo = hi = math.nan
                if draws:
                    boots = _spearman_rows(x, y, draws)
                    boots = boots[~np.isnan(boots)]
                    if len(boots):
                        lo, hi = float(np.percentile(boots, lo_q)), float(np.percentile(boots, hi_q))
                if len(seeds) < min_seeds or math.isnan(lo):
                    word = LINK_TOO_FEW
                elif lo <= 0 <= hi:
                    word = LINK_NOT_SHOWN
                else:
                    word = LINK_HOLDS if np.sign(lo) == sign else LINK_OPPOSITE
                rows.append(dict(scope=scope, optimizer=o, measure=m, predicted_sign=sign, rho=rho, ci_low=lo,
                                 ci_high=hi, n_seeds=len(seeds), n_points=len(t), verdict=word))
    return pd.DataFrame(rows, columns=cols)


@dataclass(frozen=True)
class LinkFindings:
    """The link test's numbers (:func:`link_table`), keyed ``"<scope>_<optimizer>_<measure>"``: ``rho`` an
    :class:`Interval` (Spearman rho, bootstrap interval, ``n`` = seeds), ``verdict`` the words; ``head`` the head
    tested; ``n_holds`` / ``n_tests``: rows whose verdict is ``holds`` / rows with a verdict other than ``too few
    seeds``, and the same per scope (``n_holds_ref`` / ``n_tests_ref``: one point per seed at chapter 1's
    shift; ``n_holds_all`` / ``n_tests_all``: pooled over shifts, which the shift itself drives);
    ``confidence`` of each (uncorrected) interval."""

    head: str
    rho: dict
    verdict: dict
    n_holds: int
    n_tests: int
    n_holds_ref: int
    n_tests_ref: int
    n_holds_all: int
    n_tests_all: int
    confidence: float


def link_findings(table: pd.DataFrame, head: str = "linear", confidence: float = 0.95) -> LinkFindings:
    """:class:`LinkFindings` from :func:`link_table`'s output (which was computed for ``head`` at ``confidence``)."""
    key = lambda r: f"{r['scope']}_{r['optimizer']}_{r['measure']}"
    return LinkFindings(
        head=head, rho={key(r): Interval(float(r["rho"]), float(r["ci_low"]), float(r["ci_high"]), int(r["n_seeds"]))
                        for _, r in table.iterrows()},
        verdict={key(r): r["verdict"] for _, r in table.iterrows()},
        n_holds=int((table["verdict"] == LINK_HOLDS).sum()),
        n_tests=int((table["verdict"] != LINK_TOO_FEW).sum()),
        n_holds_ref=int(((table["verdict"] == LINK_HOLDS) & (table["scope"] == "ref")).sum()),
        n_tests_ref=int(((table["verdict"] != LINK_TOO_FEW) & (table["scope"] == "ref")).sum()),
        n_holds_all=int(((table["verdict"] == LINK_HOLDS) & (table["scope"] == "all")).sum()),
        n_tests_all=int(((table["verdict"] != LINK_TOO_FEW) & (table["scope"] == "all")).sum()),
        confidence=confidence)


def link_texts(table: pd.DataFrame) -> dict:
    """The page's words for each :func:`link_table` row, keyed ``"<scope>_<optimizer>_<measure>"`` (Markdown,
    to follow "$\\rho$"): ``= +0.12 (-0.30 to +0.50): **holds**``; without an interval (fewer seeds than the
    test needs) ``= -0.83, no interval (**too few seeds**)``; without a correlation at all (fewer than 3 points
    or a constant side) ``not computed (2 seeds, one point each: **too few seeds**)``. Never prints NaN."""
    out = {}
    for r in table.itertuples(index=False):
        word = f"**{r.verdict}**"
        if math.isnan(r.rho):
            where = f"{r.n_seeds} seeds, one point each" if r.n_points == r.n_seeds else f"{r.n_points} points"
            text = f"not computed ({where}: {word})"
        elif math.isnan(r.ci_low) or math.isnan(r.ci_high):
            text = f"= {r.rho:+.2f}, no interval ({word})"
        else:
            text = f"= {r.rho:+.2f} ({r.ci_low:+.2f} to {r.ci_high:+.2f}): {word}"
        out[f"{r.scope}_{r.optimizer}_{r.measure}"] = text
    return out


def link_display(table: pd.DataFrame) -> pd.DataFrame:
    """The page's link table (display only), indexed by ``scope, optimizer, measure``: ``predicted, rho,
    n_seeds, n_points, verdict``, ``rho`` as ``+0.12 [-0.30, +0.50]``, ``-0.83 [no interval]`` or ``not computed``."""
    def rho(r, lo, hi):
        if math.isnan(r):
            return "not computed"
        return f"{r:+.2f} [no interval]" if math.isnan(lo) or math.isnan(hi) else f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return table.assign(rho=[rho(*v) for v in zip(table["rho"], table["ci_low"], table["ci_high"])],
                        predicted=["negative" if s < 0 else "positive" for s in table["predicted_sign"]])[
        ["scope", "optimizer", "measure", "predicted", "rho", "n_seeds", "n_points", "verdict"]].set_index(
        ["scope", "optimizer", "measure"])  # a meaningful index: the page shows no bare row numbers


# --- the audit: which buffers each mode lets move, with a head that has its own BatchNorm ---------------------------

PARTS = ("backbone", "backbone_b", "head_b")


def audit_buffers(seed: int = 0, head: str = "mlp_bn", steps: int = 5, brightness: float = REFERENCE_SHIFT[0],
                  contrast: float = REFERENCE_SHIFT[1], stage1_steps: int = 50) -> tuple[pd.DataFrame, dict]:
    """Run ``steps`` stage-2 steps in each freeze mode inside a :class:`bnstudy.audit.FreezeAudit` and report
    which running statistics moved.

    Returns a tidy table ``mode, part, declared, moved, max_change`` (``part``: ``backbone``, ``backbone_b``
    (separate_stats' copy), ``head_b``; ``declared``: listed in :attr:`FreezeMode.buffers_may_change`;
    ``moved``: some running_mean/running_var there changed; ``max_change``: the largest absolute change) and
    the audits by mode. The backbone comes from a short stage 1 (``stage1_steps``): the audit is about which
    buffers move, not about accuracy.
    """
    from ..audit import FreezeAudit
    src_cfg = SourceConfig(seed=seed, stage1_steps=stage1_steps)
    source = train_source(src_cfg)
    task = make_task(seed, "B", src_cfg.n_classes, src_cfg.noise, brightness, contrast)
    rows, audits = [], {}
    for name in MODE_NAMES:
        mode = get_mode(name)
        backbone = ConvBackbone(3, src_cfg.widths, src_cfg.norm, src_cfg.momentum)
        backbone.load_state_dict(source["backbone"])
        head_a = make_head("linear", backbone.out_features, src_cfg.n_classes)
        head_a.load_state_dict(source["head_a"])
        head_b = seeded((seed, "init", "audit_head", head), lambda: make_head(head, backbone.out_features,
                                                                              src_cfg.n_classes))
        model = mode.apply(TransferModel(backbone, head_a, head_b))
        opt = torch.optim.SGD(model.head_b.parameters(), lr=0.01)
        stream = BatchStream(task, 64, generator(seed, "audit", "B"))
        with FreezeAudit(model, warn=False) as a:
            for _ in range(steps):
                model.train()
                x, y = stream.next()
                loss = torch.nn.functional.cross_entropy(model.forward_b(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        audits[name] = a
        rep = a.report()
        stats = rep[rep["tensor"].str.endswith(("running_mean", "running_var"))] if "tensor" in rep else rep
        for part in PARTS:
            inside = stats[stats["module"].map(lambda m, p=part: m == p or m.startswith(p + "."))]
            if part == "backbone_b" and not len(inside):
                continue
            ch = inside["max_abs_change"].fillna(0)
            rows.append(dict(mode=name, part=part, declared=part in mode.buffers_may_change,
                             moved=bool((ch > 0).any()), max_change=float(ch.max()) if len(ch) else 0.0))
    return pd.DataFrame(rows), audits


def audit_matches_declaration(table: pd.DataFrame) -> bool:
    """Whether every part moved exactly where its mode declares it may (``moved == declared`` on every row)."""
    return bool((table["moved"] == table["declared"]).all())


# --- what this execution cost ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostFindings:
    """What the page's execution cost and whether that is a cold-cache time.

    ``wall_min``: minutes of wall time; ``n_computed`` of ``n_units`` cached units (stage-1 sources, search,
    sweep, step check and feature runs, summed over :func:`bnstudy.sweep.sweep_counts`) were computed in this
    execution, ``n_cached`` read from the run cache; ``cache_state``: ``cold`` (every unit computed), ``warm``
    (none) or ``partly warm``; ``threads_per_run``: torch threads each run used
    (:attr:`bnstudy.config.Execution.threads`, the sidecars' ``torch_threads_per_run``).
    """

    wall_min: float
    n_computed: int
    n_units: int
    n_cached: int
    cache_state: str
    threads_per_run: int


def cost_findings(counts: dict, wall_s: float, threads_per_run: int = 1) -> CostFindings:
    """:class:`CostFindings` from ``counts`` (``{namespace: (computed, total)}``, as
    :func:`bnstudy.sweep.sweep_counts` returns) and the wall time ``wall_s`` in seconds (``None``: not
    recorded, ``wall_min`` is NaN). Raises ``ValueError``
    if a namespace claims more computed units than it has."""
    bad = [k for k, (c, t) in counts.items() if not 0 <= c <= t]
    if bad:
        raise ValueError(f"cost_findings: counts must satisfy 0 <= computed <= total, not for {bad}")
    n_c = int(sum(c for c, _ in counts.values()))
    n_t = int(sum(t for _, t in counts.values()))
    state = "cold" if n_t and n_c == n_t else ("warm" if n_c == 0 else "partly warm")
    return CostFindings(wall_min=float("nan") if wall_s is None else float(wall_s) / 60, n_computed=n_c, n_units=n_t, n_cached=n_t - n_c,
                        cache_state=state, threads_per_run=int(threads_per_run))
