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
  point between on chapter 3's ``both`` line (:func:`bnstudy.experiments.shift_strength.run.shift_of`).

Within a seed every head, optimizer and mode sees the same trained backbone and the same
task-B batch stream, and every mode and optimizer of a head the same head initialization
(the engine draws it from ``(seed, "init", "head_b", head)``): comparisons are paired per seed.

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed
(condition minus the pinned reference, the book's one sign: positive when pinning costs the new task). Every
interval, test and verdict comes from :mod:`bnstudy.inference`: the cells of one shift are one family
(Bonferroni intervals, equivalence at ``alpha / m``, Holm counts). ``Config`` -> :func:`run` -> results table ->
:func:`findings` (a claims table and a small :class:`Record`); the tidy figure tables :func:`gap_table`,
:func:`accuracy_table`, :func:`search_table`; the measured explanation :func:`feature_geometry`; the buffer audit
:func:`audit_buffers`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..inference import MIN_BOOTSTRAP_UNITS, NOT_DECIDED, TOO_FEW, Claim, Family, Interval, bootstrap_interval, \
    claims_table, count_verdicts, decide, decide_interval, equivalent_text, exact_check, paired_differences, \
    rank_correlation, t_interval
from ..config import Execution, RunConfig, SourceConfig, _Frozen, check_choice, check_float, check_int, \
    check_seeds, check_sequence, from_profile, seeds_label, HEAD_KINDS, OPTIMIZERS as ALL_OPTIMIZERS
from ..engine import seeded, train_source, transfer_sweep
from ..models import ConvBackbone, make_head
from ..modes import MODE_NAMES, TransferModel, get_mode
from ..sweep import reset_sweep_counts, run_sweep, sweep_counts
from ..tasks import BatchStream, eval_set, generator, make_task
from .shift_strength.run import shift_of

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
#: The reference of every freeze-mode comparison on this page (the glossary's): the pinned backbone. A gap is
#: ``task_b(separate_stats) - task_b(backbone_eval)`` per seed: positive when pinning costs the new task.
REFERENCE_MODE = "backbone_eval"
#: Direction words of the page's verdicts (:func:`bnstudy.inference.decide`), each (higher, lower) pair naming
#: the direction of *condition minus reference*: the gap ``separate_stats - backbone_eval`` of a cell;
GAP_HIGHER, GAP_LOWER = "separate_stats higher", "separate_stats lower"
#: the optimizer interaction ``gap(adam) - gap(sgd)``;
ADAM_HIGHER, ADAM_LOWER = "gap larger with Adam", "gap smaller with Adam"
#: the head contrast ``gap(head) - gap(linear)``;
HEAD_LARGER, HEAD_SMALLER = "larger gap than linear", "smaller gap than linear"
#: the shift contrast ``gap(ref) - gap(none)``;
SHIFT_LARGER, SHIFT_SMALLER = "larger gap at the shift", "smaller gap at the shift"
#: the step check ``gap(long budget) - gap(short budget)``;
STEPS_LARGER, STEPS_SMALLER = "gap larger with more steps", "gap smaller with more steps"
#: the BatchNorm head's two pinned modes, ``all_eval - backbone_eval``;
BN_HIGHER, BN_LOWER = "all_eval higher", "all_eval lower"
#: the link test: a rank correlation above / below zero.
LINK_POSITIVE, LINK_NEGATIVE = "rank correlation positive", "rank correlation negative"
#: Every direction word this page may print (``inference.is_verdict(text, DIRECTIONS)``).
DIRECTIONS = (GAP_HIGHER, GAP_LOWER, ADAM_HIGHER, ADAM_LOWER, HEAD_LARGER, HEAD_SMALLER, SHIFT_LARGER, SHIFT_SMALLER,
              STEPS_LARGER, STEPS_SMALLER, BN_HIGHER, BN_LOWER, LINK_POSITIVE, LINK_NEGATIVE)
#: The families of the page's claims (the ``family`` column of the claims tables) and the range each
#: quantity allows, to which printed interval ends are cut (:func:`bnstudy.pages.glue_claims`' ``clip``):
#: accuracy differences lie in [-1, 1], differences of two gaps in [-2, 2], rank correlations in [-1, 1].
CLIPS = {"gap": (-1, 1), "interaction": (-2, 2), "hc": (-2, 2), "sc": (-2, 2), "bn": (-1, 1), "steps": (-2, 2),
         "checks": None, "link": (-1, 1)}

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
    margin (accuracy fraction) of the equivalence tests (``"equivalent within ±margin"``). ``steps_check`` (> ``steps``)
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

    Per ``"<head>_<optimizer>"``: ``gap_own_rates`` = ``separate_stats`` at its own best rate minus
    ``backbone_eval`` at its own best rate (the chapter's rule; the book's sign, positive when pinning costs);
    ``gap_mean_rate`` = the same two modes at the one rate the mode-averaged rule picks (the first full run's
    rule); ``lr_mean_rule`` that rate; ``lr_pinned`` / ``lr_separate`` each side's own best rate. No intervals:
    the search has few tuning seeds and selects its maxima, so these are descriptions of the search, not tests.
    """

    gap_own_rates: dict
    gap_mean_rate: dict
    lr_mean_rule: dict
    lr_pinned: dict
    lr_separate: dict


def search_findings(search: pd.DataFrame) -> SearchFindings:
    """:class:`SearchFindings` from :func:`lr_search`'s rows at one shift (:func:`search_at`; or any table with
    ``head, optimizer, lr, mode, task_b``). Raises ``ValueError`` if ``backbone_eval`` or ``separate_stats`` is
    missing, or the table covers several shifts."""
    search = search_at(search, None)
    missing = {REFERENCE_MODE, "separate_stats"} - set(search["mode"])
    if missing:
        raise ValueError(f"search_findings needs modes {sorted(missing)} in the search")
    t = search_table(search)
    own, at_mean, lr_mean, lr_p, lr_s = {}, {}, {}, {}, {}
    mean_rule = chosen_lrs(search, "mean")
    for (h, o), g in t[t["mode"] != "mean"].groupby(["head", "optimizer"], sort=False):
        piv = g.pivot(index="lr", columns="mode", values="val_accuracy").sort_index()
        pinned, sep = piv[REFERENCE_MODE], piv["separate_stats"]
        k = f"{h}_{o}"
        own[k] = float(sep.max() - pinned.max())
        lr_p[k] = float(pinned.index[pinned == pinned.max()].min())
        lr_s[k] = float(sep.index[sep == sep.max()].min())
        lr_mean[k] = mean_rule[(h, o)]
        at_mean[k] = float(sep[lr_mean[k]] - pinned[lr_mean[k]])
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
    check's seeds; 95% Student-t intervals over those seeds (:func:`bnstudy.inference.t_interval`; fractions 0..1).

    ``steps_short`` / ``steps_long``: the two budgets; ``n_seeds``. ``gap_short`` / ``gap_long``:
    ``task_b(separate_stats) - task_b(backbone_eval)`` per seed at each budget; ``separate_gain`` /
    ``pinned_gain``: task-B accuracy long minus short for each mode (how far from converged the short budget
    is). The change of the gap and its verdict: :func:`steps_claims`.
    """

    steps_short: int
    steps_long: int
    n_seeds: int
    gap_short: dict
    gap_long: dict
    separate_gain: dict
    pinned_gain: dict


