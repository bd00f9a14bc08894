"""Chapter 6: separate statistics when the task is unknown at inference. Routing inputs to statistic banks.

``separate_stats`` (chapter 1) keeps task A exact and adapts each new task, but at inference it
must know which statistics an input needs. This module trains one frozen backbone with a
:class:`~bnstudy.banks.StatisticBank` (bank 0: task A's statistics; bank ``j``: new task ``j``'s,
accumulated in train mode while its head learns), then routes every evaluation input to a bank
with the routers of :mod:`bnstudy.routing`, which see only the input.

Tasks: task A (no shift) plus ``n_tasks - 1`` shifted tasks, each with its own templates and head
(the engine's tasks, :func:`bnstudy.tasks.make_task`). At shift strength ``t`` (:func:`shift_of`):
``B``: brightness ``4t``, contrast ``1 + 4t`` (chapter 3's ``both`` line, so ``t = 1`` is chapter
1's shift); ``C``: brightness ``-4t``, contrast ``1 + 4t``; ``D``: brightness 0, contrast
``1 / (1 + 4t)``.

The head is the task's own (the application knows which question it asks; what it does not know
is which statistics the input needs): ``accuracy`` is the true task's head on the routed
statistics. ``accuracy_routed_head`` also lets the router pick the head (fully task-unknown).

Conditions per task (all from one trained backbone per seed, paired):

* routers ``nearest_first``, ``nearest_all``, ``classifier``, ``mixture`` at each inference batch
  size (one decision per batch of ``b`` consecutive samples of one task; ``b = 1`` is per sample);
* ``oracle``: the task's own bank; ``train_mode``: one shared set of statistics that drifted
  through the new tasks in order (it ends as the last task's); ``pinned``: task A's statistics for
  everything, with heads trained on them (``backbone_eval``).

Identity used (a check, not a finding): a train-mode BatchNorm's output depends only on the batch,
so the heads trained under ``train_mode`` are the heads trained for the banks; and bank ``j``
starts from bank ``j-1``'s final statistics, so the shared drifting statistics after the last task
*are* the last bank, bit for bit. One training pass per task therefore serves oracle, routers and
``train_mode``; ``pinned`` heads train in lockstep on the same batches.

``Config`` -> :func:`run` -> results table -> :func:`findings` and the tidy tables
:func:`routing_table`, :func:`accuracy_table`, :func:`gap_table`.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats as sps

from ..analysis import Interval, mean_ci, verdict
from ..banks import StatisticBank
from ..config import Execution, SourceConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label
from ..engine import accuracy, ensure_sources, load_source, logits_of, seeded
from ..models import ConvBackbone, make_head
from ..routing import NearestStatistics, SoftMixture, StatisticsClassifier, sample_moments
from ..sweep import code_version, default_cache_dir, run_sweep
from ..tasks import BatchStream, eval_set, generator, make_task

NAMESPACE = "ch06_unknown_task"
TASK_NAMES = ("A", "B", "C", "D")
ROUTERS = ("nearest_first", "nearest_all", "classifier", "mixture")
BASELINES = ("oracle", "train_mode", "pinned")
CONDITIONS = ROUTERS + BASELINES
#: Brightness and contrast-gain directions of each shifted task (see :func:`shift_of`).
SHIFT_DIRECTIONS = {"B": "brightness 4t, contrast 1 + 4t", "C": "brightness -4t, contrast 1 + 4t",
                    "D": "brightness 0, contrast 1 / (1 + 4t)"}
#: Equivalence margin (accuracy, fraction) for "routing costs about nothing" (TOST, 90% interval).
TOST_MARGIN = 0.02
#: Routing accuracy that counts as "routing works" in the prose.
ROUTE_OK = 0.9

#: quick: about a minute on this project's 2-core CPU; full: see the chapter's profile note.
PROFILES = {
    "quick": dict(seeds=2, strengths=(0.0, 0.005, 1.0), steps=50, n_eval=160, router_samples=128),
    "full": dict(seeds=10, strengths=(0.0, 0.0025, 0.005, 0.01, 0.03, 0.1, 1.0), steps=300, n_eval=960,
                 router_samples=1024),
}


def shift_of(task: str, strength: float) -> tuple[float, float]:
    """``(brightness, contrast)`` of ``task`` (``A``..``D``) at shift ``strength >= 0``. Task A is never shifted."""
    check_choice("task", task, TASK_NAMES)
    t = check_float("strength", strength, 0.0)
    b, c = {"A": (0.0, 1.0), "B": (4 * t, 1 + 4 * t), "C": (-4 * t, 1 + 4 * t), "D": (0.0, 1 / (1 + 4 * t))}[task]
    return round(b, 9), round(c, 9)


@dataclass(frozen=True)
class UnitConfig(_Frozen):
    """One cached unit: one seed, one number of tasks, one shift strength (all routers and batch sizes)."""

    seed: int
    n_tasks: int
    strength: float
    steps: int
    n_eval: int
    router_samples: int
    inference_batches: tuple
    temperature: float
    noise: float
    momentum: float
    lr: float
    batch_size: int
    n_classes: int

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=self.momentum)


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 6's parameters (the notebook's parameters cell, one for one).

    ``seeds``: an int ``n`` (seeds 0..n-1) or a list. ``n_tasks``: numbers of tasks (2..4; task A
    plus shifted tasks). ``strengths``: shift strengths ``t >= 0`` (:func:`shift_of`), strictly
    increasing, at least 3. ``inference_batches``: inference batch sizes; ``n_eval`` (samples per
    task's evaluation set) must be a multiple of each. ``steps``, ``lr``, ``batch_size``: each new
    head's training (SGD with momentum 0.9). ``router_samples``: samples per task, drawn from its
    training distribution, on which the classifier router is fitted. ``temperature``: the soft
    mixture's (nats). ``noise``, ``momentum``: the tasks' pixel noise and BatchNorm momentum.
    Raises ``ValueError`` naming the parameter for any bad value.
    """

    profile: str = "quick"
    seeds: tuple = (0, 1)
    n_tasks: tuple = (2, 4)
    strengths: tuple = (0.0, 0.005, 1.0)
    inference_batches: tuple = (1, 2, 8, 32)
    steps: int = 50
    n_eval: int = 160
    router_samples: int = 128
    temperature: float = 0.1
    noise: float = 3.0
    momentum: float = 0.1
    lr: float = 0.05
    batch_size: int = 64

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("n_tasks", check_sequence("n_tasks", self.n_tasks, lambda n, v: check_choice(n, v, (2, 3, 4)), 1))
        strengths = check_sequence("strengths", self.strengths, lambda n, v: check_float(n, v, 0.0), 3)
        if list(strengths) != sorted(set(strengths)):
            raise ValueError(f"strengths must be strictly increasing, got {list(strengths)}")
        self._set("strengths", strengths)
        self._set("inference_batches", check_sequence("inference_batches", self.inference_batches,
                                                      lambda n, v: check_int(n, v, 1), 1))
        self._set("steps", check_int("steps", self.steps, 1))
        self._set("n_eval", check_int("n_eval", self.n_eval, 1))
        bad = [b for b in self.inference_batches if self.n_eval % b]
        if bad:
            raise ValueError(f"n_eval must be a multiple of every inference batch size; {self.n_eval} is not a "
                             f"multiple of {bad}")
        self._set("router_samples", check_int("router_samples", self.router_samples, 2))
        bad = [b for b in self.inference_batches if self.router_samples % b or self.router_samples // b < 2]
        if bad:
            raise ValueError(f"router_samples must be a multiple of every inference batch size with at least two "
                             f"batches each; {self.router_samples} fails for {bad}")
        self._set("temperature", check_float("temperature", self.temperature, 0.0, low_open=True))
        self._set("noise", check_float("noise", self.noise, 0.0))
        self._set("momentum", check_float("momentum", self.momentum, 0.0, 1.0, low_open=True))
        self._set("lr", check_float("lr", self.lr, 0.0, low_open=True))
        self._set("batch_size", check_int("batch_size", self.batch_size, 2))

    def units(self) -> list[UnitConfig]:
        """One :class:`UnitConfig` per (seed, n_tasks, strength), seeds outermost."""
        return [UnitConfig(seed=s, n_tasks=k, strength=t, steps=self.steps, n_eval=self.n_eval,
                           router_samples=self.router_samples, inference_batches=self.inference_batches,
                           temperature=self.temperature, noise=self.noise, momentum=self.momentum, lr=self.lr,
                           batch_size=self.batch_size, n_classes=10)
                for s in self.seeds for k in self.n_tasks for t in self.strengths]

    def describe(self) -> str:
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, n_tasks={list(self.n_tasks)}, "
                f"strengths={[float(f'{t:g}') for t in self.strengths]}, "
                f"inference_batches={list(self.inference_batches)}, steps={self.steps}, n_eval={self.n_eval}, "
                f"router_samples={self.router_samples}, temperature={self.temperature:g}, noise={self.noise:g}, "
                f"momentum={self.momentum:g}, lr={self.lr:g}, batch_size={self.batch_size}")


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- one unit ------------------------------------------------------------------------------------------------------

