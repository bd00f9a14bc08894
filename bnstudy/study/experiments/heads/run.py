"""Chapter 4, what is trained: the configuration, the learning-rate search, the sweep, the step-count check, the
feature-geometry measurement and the buffer audit (the chapter's question: :mod:`bnstudy.study.experiments.heads`).

``Config`` -> :func:`run_tables` (:func:`lr_search`, :func:`run` at each mode's own chosen rate, :func:`steps_check`,
:func:`feature_geometry`) -> the tables the release saves (:func:`results_table`, :data:`SIBLING_TABLES`). What is
claimed from them: :mod:`.findings`; what is drawn: :mod:`.figures`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...config import Execution, RunConfig, SourceConfig, _Frozen, check_choice, check_float, check_int, \
    check_seeds, check_sequence, from_profile, seeds_label
from ...engine import seeded, train_source, transfer_sweep
from ...models import ConvBackbone, make_head
from ...modes import MODE_NAMES, TransferModel, get_mode
from ...sweep import reset_sweep_counts, run_sweep, sweep_counts
from ...tasks import BatchStream, eval_set, generator, make_task
from ..shift_strength.run import shift_of

NAMESPACE = "ch04_heads"
SEARCH_NAMESPACE = "ch04_lr_search"
FEATURE_NAMESPACE = "ch04_features"
#: Parameters that only change the analysis: a page given ``rows`` (an earlier run's tables) may differ from
#: that run in these, in nothing else.
ANALYSIS_PARAMETERS = ("margin",)
#: Parameters this design added after rows of the release were computed, with the value those older rows were
#: computed with: rows that do not record one read as that value (bnstudy.study.report.load_rows), so a new axis
#: costs a recompute of its new cells, never a broken page (docs/chapter-code.md). Empty: none yet.
READ_DEFAULTS: dict = {}
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


def run(config: Config, execution: Execution | None = None, lrs: dict | None = None) -> pd.DataFrame:
    """Chapter 4's sweep at the chosen learning rates (``lrs``: default, each mode's own at each shift,
    :func:`chosen_lrs_by_shift` of :func:`lr_search`; see :meth:`Config.run_configs` for the forms).

    One row per (seed, shift, head, optimizer, mode) with :func:`bnstudy.study.engine.transfer`'s columns
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
    """``namespace, computed, total`` per run-cache namespace, from :func:`bnstudy.study.sweep.sweep_counts`'s
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
    call computed or read (it resets :func:`bnstudy.study.sweep.sweep_counts`).
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
    from ....running_stats import update_bn_stats
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
    from ....audit import FreezeAudit
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
