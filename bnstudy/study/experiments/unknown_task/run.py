"""Chapter 6, what is trained: one frozen backbone with a :class:`~bnstudy.study.banks.StatisticBank` (bank 0: task A's
BatchNorm statistics; bank ``j``: new task ``j``'s, accumulated in train mode while its head learns), and every
evaluation input routed to a bank by the routers of :mod:`bnstudy.study.routing`, which see only the input. Tasks
(:func:`bnstudy.study.tasks.make_task`): task A plus ``n_tasks - 1`` tasks shifted by :func:`shift_of` or, in the
shift families, :func:`corruption_of`.

Conditions per task, all from one trained backbone per seed (paired): the :data:`ROUTERS` at each inference batch
size (one decision per ``b`` consecutive samples of one task); ``oracle`` (the task's own bank); ``train_mode`` (one
set of statistics drifting through the new tasks in order); ``pinned`` (task A's statistics, heads trained on them).
``accuracy`` uses the true task's head, ``accuracy_routed_head`` the routed one (the task fully unknown).

A train-mode BatchNorm's output depends only on the batch, and bank ``j`` starts from bank ``j-1``'s final
statistics, so the heads trained under ``train_mode`` are the banks' heads and the drifting statistics after the last
task *are* the last bank (a check, not a finding): one training pass per task serves oracle, routers and
``train_mode``; ``pinned`` heads train in lockstep on the same batches.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from ...banks import StatisticBank
from ...config import Execution, SourceConfig, _Frozen, check_choice, check_float, check_seeds, from_profile
from ...design import ChapterConfig, Rule
from ...engine import accuracy, ensure_sources, load_source, logits_of, seeded, source_version
from ...models import ConvBackbone, make_head
from ...routing import NearestStatistics, SoftMixture, StatisticsClassifier, sample_moments
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, TemplateTask, eval_set, gaussian_blur, generator, make_task

NAMESPACE = "ch06_unknown_task"
#: Every parameter decides the units, so rows given to the page must come with every parameter as that run had it.
ANALYSIS_PARAMETERS = ()
#: The namespace of the shift families that are not brightness/contrast (:func:`run_families`).
FAMILY_NAMESPACE = "ch06_shift_families"
#: Parameters added after rows of the release were computed, with their value for those rows (docs/chapter-code.md).
READ_DEFAULTS: dict = {"shift_families": (), "family_strengths": ()}
#: The tables saved beside ``06_unknown_task.csv`` that the page analyses (:func:`run_tables`).
SIBLING_TABLES = ("temperature", "families")
TASK_NAMES = ("A", "B", "C", "D")
ROUTERS = ("nearest_first", "nearest_all", "classifier", "mixture")
#: The routers that make a hard choice (the mixture blends banks).
HARD_ROUTERS = ("nearest_first", "nearest_all", "classifier")
BASELINES = ("oracle", "train_mode", "pinned")
CONDITIONS = ROUTERS + BASELINES
#: Equivalence margin (accuracy, fraction) for "routing costs about nothing".
TOST_MARGIN = 0.02
#: Routing accuracy that counts as "routing works" (shown above it by a one-sided t test).
ROUTE_OK = 0.9

#: Shift families no per-channel affine map undoes (issue 35): ``(blur std in px, extra pixel noise std)`` per unit
#: of strength, per new task (the tasks' own pixel noise is 3). Fixed before any family was run, from chapter 3's
#: blur (up to 3 px) and added-noise (up to 6) ranges; not tuned.
FAMILY_SHIFTS = {
    "blur": {"B": (2.0, 0.0), "C": (1.0, 0.0), "D": (3.0, 0.0)},
    "noise": {"B": (0.0, 3.0), "C": (0.0, 1.5), "D": (0.0, 4.5)},
    "mix": {"B": (2.0, 3.0), "C": (2.0, 0.0), "D": (0.0, 3.0)},
}
SHIFT_FAMILIES = tuple(FAMILY_SHIFTS)

#: quick: about a minute on this project's 2-core CPU; full: see the chapter's profile note.
PROFILES = {
    "quick": dict(seeds=2, strengths=(0.0, 0.005, 1.0), steps=50, n_eval=160, router_samples=128,
                  shift_families=("mix",), family_strengths=(0.25, 1.0, 2.0)),
    "full": dict(seeds=10, strengths=(0.0, 0.0025, 0.005, 0.01, 0.03, 0.1, 0.25, 0.5, 1.0), steps=300, n_eval=960,
                 router_samples=1024, shift_families=SHIFT_FAMILIES, family_strengths=(0.1, 0.25, 0.5, 1.0, 2.0)),
}
#: Settings chosen by trying, disclosed on the page: the first temperature and strength grid.
TEMPERATURE_TRIED_FIRST = 1.0
FIRST_STRENGTH_GRID = (0.0625, 0.25, 1.0)
#: The temperature check: held-out seeds, four tasks, one decision per sample, the mixture at extra temperatures.
TEMPERATURE_CHECK = {
    "quick": dict(seeds=(10, 11), n_tasks=(4,), strengths=(0.03, 0.1, 1.0), inference_batches=(1,),
                  check_temperatures=(0.03, 0.3, 1.0)),
    "full": dict(seeds=(10, 11, 12, 13, 14), n_tasks=(4,), strengths=(0.03, 0.1, 1.0), inference_batches=(1,),
                 check_temperatures=(0.01, 0.03, 0.3, 1.0)),
}


def shift_of(task: str, strength: float) -> tuple[float, float]:
    """``(brightness, contrast)`` of ``task`` (``A``..``D``) at shift ``strength >= 0``. Task A is never shifted."""
    check_choice("task", task, TASK_NAMES)
    t = check_float("strength", strength, 0.0)
    b, c = {"A": (0.0, 1.0), "B": (4 * t, 1 + 4 * t), "C": (-4 * t, 1 + 4 * t), "D": (0.0, 1 / (1 + 4 * t))}[task]
    return round(b, 9), round(c, 9)


def corruption_of(task: str, family: str, strength: float) -> tuple[float, float]:
    """``(blur, noise)`` of ``task`` in shift ``family`` (:data:`FAMILY_SHIFTS`) at ``strength >= 0``: the blur's
    std in pixels and the extra pixel noise's std. Task A is never shifted. Raises ``ValueError`` naming the
    parameter for an unknown task or family or a negative strength."""
    check_choice("task", task, TASK_NAMES)
    check_choice("shift_family", family, SHIFT_FAMILIES)
    t = check_float("strength", strength, 0.0)
    blur, noise = FAMILY_SHIFTS[family].get(task, (0.0, 0.0))
    return round(blur * t, 9), round(noise * t, 9)


@dataclass(frozen=True)
class CorruptedTask(TemplateTask):
    """A :class:`~bnstudy.study.tasks.TemplateTask` whose samples are blurred (std ``blur`` pixels) and then get extra
    Gaussian pixel noise (std ``extra_noise``, from the sample's own generator): :func:`corruption_of`'s shifts."""

    blur: float = 0.0
    extra_noise: float = 0.0

    def sample(self, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Images ``(len(labels), 3, 32, 32)``: the task's sample, blurred, then noised."""
        x = super().sample(labels, gen)
        if self.blur > 0:
            x = gaussian_blur(x, self.blur)
        if self.extra_noise > 0:
            x = x + self.extra_noise * torch.randn(x.shape, generator=gen)
        return x


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
    check_temperatures: tuple = ()

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=self.momentum)