def _train_heads(u: UnitConfig, bank: StatisticBank, pinned: torch.nn.Module, tasks: list) -> tuple[list, list]:
    """Train each new task's head twice in lockstep: banked (train-mode BN into its bank) and pinned (task A's stats)."""
    backbone = bank.model
    heads, pinned_heads = [], []
    for j in range(1, u.n_tasks):
        name = TASK_NAMES[j]
        bank.copy_bank(j - 1, j)  # bank j starts where the shared drifting statistics would be
        head = seeded((u.seed, "init", "ch06_head", name), lambda: make_head("linear", backbone.out_features, u.n_classes))
        head_p = copy.deepcopy(head)
        opts = [torch.optim.SGD(h.parameters(), lr=u.lr, momentum=0.9) for h in (head, head_p)]
        stream = BatchStream(tasks[j], u.batch_size, generator(u.seed, "stream", name))
        with bank.use(j):
            for _ in range(u.steps):
                x, y = stream.next()
                with torch.no_grad():
                    backbone.train()
                    f = backbone(x)          # batch statistics; bank j's buffers update
                    backbone.eval()
                    fp = pinned(x)           # task A's running statistics
                for h, o, feats in ((head, opts[0], f), (head_p, opts[1], fp)):
                    loss = F.cross_entropy(h(feats), y)
                    o.zero_grad(set_to_none=True)
                    loss.backward()
                    o.step()
        backbone.eval()
        heads.append(head.requires_grad_(False))
        pinned_heads.append(head_p.requires_grad_(False))
    return heads, pinned_heads