def _steps_pairs(short: pd.DataFrame, long: pd.DataFrame) -> tuple[list, dict]:
    """The check's seeds and, per optimizer, the per-seed task-B series ``(pinned short, separate short, pinned
    long, separate long)``. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    if not len(long):
        raise ValueError("steps_findings: the step-count check has no rows (linear head and sgd/adam needed)")
    seeds = sorted(set(long["seed"]))
    sel = lambda d, o, m: d[(d["shift"] == "ref") & (d["head"] == STEPS_CHECK_HEAD) & (d["optimizer"] == o)
                            & (d["mode"] == m) & d["seed"].isin(seeds)].set_index("seed")["task_b"].reindex(seeds)
    out = {}
    for o in [o for o in STEPS_CHECK_OPTIMIZERS if o in set(long["optimizer"])]:
        parts = tuple(sel(d, o, m) for d in (short, long) for m in (REFERENCE_MODE, "separate_stats"))
        if pd.concat(parts).isna().any():
            raise ValueError(f"steps_findings: optimizer {o!r} lacks backbone_eval or separate_stats for some seed")
        out[o] = parts
    return seeds, out


def steps_findings(short: pd.DataFrame, long: pd.DataFrame) -> StepsFindings:
    """:class:`StepsFindings` from the main sweep's rows (``short``) and :func:`steps_check`'s (``long``),
    paired on the long table's seeds. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    seeds, pairs = _steps_pairs(short, long)
    gs, gl, sep, pin = {}, {}, {}, {}
    for o, (ps, ss, pl, sl) in pairs.items():
        gs[o], gl[o] = t_interval(ss - ps), t_interval(sl - pl)
        sep[o], pin[o] = t_interval(sl - ss), t_interval(pl - ps)
    return StepsFindings(steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]),
                         n_seeds=len(seeds), gap_short=gs, gap_long=gl, separate_gain=sep, pinned_gain=pin)