@dataclass(frozen=True)
class FamilyUnitConfig(UnitConfig):
    """A unit of a shift family that is not brightness/contrast (:data:`FAMILY_SHIFTS`): :class:`UnitConfig`'s
    fields and ``shift_family`` (its own namespace, :data:`FAMILY_NAMESPACE`, so the brightness/contrast units'
    keys are unchanged)."""

    shift_family: str = "mix"


def unit_tasks(u: UnitConfig) -> list[TemplateTask]:
    """The ``u.n_tasks`` tasks of a unit (``A``, ``B``, ...): brightness/contrast (:func:`shift_of`) for a
    :class:`UnitConfig`, blur and noise (:func:`corruption_of`) for a :class:`FamilyUnitConfig`."""
    family = getattr(u, "shift_family", None)
    out = []
    for name in TASK_NAMES[:u.n_tasks]:
        if family is None:
            out.append(make_task(u.seed, name, u.n_classes, u.noise, *shift_of(name, u.strength)))
            continue
        base = make_task(u.seed, name, u.n_classes, u.noise)
        blur, extra = corruption_of(name, family, u.strength)
        out.append(CorruptedTask(base.templates, base.noise, blur=blur, extra_noise=extra) if blur or extra else base)
    return out


class Config(ChapterConfig):
    """Chapter 6's parameters (the notebook's parameters cell; ``ValueError`` naming a bad one). ``steps``, ``lr``,
    ``batch_size``: each new head's training (SGD, momentum 0.9); ``router_samples``: samples per task the classifier
    router is fitted on; ``temperature``: the mixture's (nats); ``check_temperatures``: extra mixture temperatures at
    the smallest batch (:func:`temperature_check_config`); ``noise``, ``momentum``: pixel noise, BatchNorm momentum."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1), n_tasks=(2, 4), strengths=(0.0, 0.005, 1.0),
                      inference_batches=(1, 2, 8, 32), steps=50, n_eval=160, router_samples=128, temperature=0.1,
                      noise=3.0, momentum=0.1, lr=0.05, batch_size=64, check_temperatures=(), shift_families=("mix",),
                      family_strengths=(0.25, 1.0, 2.0))

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds}
    RULES = (
        Rule("seeds", lambda c: f"disjoint from the temperature check's held-out seeds {list(TEMPERATURE_CHECK[c.profile]['seeds'])} "
             "(run.TEMPERATURE_CHECK; a setting checked on a seed would be judged on it)",
             lambda c: bool(c.check_temperatures) or not set(c.seeds) & set(TEMPERATURE_CHECK[c.profile]["seeds"])),
        Rule("n_tasks", "one or more task counts from 2 to 4", lambda c: c.n_tasks and set(c.n_tasks) <= {2, 3, 4}),
        Rule("strengths", "at least 3 strictly increasing strengths >= 0",
             lambda c: len(c.strengths) >= 3 and list(c.strengths) == sorted(set(c.strengths)) and c.strengths[0] >= 0),
        Rule("inference_batches", "one or more integers >= 1",
             lambda c: c.inference_batches and min(c.inference_batches) >= 1),
        Rule("steps", "an integer >= 1", lambda c: c.steps >= 1),
        Rule("n_eval", "a multiple of every inference batch size", lambda c: all(
            c.n_eval >= 1 and c.n_eval % b == 0 for b in c.inference_batches)),
        Rule("router_samples", "a multiple of every inference batch size with at least two batches each",
             lambda c: all(c.router_samples % b == 0 and c.router_samples // b >= 2 for b in c.inference_batches)),
        Rule("temperature", "> 0", lambda c: c.temperature > 0),
        Rule("noise", ">= 0", lambda c: c.noise >= 0),
        Rule("momentum", "in (0, 1]", lambda c: 0 < c.momentum <= 1),
        Rule("lr", "> 0", lambda c: c.lr > 0),
        Rule("batch_size", "an integer >= 2", lambda c: c.batch_size >= 2),
        Rule("check_temperatures", "temperatures > 0", lambda c: all(t > 0 for t in c.check_temperatures)),
        Rule("shift_families", f"distinct names from {list(SHIFT_FAMILIES)} (none: no family table)",
             lambda c: set(c.shift_families) <= set(SHIFT_FAMILIES) and len(set(c.shift_families)) == len(c.shift_families)),
        Rule("family_strengths", "strictly increasing strengths > 0 (at least one when shift_families is set)",
             lambda c: list(c.family_strengths) == sorted(set(c.family_strengths))
             and all(t > 0 for t in c.family_strengths) and (len(c.family_strengths) > 0 or not c.shift_families)),
        Rule("family_strengths", lambda c: f"its default {list(PROFILES[c.profile]['family_strengths'])} or empty when "
             "shift_families is empty (no family runs at them: give shift_families too)", lambda c: bool(
                 c.shift_families) or c.family_strengths in ((), PROFILES[c.profile]["family_strengths"],
                                                             type(c).PARAMETERS["family_strengths"])),
    )

    def units(self, strengths: tuple | None = None) -> list[UnitConfig]:
        """One :class:`UnitConfig` per (seed, n_tasks, strength), seeds outermost."""
        return [UnitConfig(seed=s, n_tasks=k, strength=t, steps=self.steps, n_eval=self.n_eval,
                           router_samples=self.router_samples, inference_batches=self.inference_batches,
                           temperature=self.temperature, noise=self.noise, momentum=self.momentum, lr=self.lr,
                           batch_size=self.batch_size, n_classes=10, check_temperatures=self.check_temperatures)
                for s in self.seeds for k in self.n_tasks for t in (self.strengths if strengths is None else strengths)]

    def family_units(self) -> list[FamilyUnitConfig]:
        """One :class:`FamilyUnitConfig` per (shift family, seed, n_tasks, family strength), families outermost."""
        return [FamilyUnitConfig(**{f.name: getattr(u, f.name) for f in fields(UnitConfig)}, shift_family=fam)
                for fam in self.shift_families for u in self.units(self.family_strengths)]


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


def temperature_check_config(config: Config) -> Config:
    """``config`` with :data:`TEMPERATURE_CHECK` of its profile. Raises ``ValueError`` if a held-out seed is
    reported."""
    overlap = sorted(set(TEMPERATURE_CHECK[config.profile]["seeds"]) & set(config.seeds))
    if overlap:
        raise ValueError(f"the temperature check's seeds must not be reported seeds; {overlap} are in both")
    return config.replace(**TEMPERATURE_CHECK[config.profile])


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
    tasks = unit_tasks(u)
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
    # classifier training data: each task's training distribution (not the evaluation sets)
    train_moms = [sample_moments(bank, BatchStream(tasks[k], u.router_samples,
                                                   generator(u.seed, "router", TASK_NAMES[k])).next()[0], "first")
                  for k in range(K)]

    records = []
    oracle_logits_a = heads[0](feats[0, 0])
    oracle_change = float((oracle_logits_a.double() - ref_a.double()).abs().max())

    def add(i, cond, b, route, acc, acc_routed, tau=math.nan):
        records.append(dict(task=TASK_NAMES[i], condition=cond, inference_batch=b,
                            routing_accuracy=math.nan if route is None else float((route == i).double().mean()),
                            accuracy=acc, accuracy_routed_head=acc_routed, temperature=tau))

    def mixed(i, x, y, d, n, tau):
        w = SoftMixture(bank, tau, "first").weights_from_distances(d, n)
        with torch.no_grad(), bank.use_blend(w):
            fm = backbone(x)
        r = w.argmax(1)
        routed = torch.stack([heads[k](fm) for k in range(K)])[r, torch.arange(n)]
        return r, accuracy(heads[i](fm), y), accuracy(routed, y)

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
            add(i, "mixture", b, *mixed(i, x, y, d_first, n, u.temperature), tau=u.temperature)
            if b == u.inference_batches[0]:
                for tau in u.check_temperatures:
                    add(i, f"mixture_tau={tau:g}", b, *mixed(i, x, y, d_first, n, tau), tau=tau)
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


def _sweep(units: list, namespace: str, desc: str, execution: Execution | None) -> pd.DataFrame:
    """Run ``units`` (resumable through the run cache); one row per unit record, with the unit's shift columns."""
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    version = source_version()  # stage 1's code version: the units read the backbones with it
    ensure_sources([u.source for u in units], ex, version)
    rows = run_sweep(units, _unit_group, namespace=namespace, cache_dir=root, execution=ex,
                     group_kwargs={"cache_root": root, "version": version}, desc=desc)
    out = []
    for u, (_, row) in zip(units, rows.iterrows()):
        for rec in row["records"]:
            family = getattr(u, "shift_family", None)
            if family is None:
                b, c = shift_of(rec["task"], u.strength)
                shift = dict(strength=u.strength, brightness=b, contrast=c)
            else:
                b, c = corruption_of(rec["task"], family, u.strength)
                shift = dict(shift_family=family, strength=u.strength, blur=b, extra_noise=c)
            out.append(dict(seed=u.seed, n_tasks=u.n_tasks, **shift, **rec,
                            oracle_logit_change=row["oracle_logit_change"],
                            source_task_a_accuracy=row["source_task_a_accuracy"], unit_wall_s=row["wall_s"]))
    return pd.DataFrame(out)


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Chapter 6's sweep (resumable): one row per (seed, n_tasks, strength, task, condition, inference_batch) with
    the task's shift, :func:`run_unit`'s record and ``unit_wall_s`` (seconds for the whole unit)."""
    return _sweep(config.units(), NAMESPACE, "chapter 6 units", execution)


#: The family table's columns (an empty table keeps them).
FAMILY_COLUMNS = ("seed", "n_tasks", "shift_family", "strength", "blur", "extra_noise", "task", "condition",
                  "inference_batch", "routing_accuracy", "accuracy", "accuracy_routed_head", "temperature",
                  "oracle_logit_change", "source_task_a_accuracy", "unit_wall_s")


def run_families(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """:func:`run`'s rows for ``config.shift_families`` at ``config.family_strengths``, with ``shift_family, blur,
    extra_noise`` in place of ``brightness, contrast`` (empty when no family is asked)."""
    units = config.family_units()
    if not units:
        return pd.DataFrame(columns=list(FAMILY_COLUMNS))
    return _sweep(units, FAMILY_NAMESPACE, "chapter 6 shift families", execution)[list(FAMILY_COLUMNS)]


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """What the page analyses: ``(run(config), {"temperature": ..., "families": ...})``. Raises ``TypeError`` for
    another config."""
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs an unknown_task.Config (see make_config), got {type(config).__name__}")
    return run(config, execution), dict(temperature=run(temperature_check_config(config), execution),
                                        families=run_families(config, execution))


def sibling_parameters(config: Config) -> dict:
    """``{"temperature": (parameters, resolved)}``: the temperature table's sidecar records the check's own config."""
    from ...report import config_parameters
    return {"temperature": config_parameters(temperature_check_config(config), {}, ANALYSIS_PARAMETERS)}


# --- run costs and sidecars ---------------------------------------------------------------------------------------

def run_workers(provenance: dict | None, execution: Execution) -> int:
    """The worker processes of the run behind the page: the earlier run's record, else ``execution``'s."""
    import os
    return int((provenance or {}).get("workers") or execution.n_jobs or os.cpu_count())


def worker_minutes(*tables: pd.DataFrame) -> float:
    """Worker-minutes to compute every unit of ``tables`` from an empty cache."""
    return float(sum(t.drop_duplicates([c for c in ("shift_family", "seed", "n_tasks", "strength") if c in t])
                     .unit_wall_s.sum() for t in tables)) / 60


def sidecar_parameters(config: Config) -> dict:
    """A run table's sidecar parameters: ``$BNSTUDY_RUN_PARAMETERS`` with every field of ``config`` as used."""
    import json
    import os
    return {**json.loads(os.environ.get("BNSTUDY_RUN_PARAMETERS") or "{}"), **config.asdict()}