def run_unit(u: UnitConfig, source: dict) -> dict:
    """Train, route and measure one unit; returns ``{"records": [...], "oracle_logit_change": ..., "wall_s": ...}``.

    ``records``: one dict per (task, condition, inference batch size) with ``routing_accuracy``
    (fraction of the task's samples sent to its own bank; NaN for ``train_mode`` and ``pinned``),
    ``accuracy`` and ``accuracy_routed_head`` (fractions 0..1).
    """
    t0 = time.perf_counter()
    backbone = ConvBackbone(3, SourceConfig.widths, "batch", u.momentum)
    backbone.load_state_dict(source["backbone"])
    backbone.requires_grad_(False).eval()
    head_a = make_head("linear", backbone.out_features, u.n_classes)
    head_a.load_state_dict(source["head_a"])
    head_a.requires_grad_(False)
    pinned = copy.deepcopy(backbone).eval()
    bank = StatisticBank(backbone, u.n_tasks)
    tasks = [make_task(u.seed, TASK_NAMES[j], u.n_classes, u.noise, *shift_of(TASK_NAMES[j], u.strength))
             for j in range(u.n_tasks)]
    new_heads, pinned_new = _train_heads(u, bank, pinned, tasks)
    heads, pinned_heads = [head_a] + new_heads, [head_a] + pinned_new
    K = u.n_tasks
    dev = torch.device("cpu")

    evals = [eval_set(tasks[i], u.n_eval, u.seed, TASK_NAMES[i]) for i in range(K)]
    ref_a = head_a(logits_of(pinned, evals[0][0], dev))
    # features and per-sample moments at every layer, per task and bank
    feats, moms = {}, {}
    for k in range(K):
        with bank.use(k):
            for i, (x, _) in enumerate(evals):
                feats[i, k] = logits_of(backbone, x, dev)
                moms[i, k] = sample_moments(bank, x, "all")
    first = bank.layer_names[0]
    router_first = NearestStatistics(bank, "first")
    router_all = NearestStatistics(bank, "all")
    mixture = SoftMixture(bank, u.temperature, "first")
    # classifier training data: each task's training distribution (not the evaluation sets)
    train_moms = [sample_moments(bank, BatchStream(tasks[k], u.router_samples,
                                                   generator(u.seed, "router", TASK_NAMES[k])).next()[0], "first")
                  for k in range(K)]

    records = []
    oracle_logits_a = heads[0](feats[0, 0])
    oracle_change = float((oracle_logits_a.double() - ref_a.double()).abs().max())

    def add(i, cond, b, route, acc, acc_routed):
        records.append(dict(task=TASK_NAMES[i], condition=cond, inference_batch=b,
                            routing_accuracy=math.nan if route is None else float((route == i).double().mean()),
                            accuracy=acc, accuracy_routed_head=acc_routed))

    def hard(i, route, y):
        # per sample: logits of the routed bank with the true head, and with the routed head
        stack = torch.stack([feats[i, k] for k in range(K)])          # (K, N, F)
        f = stack[route, torch.arange(len(route))]
        true_head = heads[i](f)
        routed = torch.stack([heads[k](f) for k in range(K)])[route, torch.arange(len(route))]
        return accuracy(true_head, y), accuracy(routed, y)

    for b in u.inference_batches:
        clf = StatisticsClassifier(bank)
        tf = torch.cat([clf.features_from_moments(m, b) for m in train_moms])
        tl = torch.cat([torch.full((u.router_samples // b,), k, dtype=torch.long) for k in range(K)])
        clf.fit_features(tf, tl)
        for i, (x, y) in enumerate(evals):
            first_moms = {first: moms[i, 0][first]}
            d_first = router_first.distances_from_moments([first_moms], b)
            n = len(y)
            routes = {
                "nearest_first": d_first.argmin(1).repeat_interleave(b),
                "nearest_all": router_all.distances_from_moments([moms[i, k] for k in range(K)], b)
                .argmin(1).repeat_interleave(b),
                "classifier": clf.decide(clf.features_from_moments(first_moms, b)).repeat_interleave(b),
            }
            for cond, r in routes.items():
                add(i, cond, b, r, *hard(i, r, y))
            w = mixture.weights_from_distances(d_first, n)
            with torch.no_grad(), bank.use_blend(w):
                fm = backbone(x)
            r = w.argmax(1)
            routed = torch.stack([heads[k](fm) for k in range(K)])[r, torch.arange(n)]
            add(i, "mixture", b, r, accuracy(heads[i](fm), y), accuracy(routed, y))
            oracle = torch.full((n,), i, dtype=torch.long)
            add(i, "oracle", b, oracle, *hard(i, oracle, y))
            last = torch.full((n,), K - 1, dtype=torch.long)
            add(i, "train_mode", b, None, hard(i, last, y)[0], math.nan)
            acc_p = accuracy(pinned_heads[i](logits_of(pinned, x, dev)), y)
            add(i, "pinned", b, None, acc_p, math.nan)
    return dict(records=records, oracle_logit_change=oracle_change, source_task_a_accuracy=source["task_a_accuracy"],
                wall_s=time.perf_counter() - t0)


def _unit_group(units: list[UnitConfig], cache_root: str, version: str) -> list[dict]:
    return [run_unit(u, load_source(u.source, cache_root, version)) for u in units]


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run chapter 6's sweep; one row per (seed, n_tasks, strength, task, condition, inference_batch).

    Columns: ``seed, n_tasks, strength, task, brightness, contrast, condition, inference_batch,
    routing_accuracy, accuracy, accuracy_routed_head, oracle_logit_change, source_task_a_accuracy,
    unit_wall_s`` (``unit_wall_s``: seconds for the whole unit). Resumable through the run cache.
    """
    if not isinstance(config, Config):
        raise TypeError(f"run needs an unknown_task.Config (see make_config), got {type(config).__name__}")
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    version = code_version()
    units = config.units()
    ensure_sources([u.source for u in units], ex, version)
    rows = run_sweep(units, _unit_group, namespace=NAMESPACE, cache_dir=root, execution=ex,
                     group_kwargs={"cache_root": root, "version": version}, version=version,
                     desc="chapter 6 units")
    out = []
    for u, (_, row) in zip(units, rows.iterrows()):
        for rec in row["records"]:
            b, c = shift_of(rec["task"], u.strength)
            out.append(dict(seed=u.seed, n_tasks=u.n_tasks, strength=u.strength, brightness=b, contrast=c, **rec,
                            oracle_logit_change=row["oracle_logit_change"],
                            source_task_a_accuracy=row["source_task_a_accuracy"], unit_wall_s=row["wall_s"]))
    return pd.DataFrame(out)


# --- tidy tables ---------------------------------------------------------------------------------------------------

KEYS = ["n_tasks", "strength", "inference_batch", "condition"]


def seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """Per seed and cell: accuracy and routing accuracy averaged over the tasks (equal-sized evaluation sets)."""
    return (df.groupby(["seed"] + KEYS, sort=False)[["routing_accuracy", "accuracy", "accuracy_routed_head"]]
            .mean().reset_index())


def routing_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``seed, n_tasks, strength, inference_batch, condition, routing_accuracy`` for the four routers."""
    m = seed_means(df)
    return m[m.condition.isin(ROUTERS)][["seed"] + KEYS + ["routing_accuracy"]].reset_index(drop=True)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``seed, n_tasks, strength, inference_batch, condition, accuracy, accuracy_routed_head`` (task means)."""
    return seed_means(df)[["seed"] + KEYS + ["accuracy", "accuracy_routed_head"]]


def _paired_gap(m: pd.DataFrame, cond: str, ref: str, value: str = "accuracy") -> pd.DataFrame:
    keys = ["seed", "n_tasks", "strength", "inference_batch"]
    a = m[m.condition == cond].set_index(keys)[value]
    b = m[m.condition == ref].set_index(keys)[value]
    return (a - b.reindex(a.index)).rename("difference").reset_index()


def gap_table(df: pd.DataFrame, reference: str = "oracle") -> pd.DataFrame:
    """Per cell: mean and 95% interval (Student t over seeds) of ``accuracy(condition) - accuracy(reference)``.

    Columns ``n_tasks, strength, inference_batch, condition, mean, ci_low, ci_high, n_seeds``;
    every condition except ``reference``.
    """
    m = seed_means(df)
    recs = []
    for cond in [c for c in CONDITIONS if c != reference and c in set(m.condition)]:
        g = _paired_gap(m, cond, reference)
        for key, grp in g.groupby(["n_tasks", "strength", "inference_batch"]):
            iv = mean_ci(grp["difference"])
            recs.append(dict(zip(["n_tasks", "strength", "inference_batch"], key), condition=cond, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(recs)


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order as given)."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p)
    adj = np.empty_like(p)
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[idx]))
        adj[idx] = running
    return adj


def tost(diffs, margin: float) -> bool:
    """Two one-sided t tests at 5%: is the mean of ``diffs`` within ``(-margin, margin)``? (90% interval inside.)"""
    v = np.asarray(diffs, dtype=float)
    m = float(v.mean())
    if len(v) < 2 or v.std() == 0:
        return abs(m) < margin
    half = float(sps.sem(v) * sps.t.ppf(0.95, len(v) - 1))
    return -margin < m - half and m + half < margin


# --- findings ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Findings:
    """Every number and verdict chapter 6's prose cites (accuracies and routing accuracies are fractions 0..1).

    Keys of the dict fields are ``k<n_tasks>_<router>`` (e.g. ``k2_nearest_first``); "gentle" is the
    smallest swept strength above zero, "strong" the largest; ``b1``/``bmax`` the smallest and largest inference
    batch. ``route_*``: routing accuracy (mean and 95% interval over seeds, tasks averaged within a
    seed). ``gap_*``: paired ``accuracy(router) - accuracy(oracle)``. ``oracle_vs_train`` /
    ``oracle_vs_pinned``: paired ``accuracy(oracle) - accuracy(baseline)`` at the strong shift, per
    ``k<n_tasks>``. ``works_from_b1`` / ``works_from_bmax``: per ``k<n>_nearest_first``, the smallest
    strength from which the mean routing accuracy stays >= :data:`ROUTE_OK` (NaN: never).
    ``worst_gap``: the most negative cell mean of router minus oracle over the whole grid, and where
    (``worst_*``). ``n_worse`` of ``n_cells``: router cells significantly below the oracle after
    Holm's correction over all cells (paired t tests, 5%). ``gentle_equivalent``: per ``k<n>_<router>``
    at the gentle shift and b = 1, whether router and oracle are equivalent within
    :data:`TOST_MARGIN` (TOST). ``oracle_exact``: the oracle's task-A logits equal the source
    model's (== 0, every unit).
    """

    n_seeds: int
    route_ok: float
    tost_margin: float
    gentle: float
    strong: float
    b1: int
    bmax: int
    oracle_exact: str
    route_gentle_b1: dict
    route_gentle_bmax: dict
    route_strong_b1: dict
    route_strong_bmax: dict
    gap_gentle_b1: dict
    gap_strong_b1: dict
    gap_strong_b1_routed_head: dict
    oracle_vs_train: dict
    oracle_vs_pinned: dict
    works_from_b1: dict
    works_from_bmax: dict
    worst_gap: Interval
    worst_router: str
    worst_strength: float
    worst_batch: int
    worst_n_tasks: int
    n_worse: int
    n_cells: int
    gentle_equivalent: dict


def findings(df: pd.DataFrame) -> Findings:
    """Chapter 6's findings from :func:`run`'s table (every router and baseline, >= 2 seeds, >= 3 strengths).

    Raises ``ValueError`` if a condition is missing.
    """
    missing = set(CONDITIONS) - set(df["condition"])
    if missing:
        raise ValueError(f"findings needs every condition; missing {sorted(missing)}")
    m = seed_means(df)
    strengths = sorted(m.strength.unique())
    batches = sorted(m.inference_batch.unique())
    positive = [t for t in strengths if t > 0]
    gentle = positive[0] if positive else strengths[0]
    strong, b1, bmax = strengths[-1], batches[0], batches[-1]

    def cell(col, cond, k, t, b, ref=None):
        sel = (m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)
        if ref is None:
            return mean_ci(m[sel & (m.condition == cond)][col])
        g = _paired_gap(m[sel], cond, ref, col)
        return mean_ci(g["difference"])

    ks = sorted(m.n_tasks.unique())
    per = lambda f: {f"k{k}_{r}": f(k, r) for k in ks for r in ROUTERS}
    works = {}
    for b, store in ((b1, "b1"), (bmax, "bmax")):
        works[store] = {}
        for k in ks:
            means = [cell("routing_accuracy", "nearest_first", k, t, b).mean for t in strengths]
            ok = [t for i, t in enumerate(strengths) if all(v >= ROUTE_OK for v in means[i:])]
            works[store][f"k{k}_nearest_first"] = min(ok) if ok else math.nan
    gaps = gap_table(df)
    rg = gaps[gaps.condition.isin(ROUTERS)]
    worst = rg.loc[rg["mean"].idxmin()]
    # Holm over every router cell: one-sided paired t test of router < oracle
    pvals, cells = [], []
    for (k, t, b, c), _ in rg.groupby(["n_tasks", "strength", "inference_batch", "condition"]):
        d = _paired_gap(m[(m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)], c, "oracle")["difference"]
        if len(d) < 2 or d.std() == 0:
            p = 1.0  # no variance to test against (identical seeds, or one seed): no claim
        else:
            p = float(sps.ttest_1samp(d, 0.0, alternative="less").pvalue)
        pvals.append(p)
        cells.append((k, t, b, c))
    adj = holm(pvals)
    sel = lambda k, t, b, c: _paired_gap(m[(m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)], c,
                                         "oracle")["difference"]
    return Findings(
        n_seeds=int(m.seed.nunique()), route_ok=ROUTE_OK, tost_margin=TOST_MARGIN, gentle=float(gentle), strong=float(strong), b1=int(b1), bmax=int(bmax),
        oracle_exact=verdict(bool((df["oracle_logit_change"] == 0).all())),
        route_gentle_b1=per(lambda k, r: cell("routing_accuracy", r, k, gentle, b1)),
        route_gentle_bmax=per(lambda k, r: cell("routing_accuracy", r, k, gentle, bmax)),
        route_strong_b1=per(lambda k, r: cell("routing_accuracy", r, k, strong, b1)),
        route_strong_bmax=per(lambda k, r: cell("routing_accuracy", r, k, strong, bmax)),
        gap_gentle_b1=per(lambda k, r: cell("accuracy", r, k, gentle, b1, "oracle")),
        gap_strong_b1=per(lambda k, r: cell("accuracy", r, k, strong, b1, "oracle")),
        gap_strong_b1_routed_head=per(lambda k, r: _routed_head_gap(m, k, strong, b1, r)),
        oracle_vs_train={f"k{k}": cell("accuracy", "oracle", k, strong, b1, "train_mode") for k in ks},
        oracle_vs_pinned={f"k{k}": cell("accuracy", "oracle", k, strong, b1, "pinned") for k in ks},
        works_from_b1=works["b1"], works_from_bmax=works["bmax"],
        worst_gap=Interval(float(worst["mean"]), float(worst["ci_low"]), float(worst["ci_high"]), int(worst["n_seeds"])),
        worst_router=str(worst["condition"]), worst_strength=float(worst["strength"]),
        worst_batch=int(worst["inference_batch"]), worst_n_tasks=int(worst["n_tasks"]),
        n_worse=int((adj < 0.05).sum()), n_cells=len(cells),
        gentle_equivalent={f"k{k}_{r}": verdict(tost(sel(k, gentle, b1, r), TOST_MARGIN)) for k in ks for r in ROUTERS},
    )


def _routed_head_gap(m: pd.DataFrame, k: int, t: float, b: int, router: str) -> Interval:
    """Paired ``accuracy_routed_head(router) - accuracy(oracle)``: the cost when the router also picks the head."""
    keys = ["seed"]
    sel = m[(m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)]
    a = sel[sel.condition == router].set_index(keys)["accuracy_routed_head"]
    o = sel[sel.condition == "oracle"].set_index(keys)["accuracy"]
    return mean_ci(a - o.reindex(a.index))


def full_profile_estimate(df: pd.DataFrame, config: Config, workers: int = 2) -> float:
    """Estimated wall time (seconds) of the full profile from this run's measured per-unit cost.

    The mean measured unit time per ``n_tasks`` is scaled by the larger of the ``steps`` and ``n_eval``
    ratios (full over this run), times the full profile's unit count, divided by ``workers``. Crude: training
    scales with steps and evaluation with n_eval, not both with the larger ratio, so it overestimates.
    """
    full = make_config("full")
    units = df.drop_duplicates(["seed", "n_tasks", "strength"])
    per_k = units.groupby("n_tasks")["unit_wall_s"].mean()
    scale = max(full.steps / config.steps, full.n_eval / config.n_eval)
    n_units = len(full.seeds) * len(full.strengths)
    return float(sum(per_k.get(k, per_k.mean()) * scale * n_units for k in full.n_tasks) / workers)