def steps_claims(short: pd.DataFrame, long: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The step check's claims (family ``steps``, one per optimizer, printed together: ``Family(m)``): per seed the
    gap at the long budget minus the gap at the short one, keys ``steps_change_<optimizer>``, verdict
    ``gap larger with more steps`` / ``gap smaller with more steps`` / ``equivalent within ±margin`` /
    ``not decided`` / ``too few seeds`` (:func:`bnstudy.inference.decide`). Raises as :func:`steps_findings`."""
    _, pairs = _steps_pairs(short, long)
    fam = Family(max(len(pairs), 1), alpha)
    claims = [decide((sl - pl) - (ss - ps), f"steps_change_{o}", margin=margin, family=fam, higher=STEPS_LARGER,
                     lower=STEPS_SMALLER) for o, (ps, ss, pl, sl) in pairs.items()]
    return family_table(claims, "steps", fam, [dict(optimizer=o) for o in pairs], alpha)


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

def family_table(claims: list, family: str, fam: Family, extra: list[dict], alpha: float = 0.05) -> pd.DataFrame:
    """One family's claims as a table: :func:`bnstudy.inference.claims_table` (Holm's ``p_adjusted`` over these
    claims) with the columns ``family``, ``m`` (the family's size) and ``extra`` (one dict per claim: what the
    claim is about, e.g. ``shift, head, optimizer``), and ``count_kind``: the kind a count of cells uses (the
    glossary's rule: a direction, ``higher`` / ``lower`` by the estimate's sign, where Holm's adjusted p is below
    ``alpha``; otherwise the verdict's kind). Holm calls at least the cells whose Bonferroni interval excludes
    zero, so a cell can count as a direction while its printed verdict is ``not decided``."""
    t = claims_table(claims, family=family)
    t["m"] = fam.m
    for k in (extra[0] if extra else {}):
        t[k] = [e[k] for e in extra]
    holm_dir = np.where(t["estimate"] > 0, "higher", "lower")
    t["count_kind"] = np.where(t["p_adjusted"] < alpha, holm_dir, t["kind"]) if len(t) else pd.Series(dtype=str)
    return t


def verdict_counts(table: pd.DataFrame, alpha: float = 0.05) -> dict:
    """``{kind: count}`` of one family's claims for ``higher``, ``lower``, ``equivalent``, ``not decided`` and
    ``too few seeds`` (every kind present, 0 if none): the book's counts rule,
    :func:`bnstudy.inference.count_verdicts` (Holm directions, printed kinds otherwise)."""
    c = count_verdicts(table, alpha)
    return {k: int(c[k]) for k in ("higher", "lower", "equivalent", "not decided", "too few seeds")}


def gap_values(df: pd.DataFrame, shift: str, head: str, optimizer: str) -> pd.Series:
    """The per-seed gap of a cell, ``task_b(separate_stats) - task_b(backbone_eval)``, indexed by seed
    (:func:`bnstudy.inference.paired_differences`: a seed without both modes is left out). Raises ``ValueError``
    if the cell has no rows or lacks one of the two modes."""
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    if not len(cell):
        raise ValueError(f"gap: no rows for cell ({shift}, {head}, {optimizer})")
    return paired_differences(cell, "task_b", "mode", "separate_stats", REFERENCE_MODE)


def equivalence_max_sd(margin: float, n: int, family: Family = Family()) -> float:
    """The largest per-seed standard deviation of a gap whose mean is exactly 0 that the equivalence test of
    :func:`bnstudy.inference.decide` (TOST at ``family.level``) can still call equivalent within ``±margin``:
    ``margin`` over the half-width of the ``1 - 2 level`` t interval of ``n`` values of standard deviation 1 (TOST
    passes exactly when that interval lies inside the margin). The design's feasibility; NaN for ``n < 2``."""
    if n < 2:
        return math.nan
    unit = np.arange(n, dtype=float)
    unit = (unit - unit.mean()) / unit.std(ddof=1)
    return float(margin / t_interval(unit, 1 - 2 * family.level).high)


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The gap claims (family ``gap``), one per (shift, head, optimizer), keys ``gap_<shift>_<head>_<optimizer>``:
    :func:`bnstudy.inference.decide` on the per-seed gap (:func:`gap_values`) with the ``m`` head x optimizer cells
    of one shift as one :class:`bnstudy.inference.Family` (Bonferroni intervals, TOST at ``alpha / m``, Holm over
    the shift's cells). Columns: :func:`family_table`'s plus ``shift, head, optimizer, sd`` (the gap's per-seed
    standard deviation), ``task_b_pinned`` / ``task_b_separate`` (the two modes' mean task-B accuracy)."""
    parts = []
    for shift, g in df.groupby("shift", sort=False):
        cells = list(dict.fromkeys(zip(g["head"], g["optimizer"])))
        fam = Family(len(cells), alpha)
        claims, extra = [], []
        for h, o in cells:
            d = gap_values(df, shift, h, o)
            claims.append(decide(d, f"gap_{shift}_{h}_{o}", margin=margin, family=fam, higher=GAP_HIGHER,
                                 lower=GAP_LOWER))
            c = g[(g["head"] == h) & (g["optimizer"] == o)]
            extra.append(dict(shift=shift, head=h, optimizer=o, sd=float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                              task_b_pinned=float(c[c["mode"] == REFERENCE_MODE]["task_b"].mean()),
                              task_b_separate=float(c[c["mode"] == "separate_stats"]["task_b"].mean())))
        parts.append(family_table(claims, "gap", fam, extra, alpha))
    return pd.concat(parts, ignore_index=True)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy task-B and task-A accuracy per ``shift, head, optimizer, mode``: ``metric, mean, ci_low, ci_high,
    n_seeds`` (95% Student-t over seeds, :func:`bnstudy.inference.t_interval`, not corrected; for display)."""
    rows = []
    for key, g in df.groupby(["shift", "head", "optimizer", "mode"], sort=False):
        for metric in ("task_b", "task_a_after"):
            iv = t_interval(g[metric])
            rows.append(dict(zip(("shift", "head", "optimizer", "mode"), key), metric=metric, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


def _difference_of_gaps(df, cond: tuple, ref: tuple) -> pd.Series:
    """Per seed ``gap(cond) - gap(ref)``, each a ``(shift, head, optimizer)`` cell; seeds in both only."""
    return (gap_values(df, *cond) - gap_values(df, *ref)).dropna()


def interaction_table(df: pd.DataFrame, a: str = "adam", b: str = "sgd", shift: str = "ref", margin: float = 0.02,
                      alpha: float = 0.05) -> pd.DataFrame:
    """The optimizer interaction (family ``interaction``) per head at ``shift``: per seed ``gap(a) - gap(b)``,
    keys ``<a>_vs_<b>_<head>``, one :class:`bnstudy.inference.Family` over the heads; verdict ``gap larger with
    Adam`` (pinning costs more with Adam) / ``gap smaller with Adam`` / equivalence / ``not decided``. Columns:
    :func:`family_table`'s plus ``head``; empty if ``a`` or ``b`` is missing."""
    d = df[df["shift"] == shift]
    heads = [h for h in dict.fromkeys(d["head"]) if {a, b} <= set(d[d["head"] == h]["optimizer"])]
    fam = Family(max(len(heads), 1), alpha)
    claims = [decide(_difference_of_gaps(df, (shift, h, a), (shift, h, b)), f"{a}_vs_{b}_{h}", margin=margin,
                     family=fam, higher=ADAM_HIGHER, lower=ADAM_LOWER) for h in heads]
    t = family_table(claims, "interaction", fam, [dict(head=h) for h in heads], alpha)
    return t if heads else t.assign(head=pd.Series(dtype=str))


def head_contrast_table(df: pd.DataFrame, reference: str = STEPS_CHECK_HEAD, shift: str = "ref",
                        margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Does a head change the gap? (family ``hc``) Per optimizer and head, per seed ``gap(head) - gap(reference)``
    at ``shift``, keys ``hc_<head>_<optimizer>``, one :class:`bnstudy.inference.Family` over the head x optimizer
    contrasts; verdict ``larger gap than linear`` (pinning costs more with that head) / ``smaller gap than linear``
    / equivalence / ``not decided``. Columns: :func:`family_table`'s plus ``head, optimizer``, ``separate`` /
    ``separate_reference`` (the two heads' mean ``separate_stats`` task-B accuracy: a smaller gap can come from
    a worse separate side). Raises ``ValueError`` if ``reference`` has no rows at ``shift``."""
    d = df[df["shift"] == shift]
    if reference not in set(d["head"]):
        raise ValueError(f"head_contrast_table: reference head {reference!r} has no rows at shift {shift!r}")
    heads = [h for h in dict.fromkeys(d["head"]) if h != reference]
    opts = list(dict.fromkeys(d["optimizer"]))
    fam = Family(max(len(heads) * len(opts), 1), alpha)
    sep = lambda head, o: float(d[(d["head"] == head) & (d["optimizer"] == o)
                                  & (d["mode"] == "separate_stats")]["task_b"].mean())
    claims, extra = [], []
    for o in opts:
        for h in heads:
            claims.append(decide(_difference_of_gaps(df, (shift, h, o), (shift, reference, o)), f"hc_{h}_{o}",
                                 margin=margin, family=fam, higher=HEAD_LARGER, lower=HEAD_SMALLER))
            extra.append(dict(head=h, optimizer=o, separate=sep(h, o), separate_reference=sep(reference, o)))
    t = family_table(claims, "hc", fam, extra, alpha)
    return t if extra else t.assign(head=pd.Series(dtype=str), optimizer=pd.Series(dtype=str),
                                    separate=pd.Series(dtype=float), separate_reference=pd.Series(dtype=float))


def shift_contrast_table(df: pd.DataFrame, shift: str = "ref", base: str = "none", margin: float = 0.02,
                         alpha: float = 0.05) -> pd.DataFrame:
    """Does the shift make the gap? (family ``sc``) Per head and optimizer, per seed ``gap(shift) - gap(base)``
    (the pairing is the seed: same backbone, head initialization and task-B stream), keys ``sc_<head>_<optimizer>``,
    one :class:`bnstudy.inference.Family` over the cells; verdict ``larger gap at the shift`` (pinning costs more
    at ``shift``) / ``smaller gap at the shift`` / equivalence / ``not decided``. Columns: :func:`family_table`'s
    plus ``head, optimizer``. Raises ``ValueError`` if either shift has no rows."""
    for name in (shift, base):
        if name not in set(df["shift"]):
            raise ValueError(f"shift_contrast_table: no rows at shift {name!r}")
    d = df[df["shift"] == shift]
    cells = list(dict.fromkeys(zip(d["head"], d["optimizer"])))
    fam = Family(max(len(cells), 1), alpha)
    claims = [decide(_difference_of_gaps(df, (shift, h, o), (base, h, o)), f"sc_{h}_{o}", margin=margin, family=fam,
                     higher=SHIFT_LARGER, lower=SHIFT_SMALLER) for h, o in cells]
    return family_table(claims, "sc", fam, [dict(head=h, optimizer=o) for h, o in cells], alpha)


def bn_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05, head: str = "mlp_bn") -> pd.DataFrame:
    """The BatchNorm head's two pinned modes (family ``bn``): per shift and optimizer, per seed
    ``task_b(all_eval) - task_b(backbone_eval)`` of ``head``, keys ``bn_<shift>_<optimizer>``, one
    :class:`bnstudy.inference.Family` over the table's cells; ``too few seeds`` where ``head`` has no rows."""
    shifts, opts = list(dict.fromkeys(df["shift"])), _optimizers(df)
    fam = Family(max(len(shifts) * len(opts), 1), alpha)
    claims, extra = [], []
    for s in shifts:
        for o in opts:
            c = df[(df["shift"] == s) & (df["optimizer"] == o) & (df["head"] == head)]
            d = paired_differences(c, "task_b", "mode", "all_eval", REFERENCE_MODE) if len(c) else []
            claims.append(decide(d, f"bn_{s}_{o}", margin=margin, family=fam, higher=BN_HIGHER, lower=BN_LOWER))
            extra.append(dict(shift=s, optimizer=o))
    return family_table(claims, "bn", fam, extra, alpha)


def checks_table(df: pd.DataFrame) -> pd.DataFrame:
    """The identities of the code as exact checks (family ``checks``; :func:`bnstudy.inference.exact_check`):
    ``check_train_is_separate`` (``train_mode`` minus ``separate_stats`` task-B accuracy is 0 in every seed, shift,
    head and optimizer: the same backbone statistics see the same stream), ``check_pinned_keep_a`` (task A after
    minus before is 0 in every run of both pinned modes), ``check_task_a_loss_shared`` (``train_mode``'s task-A
    accuracy after stage 2 minus its value for the first head and optimizer of the same seed and shift is 0: the
    head does not touch the backbone's buffers)."""
    piv = df.pivot_table(index=["shift", "head", "optimizer", "seed"], columns="mode", values="task_b",
                         aggfunc="first")
    pinned = df[df["mode"].isin(PINNED_MODES)]
    tm = df[df["mode"] == "train_mode"]
    shared = tm["task_a_after"] - tm.groupby(["shift", "seed"])["task_a_after"].transform("first")
    claims = [exact_check(piv["train_mode"] - piv["separate_stats"], key="check_train_is_separate"),
              exact_check(pinned["task_a_after"] - pinned["task_a_before"], key="check_pinned_keep_a"),
              exact_check(shared, key="check_task_a_loss_shared")]
    return family_table(claims, "checks", Family(len(claims)), [{} for _ in claims])


def _optimizers(df: pd.DataFrame) -> list:
    return sorted(set(df["optimizer"]), key=lambda o: OPTIMIZERS.index(o) if o in OPTIMIZERS else 99)


def _cells(names) -> str:
    return ", ".join(names) if names else "none"


def _cell_names(table: pd.DataFrame, kind: str) -> list[str]:
    """``head/optimizer`` of a family table's rows that count as ``kind`` (:func:`family_table`)."""
    t = table[table["count_kind"] == kind]
    return [f"{h}/{o}" for h, o in zip(t["head"], t["optimizer"])]


@dataclass(frozen=True)
class ShiftContrast:
    """:func:`shift_contrast_table` for the prose: ``m`` contrasts at ``confidence``; counts (Holm) and
    ``head/optimizer`` lists of cells whose gap is larger / smaller at the shift (``none`` if empty)."""

    m: int
    confidence: float
    n_larger: int
    n_smaller: int
    larger_cells: str
    smaller_cells: str


def shift_contrast_findings(table: pd.DataFrame) -> ShiftContrast:
    """:class:`ShiftContrast` from :func:`shift_contrast_table`'s output."""
    c = verdict_counts(table)
    return ShiftContrast(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                         n_larger=c["higher"], n_smaller=c["lower"], larger_cells=_cells(_cell_names(table, "higher")),
                         smaller_cells=_cells(_cell_names(table, "lower")))


def contrast_display(table: pd.DataFrame, clip: tuple = (-2, 2)) -> pd.DataFrame:
    """A contrast table for the page (:func:`head_contrast_table`, :func:`shift_contrast_table`): heads in rows,
    optimizers in columns, ``estimate [low, high] verdict`` (interval ends cut to ``clip``)."""
    t = table.assign(cell=[_cell_text(r, clip) for r in table.itertuples(index=False)])
    return t.pivot(index="head", columns="optimizer", values="cell").reindex(
        index=list(dict.fromkeys(table["head"])), columns=list(dict.fromkeys(table["optimizer"])))


def _cell_text(r, clip: tuple = (-1, 1)) -> str:
    """``+0.123 [+0.050, +0.200] verdict`` of one claims-table row (no interval: ``[no interval]``)."""
    iv = Interval(r.estimate, r.low, r.high, int(r.n), r.confidence).clipped(*clip)
    span = "[no interval]" if math.isnan(iv.low) else f"[{iv.low:+.3f}, {iv.high:+.3f}]"
    return f"{r.estimate:+.3f} {span} {r.verdict}"


@dataclass(frozen=True)
class HeadContrast:
    """:func:`head_contrast_table` for the prose: ``m`` contrasts at ``confidence``; counts (Holm) and the
    contrasts (``head/optimizer``) with a smaller / larger gap than the linear head (``smaller_cells`` /
    ``larger_cells``, ``none`` if empty); ``n_smaller_worse_separate`` / ``smaller_worse_separate_cells``: those
    smaller-gap contrasts whose head reaches a lower ``separate_stats`` accuracy than the linear head (the gap
    shrinks from the separate side)."""

    m: int
    confidence: float
    n_smaller: int
    n_larger: int
    smaller_cells: str
    larger_cells: str
    n_smaller_worse_separate: int
    smaller_worse_separate_cells: str


def head_contrast_findings(table: pd.DataFrame) -> HeadContrast:
    """:class:`HeadContrast` from :func:`head_contrast_table`'s output."""
    c = verdict_counts(table)
    worse = [f"{r.head}/{r.optimizer}" for r in table.itertuples()
             if r.count_kind == "lower" and r.separate < r.separate_reference]
    return HeadContrast(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                        n_smaller=c["lower"], n_larger=c["higher"], smaller_cells=_cells(_cell_names(table, "lower")),
                        larger_cells=_cells(_cell_names(table, "higher")), n_smaller_worse_separate=len(worse),
                        smaller_worse_separate_cells=_cells(worse))


def head_contrast_display(table: pd.DataFrame) -> pd.DataFrame:
    """The page's head-contrast table: heads in rows, optimizers in columns, ``estimate [low, high] verdict``
    (:func:`contrast_display`)."""
    return contrast_display(table)


@dataclass(frozen=True)
class Record:
    """The numbers chapter 4's prose cites beside its claims (accuracies are fractions 0..1).

    ``n_seeds``; the gap family (one shift's cells): ``n_cells`` (its ``m``), ``confidence`` (of its Bonferroni
    intervals), ``margin``. Counts per shift (Holm's rule, :func:`family_table`): ``n_separate_higher`` (separate_stats
    higher: pinning costs), ``n_separate_lower``, ``n_equivalent``, ``n_not_decided``, ``n_too_few``; ``separate_higher_ref`` /
    ``equivalent_ref``: those cells at chapter 1's shift as ``head/optimizer`` lists (``none`` if empty).

    Equivalence feasibility: ``equiv_max_sd``, the largest per-seed SD for which a gap of mean exactly 0 could be
    shown equivalent at this design (:func:`equivalence_max_sd`); ``equiv_sd_median`` and ``n_equiv_feasible``
    per shift: the median observed SD and the cells whose SD is below ``equiv_max_sd``.

    ``interaction_m`` / ``interaction_confidence``, ``bn_m`` / ``bn_confidence``: the other families' sizes and
    interval confidence. ``f3_heads_holding``: per optimizer, for how many heads the gap at chapter 1's shift counts
    as ``separate_stats higher`` (Holm); ``f3_rate_edge``: per optimizer, ``a rate at the grid's edge`` if one of
    the linear head's chosen rates (``backbone_eval`` or ``separate_stats``) sits at an end of its grid, else
    ``rates inside the grid``. ``train_mode_task_a_change``: ``task_a_after - task_a_before`` of ``train_mode`` at
    chapter 1's shift (one head and optimizer, negative = lost; 95% t interval).

    Best absolute accuracy at chapter 1's shift: ``best_pinned_cell`` (``head/optimizer`` with the highest
    ``backbone_eval`` accuracy), ``best_pinned_acc``, ``best_pinned_gap`` (its gap claim's interval) and
    ``best_pinned_verdict``, ``best_separate_cell``, ``best_separate_acc``.

    ``lrs``: the chosen rates (``"<head>_<optimizer>[_<mode>]"``); ``n_lr_at_edge`` and ``lr_edge_cells``.
    ``n_eval``: test images per accuracy (0 if absent); ``eval_se``: the binomial standard error of one accuracy at
    the mean ``separate_stats`` task-B accuracy at chapter 1's shift (NaN without ``n_eval``); ``margin_in_se``.
    """

    n_seeds: int
    n_cells: int
    confidence: float
    margin: float
    chance: float
    n_separate_higher: dict
    n_separate_lower: dict
    n_equivalent: dict
    n_not_decided: dict
    n_too_few: dict
    separate_higher_ref: str
    equivalent_ref: str
    equiv_max_sd: float
    equiv_sd_median: dict
    n_equiv_feasible: dict
    interaction_m: int
    interaction_confidence: float
    bn_m: int
    bn_confidence: float
    f3_heads_holding: dict
    f3_rate_edge: dict
    train_mode_task_a_change: Interval
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


@dataclass(frozen=True)
class Findings:
    """Chapter 4's findings: ``claims``, every claim of the page's main comparisons as one table (families
    ``gap``, ``interaction``, ``hc``, ``sc``, ``bn``, ``checks``; :func:`family_table`'s columns), glued by key with
    :func:`bnstudy.pages.glue_claims` (per family, at :data:`CLIPS`), and ``record``, the few numbers beside them
    (:class:`Record`, glued with :func:`bnstudy.pages.glue_findings`)."""

    claims: pd.DataFrame
    record: Record

    def claim(self, key: str) -> pd.Series:
        """The claims-table row of ``key``. Raises ``KeyError`` naming it if absent."""
        t = self.claims[self.claims["key"] == key]
        if not len(t):
            raise KeyError(f"no claim {key!r}")
        return t.iloc[0]


def _edge_text(edges) -> str:
    return _cells([f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges])


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05) -> Findings:
    """Chapter 4's findings from :func:`run`'s table (``shift`` column; all four modes).

    ``lrs``: :func:`chosen_lrs`' output (per mode or per head and optimizer) and ``grids``
    (``{optimizer: grid}``) for the search's numbers. The head and shift contrasts need the linear head and
    the ``none`` shift (without them those families are left out). Raises ``ValueError`` if a mode or chapter 1's
    shift (``shift == "ref"``) is missing.
    """
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    if "ref" not in set(df["shift"]):
        raise ValueError("findings needs chapter 1's shift (rows with shift == 'ref')")
    gt = gap_table(df, margin, alpha)
    inter = interaction_table(df, margin=margin, alpha=alpha)
    bn = bn_table(df, margin, alpha)
    parts = [gt, inter, bn, checks_table(df)]
    if "linear" in set(df[df["shift"] == "ref"]["head"]):
        parts.append(head_contrast_table(df, margin=margin, alpha=alpha))
    if "none" in set(df["shift"]):
        parts.append(shift_contrast_table(df, margin=margin, alpha=alpha))
    claims = pd.concat([p for p in parts if len(p)], ignore_index=True)

    by_shift = {s: verdict_counts(g) for s, g in gt.groupby("shift", sort=False)}
    count = lambda kind: {s: c[kind] for s, c in by_shift.items()}
    ref = gt[gt["shift"] == "ref"]
    label = lambda d: [f"{h}/{o}" for h, o in zip(d["head"], d["optimizer"])]
    n = int(df["seed"].nunique())
    fam = Family(int(ref["m"].iloc[0]), alpha)
    max_sd = equivalence_max_sd(margin, n, fam)
    opts = _optimizers(df)
    holding = {o: int(((ref["optimizer"] == o) & (ref["count_kind"] == "higher")).sum()) for o in opts}

    tm = df[(df["mode"] == "train_mode") & (df["shift"] == "ref")]
    first = tm[(tm["head"] == tm["head"].iloc[0]) & (tm["optimizer"] == tm["optimizer"].iloc[0])]
    change = t_interval(first["task_a_after"] - first["task_a_before"])

    bp = ref.loc[ref["task_b_pinned"].idxmax()]
    bs = ref.loc[ref["task_b_separate"].idxmax()]
    lrs = lrs or {}
    edges = lr_edges(lrs, grids or {})
    edge_keys = {k for k, _, _ in edges}
    f3_edge = {}
    for o in opts:
        ks = {("linear", o, m) for m in (REFERENCE_MODE, "separate_stats")} | {("linear", o)}
        f3_edge[o] = "a rate at the grid's edge" if ks & edge_keys else "rates inside the grid"
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df else 0
    p_sep = float(ref["task_b_separate"].mean())
    se = math.sqrt(p_sep * (1 - p_sep) / n_eval) if n_eval else math.nan
    record = Record(
        n_seeds=n, n_cells=fam.m, confidence=fam.confidence, margin=margin,
        chance=1 / int(df["n_classes"].iloc[0]) if "n_classes" in df else 0.1,
        n_separate_higher=count("higher"), n_separate_lower=count("lower"), n_equivalent=count("equivalent"),
        n_not_decided=count("not decided"), n_too_few=count("too few seeds"),
        separate_higher_ref=_cells(label(ref[ref["count_kind"] == "higher"])),
        equivalent_ref=_cells(label(ref[ref["count_kind"] == "equivalent"])),
        equiv_max_sd=max_sd,
        equiv_sd_median={s: float(g["sd"].median()) for s, g in gt.groupby("shift", sort=False)},
        n_equiv_feasible={s: int((g["sd"] < max_sd).sum()) for s, g in gt.groupby("shift", sort=False)},
        interaction_m=int(inter["m"].iloc[0]) if len(inter) else 0,
        interaction_confidence=float(inter["confidence"].iloc[0]) if len(inter) else math.nan,
        bn_m=int(bn["m"].iloc[0]), bn_confidence=float(bn["confidence"].iloc[0]),
        f3_heads_holding=holding, f3_rate_edge=f3_edge, train_mode_task_a_change=change,
        best_pinned_cell=f"{bp['head']}/{bp['optimizer']}", best_pinned_acc=float(bp["task_b_pinned"]),
        best_pinned_gap=Interval(float(bp["estimate"]), float(bp["low"]), float(bp["high"]), int(bp["n"]),
                                 float(bp["confidence"])).clipped(-1, 1),
        best_pinned_verdict=str(bp["verdict"]), best_separate_cell=f"{bs['head']}/{bs['optimizer']}",
        best_separate_acc=float(bs["task_b_separate"]),
        lrs={"_".join(k): v for k, v in lrs.items()}, n_lr_at_edge=len(edges), lr_edge_cells=_edge_text(edges),
        n_eval=n_eval, eval_se=se, margin_in_se=margin / se if se > 0 else math.nan,
    )
    return Findings(claims=claims, record=record)


# --- the page's answer: sentences chosen by the findings (issue 25) -------------------------------------------------

#: Labels of the optimizers in the page's sentences.
OPTIMIZER_WORDS = {"sgd": "SGD with momentum", "sgd_plain": "plain SGD", "adam": "Adam"}


def _bold(text: str) -> str:
    return f"**{text}**"


def _num(v: float, fmt: str = "+.3f") -> str:
    """A number for the page's prose; ``n/a`` for NaN (a page never prints NaN)."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _span(low: float, high: float, clip: tuple = (-1, 1)) -> str:
    """``-0.004 to +0.027`` (ends cut to ``clip``), or ``no interval``."""
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    lo, hi = (min(max(v, clip[0]), clip[1]) for v in (low, high))
    return f"{lo:+.3f} to {hi:+.3f}"


def gap_counts(F: "Findings", shift: str = "ref") -> dict:
    """The counts of one shift's gap family (:func:`bnstudy.inference.count_verdicts`: Holm directions, printed
    kinds otherwise), with ``m``. Raises ``ValueError`` if the shift has no gap claims."""
    t = F.claims[(F.claims["family"] == "gap") & (F.claims["shift"] == shift)]
    if not len(t):
        raise ValueError(f"gap_counts: no gap claims at shift {shift!r}")
    return count_verdicts(t)


def headline(F: "Findings") -> str:
    """The answer's first sentence, chosen by the counts of the gap family at chapter 1's shift: whether the
    heads and optimizers tried make up for pinned statistics (all cells a cost shown, none, every cell
    equivalent, or a mix), with the counts spliced in."""
    c = gap_counts(F)
    m, hi, lo, eq = c["m"], c["higher"], c["lower"], c["equivalent"]
    und = c["not decided"] + c["too few seeds"]
    eqw = equivalent_text(F.record.margin)
    counts = (f"the {m} head and optimizer cells split into {hi} where separate statistics score higher on task B "
              f"than the pinned backbone, {lo} where they score lower, {eq} {eqw} and {und} not decided")
    if hi == m:
        lead = "No head or optimizer tried makes up for pinned statistics at chapter 1's shift"
    elif hi == 0 and eq == m:
        lead = f"Every head and optimizer tried makes up for pinned statistics at chapter 1's shift, within ±{F.record.margin:g}"
    elif hi == 0 and lo == 0:
        lead = "No head and optimizer cell shows a cost of pinned statistics at chapter 1's shift, and not every one is shown to be without one"
    elif hi == 0:
        lead = "No head and optimizer cell shows a cost of pinned statistics at chapter 1's shift"
    elif lo == 0 and eq == 0:
        lead = "No head or optimizer tried is shown to make up for pinned statistics at chapter 1's shift"
    elif lo == 0 and hi + eq == m:
        lead = "Some heads and optimizers make up for pinned statistics at chapter 1's shift and others do not"
    else:
        lead = "Whether a head or optimizer makes up for pinned statistics at chapter 1's shift depends on the cell"
    return (f"{lead}: with every freeze mode at its own tuned learning rate, {counts} (counted by Holm; the words "
            f"are the [glossary](../glossary.html)'s).")


def linear_sentence(F: "Findings") -> str:
    """The seed's linear head, per optimizer: its gap verdicts at chapter 1's shift, spliced into fixed words."""
    parts = []
    for o in ("sgd", "sgd_plain", "adam"):
        t = F.claims[F.claims["key"] == f"gap_ref_linear_{o}"]
        if len(t):
            parts.append(f"{_bold(t.iloc[0]['verdict'])} with {OPTIMIZER_WORDS[o]}")
    if not parts:
        return ""
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"For the seed's linear head, separate minus pinned statistics on task B reads {listed}."


def best_sentence(F: "Findings") -> str:
    """The best pinned configuration against the best separate one (absolute accuracies), with the gap claim of
    the best pinned cell."""
    R = F.record
    g = R.best_pinned_gap
    return (f"The best pinned configuration, {_bold(R.best_pinned_cell)}, reaches {_num(R.best_pinned_acc, '.3f')} "
            f"against {_num(R.best_separate_acc, '.3f')} for the best one with separate statistics "
            f"({_bold(R.best_separate_cell)}; separate minus pinned in the best pinned cell {_num(g.mean)}, "
            f"{_span(g.low, g.high)}: {_bold(R.best_pinned_verdict)}).")


def probe_sentence(probe: Interval, linear_gap_low: float = float("nan")) -> str:
    """The closed-form probe's reading (separate minus pinned features, 95% interval), chosen by where its interval
    lies: pinning loses linearly decodable information (above 0), the pinned features are the more decodable
    (below 0), or no loss is detected (spans 0); and, when ``linear_gap_low`` (the lower end of the linear head's
    gap with SGD and momentum) lies above the probe's interval, that the trained head's shortfall exceeds what the
    features lose."""
    if math.isnan(probe.low) or math.isnan(probe.high):
        return (f"A least-squares probe solved in closed form, free of any optimizer, reads {_num(probe.mean)} on "
                f"separate minus pinned features, without an interval (too few seeds).")
    head = (f"A least-squares probe solved in closed form, free of any optimizer, reads {_num(probe.mean)} "
            f"({_span(probe.low, probe.high)}) on separate minus pinned features")
    if probe.low > 0:
        body = ": pinning loses some linearly decodable information about task B"
    elif probe.high < 0:
        body = ": for this probe the pinned features are the more linearly decodable"
    else:
        body = ", an interval that includes zero: this probe detects no linearly decodable information lost to pinning"
    tail = ""
    if not math.isnan(linear_gap_low) and linear_gap_low > probe.high:
        tail = ("; the trained linear head with SGD and momentum falls short by more than that, a shortfall of "
                "optimization (rate and step budget) rather than of the features")
    return head + body + tail + "."


def answer(F: "Findings", probe: Interval | None = None) -> str:
    """The answer box's outcome sentences (Markdown), chosen and filled from the findings, so that they are true
    for any rows: :func:`headline`, :func:`linear_sentence`, :func:`best_sentence` and, given the geometry's
    ``probe`` interval (:class:`GeometryFindings`' ``probe_cost``), :func:`probe_sentence`."""
    parts = [headline(F), linear_sentence(F), best_sentence(F)]
    if probe is not None:
        t = F.claims[F.claims["key"] == "gap_ref_linear_sgd"]
        parts.append(probe_sentence(probe, float(t.iloc[0]["low"]) if len(t) else float("nan")))
    return " ".join(p for p in parts if p)


def advice(F: "Findings") -> str:
    """The answer box's "what to do" (Markdown), with the one front-door call, chosen by whether a cost of
    pinning is shown in any cell at chapter 1's shift."""
    c = gap_counts(F)
    lrs = F.record.lrs
    p, s = lrs.get("linear_sgd_backbone_eval"), lrs.get("linear_sgd_separate_stats")
    rates = (f" (here {p:g} pinned against {s:g} with separate statistics, for the linear head with SGD and momentum)"
             if p is not None and s is not None else "")
    pin = (f"Where task A must be kept, pin the backbone with `bnstudy.pin_eval(model.backbone)` and tune the new "
           f"head's learning rate for the pinned features{rates}.")
    if c["higher"]:
        return (pin + f" A deeper head, a normalizing head or another optimizer is no substitute for task B's own "
                f"statistics in the {c['higher']} of {c['m']} cells where pinning costs: where the new task must be as "
                f"good as it can be, give it its own statistics (the `separate_stats` mode, built with "
                f"`bnstudy.shared_weight_copy(model.backbone)`).")
    return pin + " At this shift no cell shows a cost of pinning that another head or optimizer would have to make up."


def vocabulary(margin: float) -> dict:
    """The page's verdict words by a short name (the glue keys ``ch04_w_<name>``), so that the notebook's
    definitions cite the words instead of typing them: every direction of :data:`DIRECTIONS`, the equivalence
    verdict at ``margin``, ``not decided`` and ``too few seeds``."""
    names = ("gap_higher", "gap_lower", "adam_higher", "adam_lower", "head_larger", "head_smaller", "shift_larger",
             "shift_smaller", "steps_larger", "steps_smaller", "bn_higher", "bn_lower", "link_positive",
             "link_negative")
    out = dict(zip(names, DIRECTIONS))
    out.update(equivalent=equivalent_text(margin), not_decided=NOT_DECIDED, too_few=TOO_FEW)
    return out


def geometry_sentences(G: "GeometryFindings") -> dict:
    """Sentences of the "why" section chosen by the geometry's numbers (Markdown, by name): ``curvature``, whether
    the added curvature under pinned statistics survives centring (the covariance's ratio at least half the second
    moment's) or comes mostly from the common offset."""
    if math.isnan(G.curvature_ratio) or math.isnan(G.curvature_centered_ratio):
        cur = "The centred ratio is not available."
    elif G.curvature_ratio <= 1:
        cur = "Pinned statistics add no curvature here."
    elif G.curvature_centered_ratio - 1 >= (G.curvature_ratio - 1) / 2:
        cur = "So most of the added curvature comes from the wider features, not from the common offset."
    else:
        cur = "So most of the added curvature comes from the common offset, not from the wider features."
    return {"curvature": cur}


def glue_page_claims(prefix: str, claims: pd.DataFrame) -> None:
    """Glue a claims table of this chapter (:func:`family_table`'s rows, any families) by key with
    :func:`bnstudy.pages.glue_claims`, each family's interval ends cut to its :data:`CLIPS` range."""
    from ..pages import glue_claims
    for fam, t in claims.groupby("family", sort=False):
        glue_claims(prefix, t, clip=CLIPS.get(fam))


def gap_display(gaps: pd.DataFrame, heads, optimizers, shift: str = "ref") -> pd.DataFrame:
    """The page's gap table at ``shift``: one row per head, one column per optimizer, cells
    ``estimate [low, high] verdict (pinned a / separate b)`` from :func:`gap_table`'s rows (display only)."""
    t = gaps[gaps["shift"] == shift]
    cell = {(r.head, r.optimizer): f"{_cell_text(r)} (pinned {r.task_b_pinned:.3f} / separate {r.task_b_separate:.3f})"
            for r in t.itertuples(index=False)}
    rows = {h: {o: cell.get((h, o), "") for o in optimizers} for h in heads}
    return pd.DataFrame.from_dict(rows, orient="index")


def interaction_display(table: pd.DataFrame) -> pd.DataFrame:
    """The page's interaction table (:func:`interaction_table`): per head, gap with Adam minus gap with SGD +
    momentum at chapter 1's shift, ``estimate [low, high]`` and verdict (display only)."""
    out = {}
    for r in table.itertuples(index=False):
        iv = Interval(r.estimate, r.low, r.high, int(r.n), r.confidence).clipped(*CLIPS["interaction"])
        span = "[no interval]" if math.isnan(iv.low) else f"[{iv.low:+.3f}, {iv.high:+.3f}]"
        out[r.head] = {"Adam - SGD + momentum (gap difference)": f"{r.estimate:+.3f} {span}", "verdict": r.verdict}
    return pd.DataFrame(out).T


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
    from ..running_stats import update_bn_stats
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
    """Mean and 95% interval over seeds (:func:`bnstudy.inference.t_interval`) of each geometry measure per
    ``shift, statistics`` (tidy)."""
    rows = []
    for key, g in geom.groupby(["shift", "statistics"], sort=False):
        for metric in ("scale_ratio", "offset_sd", "dead_fraction", "affine_r2", "curvature", "curvature_centered",
                       "mean_share", "probe_accuracy"):
            iv = t_interval(g[metric])
            rows.append(dict(shift=key[0], statistics=key[1], metric=metric, mean=iv.mean, ci_low=iv.low,
                             ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class GeometryFindings:
    """The explanation's numbers at one shift (means over seeds). ``probe_cost``: the closed-form probe's accuracy
    on separate-statistics features minus on pinned ones, per seed (positive: pinning loses linearly decodable
    information; 95% t interval, :func:`bnstudy.inference.t_interval`)."""

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
    probe_cost: Interval


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
        probe_cost=t_interval(s["probe_accuracy"] - p["probe_accuracy"]))


#: The geometry measures the link test relates to the gap (``separate_stats - backbone_eval``, positive when pinning
#: costs), and the sign of the correlation each explanation predicts: a larger curvature ratio (pinned / separate:
#: steeper pinned features, the optimization story) should go with a larger gap; a larger probe difference
#: (separate minus pinned: information lost, the information story) likewise. Both positive.
LINK_MEASURES = {"curvature_ratio": 1, "probe_cost": 1}


def _pooled_interval(x, y, rows_of: list, confidence: float, n_boot: int, seed: int) -> Interval:
    """The pooled Spearman rho of ``x``, ``y`` with a percentile bootstrap interval over whole seeds
    (:func:`bnstudy.inference.bootstrap_interval`; ``rows_of[i]``: the rows of seed ``i``); no interval below
    :data:`bnstudy.inference.MIN_BOOTSTRAP_UNITS` seeds (bootstrap_interval's ``min_units``)."""
    pooled = lambda ix: rank_correlation(*(a[np.concatenate([rows_of[int(i)] for i in ix])] for a in (x, y)))[0]
    return bootstrap_interval((np.arange(len(rows_of)),), pooled, confidence, n_boot, seed,
                              min_units=MIN_BOOTSTRAP_UNITS)


def link_table(df: pd.DataFrame, geom: pd.DataFrame, head: str = "linear", n_boot: int = 2000, alpha: float = 0.05,
               seed: int = 0) -> pd.DataFrame:
    """Does the feature geometry track the gap? (family ``link``) Spearman's rank correlation between a per-seed
    geometry measure and the per-seed gap of ``head`` (:func:`gap_values`), per optimizer, from rows the run already
    has (no training); keys ``link_<scope>_<optimizer>_<measure>``.

    Measures (:data:`LINK_MEASURES`), per seed and shift from :func:`feature_geometry`'s table:
    ``curvature_ratio`` = pinned / separate largest eigenvalue of E[f f^T]; ``probe_cost`` = separate minus pinned
    closed-form probe accuracy. Scopes: ``ref`` (chapter 1's shift, one point per seed: the seed-to-seed link;
    :func:`bnstudy.inference.rank_correlation`, Fisher-z interval, ``too few seeds`` below 4 seeds) and ``all``
    (every shift, one point per seed and shift, which mixes in the shift's own effect on both sides; its points
    are not independent within a seed, so its interval is :func:`bnstudy.inference.bootstrap_interval`'s seeded
    percentile bootstrap over whole seeds, ``n_boot`` resamples, of the pooled Spearman rho, without a p-value;
    no interval below :data:`bnstudy.inference.MIN_BOOTSTRAP_UNITS` seeds).
    All rows are one :class:`bnstudy.inference.Family` (Bonferroni intervals at ``1 - alpha / m``). Verdict:
    ``rank correlation positive`` / ``rank correlation negative`` / ``not decided`` / ``too few seeds``.

    Columns: :func:`family_table`'s plus ``scope, optimizer, measure, predicted_sign, n_points``. Empty if
    ``head`` is not in ``df``. Raises ``ValueError`` if ``geom`` lacks a measure's columns.
    """
    need = {"seed", "shift", "statistics", "curvature", "probe_accuracy"} - set(geom.columns)
    if need:
        raise ValueError(f"link_table: the geometry table lacks columns {sorted(need)}")
    opts = [o for o in OPTIMIZERS if o in set(df[df["head"] == head]["optimizer"])]
    fam = Family(max(2 * len(opts) * len(LINK_MEASURES), 1), alpha)
    p = geom[geom["statistics"] == "pinned"].set_index(["seed", "shift"])
    q = geom[geom["statistics"] == "separate"].set_index(["seed", "shift"]).reindex(p.index)
    meas = pd.DataFrame({"curvature_ratio": p["curvature"] / q["curvature"],
                         "probe_cost": q["probe_accuracy"] - p["probe_accuracy"]}).reset_index()
    claims, extra = [], []
    for o in opts:
        gaps = []
        for shift in dict.fromkeys(df["shift"]):
            gv = gap_values(df, shift, head, o)
            gaps.append(pd.DataFrame({"seed": gv.index, "shift": shift, "gap": gv.to_numpy()}))
        tab = meas.merge(pd.concat(gaps), on=["seed", "shift"]).dropna()
        for scope in ("ref", "all"):
            t = tab[tab["shift"] == "ref"] if scope == "ref" else tab
            y = t["gap"].to_numpy()
            seeds = np.array(sorted(set(t["seed"])))
            rows_of = [np.flatnonzero(t["seed"].to_numpy() == s) for s in seeds]
            for m, sign in LINK_MEASURES.items():
                x = t[m].to_numpy()
                key = f"link_{scope}_{o}_{m}"
                if scope == "ref":
                    _, iv, pv = rank_correlation(x, y, fam.confidence)
                else:
                    iv, pv = _pooled_interval(x, y, rows_of, fam.confidence, n_boot, seed), math.nan
                claims.append(decide_interval(iv, key, p=pv, higher=LINK_POSITIVE, lower=LINK_NEGATIVE))
                extra.append(dict(scope=scope, optimizer=o, measure=m, predicted_sign=sign, n_points=len(t)))
    t = family_table(claims, "link", fam, extra, alpha)
    if not extra:
        t = t.assign(**{c: pd.Series(dtype=object) for c in ("scope", "optimizer", "measure", "predicted_sign",
                                                              "n_points")})
    return t


def _predicted(table: pd.DataFrame) -> pd.Series:
    """Whether each link row's verdict is a direction with the predicted sign."""
    return ((table["kind"] == "higher") & (table["predicted_sign"] > 0)) | \
        ((table["kind"] == "lower") & (table["predicted_sign"] < 0))


@dataclass(frozen=True)
class LinkFindings:
    """The link test's counts (:func:`link_table`; the verdicts themselves are glued from its claims): ``head``
    tested; ``m`` rows at Bonferroni ``confidence``; ``n_predicted`` / ``n_opposite`` / ``n_tests``: rows whose
    verdict is a direction with the predicted sign / the other sign / rows with a verdict other than ``too few
    seeds``, and the same per scope (``_ref``: one point per seed at chapter 1's shift; ``_all``: pooled over
    shifts, which the shift itself drives). Counted on the printed verdicts: the pooled rows have no p-value for
    Holm."""

    head: str
    m: int
    confidence: float
    n_predicted: int
    n_opposite: int
    n_tests: int
    n_predicted_ref: int
    n_tests_ref: int
    n_predicted_all: int
    n_tests_all: int


def link_findings(table: pd.DataFrame, head: str = "linear") -> LinkFindings:
    """:class:`LinkFindings` from :func:`link_table`'s output (computed for ``head``)."""
    pred = _predicted(table)
    tested = table["kind"] != TOO_FEW
    direction = table["kind"].isin(["higher", "lower"])
    sc = lambda s: table["scope"] == s
    return LinkFindings(
        head=head, m=int(table["m"].iloc[0]) if len(table) else 0,
        confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
        n_predicted=int(pred.sum()), n_opposite=int((direction & ~pred).sum()), n_tests=int(tested.sum()),
        n_predicted_ref=int((pred & sc("ref")).sum()), n_tests_ref=int((tested & sc("ref")).sum()),
        n_predicted_all=int((pred & sc("all")).sum()), n_tests_all=int((tested & sc("all")).sum()))


def link_texts(table: pd.DataFrame) -> dict:
    """The page's words for each :func:`link_table` row's value, keyed ``"<scope>_<optimizer>_<measure>"``
    (Markdown, to follow "$\\rho$"; the verdict is glued on its own, ``..._verdict``): ``= +0.12 (-0.30 to
    +0.50)``; without an interval ``= -0.83, no interval``; without a correlation at all (fewer than 4 points or a
    constant side) ``not computed (2 seeds, one point each)``. Never prints NaN."""
    out = {}
    for r in table.itertuples(index=False):
        if math.isnan(r.estimate):
            where = f"{r.n} seeds, one point each" if r.n_points == r.n else f"{r.n_points} points"
            text = f"not computed ({where})"
        elif math.isnan(r.low) or math.isnan(r.high):
            text = f"= {r.estimate:+.2f}, no interval"
        else:
            text = f"= {r.estimate:+.2f} ({r.low:+.2f} to {r.high:+.2f})"
        out[f"{r.scope}_{r.optimizer}_{r.measure}"] = text
    return out


def link_display(table: pd.DataFrame) -> pd.DataFrame:
    """The page's link table (display only), indexed by ``scope, optimizer, measure``: ``predicted, rho,
    n_seeds, n_points, verdict``, ``rho`` as ``+0.12 [-0.30, +0.50]``, ``-0.83 [no interval]`` or ``not computed``."""
    def rho(r, lo, hi):
        if math.isnan(r):
            return "not computed"
        return f"{r:+.2f} [no interval]" if math.isnan(lo) or math.isnan(hi) else f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return table.assign(rho=[rho(*v) for v in zip(table["estimate"], table["low"], table["high"])],
                        predicted=["negative" if s < 0 else "positive" for s in table["predicted_sign"]],
                        n_seeds=table["n"])[
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


def audit_check(table: pd.DataFrame) -> Claim:
    """:func:`audit_matches_declaration` as an exact check (key ``audit_matches``): ``exact, checked ==`` when
    ``moved == declared`` on every row of :func:`audit_buffers`' table, else ``not exact`` (an identity of the
    code, not a finding)."""
    return exact_check((table["moved"] != table["declared"]).astype(float), key="audit_matches")


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
