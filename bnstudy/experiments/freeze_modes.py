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

from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..analysis import Interval, mean_ci, paired, summarize, verdict
from ..config import Execution, RunConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label, HEAD_KINDS, OPTIMIZERS
from ..config import RunConfig as _RunConfig
from ..engine import DRIFT_STEPS, accuracy as _accuracy, ensure_sources, load_source, logits_of, make_optimizer, \
    memory_format_for, seeded, transfer_sweep
from ..models import ConvBackbone, make_head
from ..modes import MODE_NAMES
from ..sweep import code_version, default_cache_dir, run_sweep
from ..tasks import BatchStream, eval_set, generator, make_task

NAMESPACE = "ch01_freeze_modes"
#: The profiles' settings (everything else is a ``Config`` default).
PROFILES = {"quick": dict(seeds=3, tuning_seeds=(100, 101), confirm_seeds=(200, 201), checkpoints=(400, 800, 1600)),
            "full": dict(seeds=10, tuning_seeds=(100, 101, 102), confirm_seeds=(200, 201, 202, 203, 204),
                         checkpoints=(400, 800, 1600, 3200))}
#: Learning rates tried per optimizer for the head sweep (validation accuracy on the tuning seeds picks one
#: per optimizer and path). SGD's grid brackets the book's original 0.05; Adam's spans PyTorch's default 1e-3.
SGD_LRS = (0.005, 0.02, 0.05, 0.2)
ADAM_LRS = (0.001, 0.003, 0.01, 0.03, 0.1)
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
    tuning_seeds: tuple = (100, 101)
    confirm_seeds: tuple = (200, 201)
    checkpoints: tuple = (400, 800, 1600)
    sgd_lrs: tuple = SGD_LRS
    adam_lrs: tuple = ADAM_LRS
    thread_seeds: int = 2

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("tuning_seeds", check_seeds(self.tuning_seeds))
        self._set("confirm_seeds", check_seeds(self.confirm_seeds))
        groups = (set(self.seeds), set(self.tuning_seeds), set(self.confirm_seeds))
        if any(a & b for i, a in enumerate(groups) for b in groups[i + 1:]):
            raise ValueError(f"seeds, tuning_seeds and confirm_seeds must not share a seed (a setting chosen on a "
                             f"seed would be judged on it), got {list(self.seeds)}, {list(self.tuning_seeds)}, "
                             f"{list(self.confirm_seeds)}")
        self._set("checkpoints", tuple(sorted(check_sequence("checkpoints", self.checkpoints,
                                                             lambda n, v: check_int(n, v, 1), 1))))
        for name in ("sgd_lrs", "adam_lrs"):
            self._set(name, check_sequence(name, getattr(self, name),
                                           lambda n, v: check_float(n, v, 0.0, low_open=True), 1))
        self._set("thread_seeds", check_int("thread_seeds", self.thread_seeds, 0))
        if self.thread_seeds > len(self.seeds):
            raise ValueError(f"thread_seeds must be <= the number of seeds ({len(self.seeds)}), got {self.thread_seeds}")
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
        if self.steps not in self.checkpoints:
            raise ValueError(f"checkpoints must include steps={self.steps} (the head sweep is compared with the main "
                             f"run there), got {list(self.checkpoints)}")

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
                f"momentum={self.momentum:g}, head={self.head}, optimizer={self.optimizer}, lr={self.lr:g}; "
                f"head sweep: sgd lrs {'/'.join(f'{v:g}' for v in self.sgd_lrs)}, adam lrs "
                f"{'/'.join(f'{v:g}' for v in self.adam_lrs)}, tuning {seeds_label(self.tuning_seeds)}, "
                f"confirmation {seeds_label(self.confirm_seeds)}, checkpoints {'/'.join(map(str, self.checkpoints))}; "
                f"thread check on {self.thread_seeds} seeds (1 vs 2 torch threads)")


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
    pinned_equal_b_every_seed: bool
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
        f4_separate_matches_b=verdict(bool((piv["task_b"]["separate_stats"] == piv["task_b"]["train_mode"]).all())),
        separate_equals_train_b_every_seed=bool((piv["task_b"]["separate_stats"] == piv["task_b"]["train_mode"]).all()),
        pinned_equal_b_every_seed=bool((piv["task_b"]["backbone_eval"] == piv["task_b"]["all_eval"]).all()),
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


# --- the head's optimizer, swept (issue 10) ------------------------------------------------------------------------
#
# With a linear head, the four modes feed the new head through only two feature maps: the backbone with batch
# statistics while training and drifted running statistics at evaluation (``train_mode``; ``separate_stats`` is the
# same computation on a copy of the buffers), and the backbone with task A's running statistics throughout
# (``backbone_eval``; ``all_eval`` differs only in head modules, and a linear head has none). The sweep therefore
# trains every (optimizer, learning rate) head on these two "paths" in one pass per seed, sharing each step's
# backbone forward (the backbone is frozen, so a head's learning rate cannot change what it is fed). The main run's
# table checks both identities exactly, and ``tests/test_freeze_modes.py`` checks that a path's head equals the
# engine's :func:`bnstudy.engine.transfer` with ``==``.


SWEEP_NAMESPACE = "ch01_head_sweep"
#: path -> the freeze modes whose task-B head it computes (linear head).
PATHS = {"batch_stats": ("train_mode", "separate_stats"), "pinned": ("backbone_eval", "all_eval")}
#: Validation and reference-fit sets: their own generator tags, never the test set's ``("eval", "B")``.
VAL_TAG, FIT_TAG = "B-validation", "B-reference-fit"
N_VAL, N_FIT = 1000, 4000
#: L2 penalty of the reference logistic regression (on standardised features; mean cross-entropy + l2/2 |W|^2).
REF_L2 = 1e-4


@dataclass(frozen=True)
class HeadSweepRun(_Frozen):
    """One seed of the head sweep: the run cache's key. ``role``: ``tune``, ``report`` or ``confirm``."""

    seed: int
    role: str
    run: dict
    checkpoints: tuple
    sgd_lrs: tuple
    adam_lrs: tuple
    ref_step: int
    n_val: int = N_VAL
    n_fit: int = N_FIT
    ref_l2: float = REF_L2

    def run_config(self) -> _RunConfig:
        return _RunConfig(**{**self.run, "seed": self.seed, "mode": "train_mode", "steps": max(self.checkpoints)})


def head_sweep_runs(config: Config) -> list[HeadSweepRun]:
    """The sweep's runs: tuning seeds, the reported seeds, the confirmation seeds (in that order)."""
    base = config.run_configs()[0].asdict()
    base = {k: v for k, v in base.items() if k not in ("seed", "mode", "steps", "optimizer", "lr")}
    base["head"] = "linear"
    return [HeadSweepRun(seed=s, role=role, run=base, checkpoints=config.checkpoints, sgd_lrs=config.sgd_lrs,
                         adam_lrs=config.adam_lrs, ref_step=config.steps)
            for role, seeds in (("tune", config.tuning_seeds), ("report", config.seeds),
                                ("confirm", config.confirm_seeds)) for s in seeds]


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float = REF_L2, max_rounds: int = 50):
    """Multinomial logistic regression fitted to convergence with full-batch L-BFGS (float64).

    ``x (N, D)`` features, ``y (N,)`` labels. Features are standardised with the fit set's mean
    and standard deviation (an affine map a linear head can represent); the objective is mean
    cross-entropy plus ``l2 / 2 * ||W||^2`` (bias unpenalised), strictly convex, so L-BFGS
    (strong-Wolfe line search, as scikit-learn's ``lbfgs`` solver) reaches its unique optimum.
    Returns ``(predict, grad_norm)``: ``predict(x) -> logits (N, K)`` and the final gradient's
    max-norm (convergence: below 1e-5). Raises ``ValueError`` on mismatched shapes.
    """
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"fit_logistic needs x (N, D) and y (N,), got {tuple(x.shape)} and {tuple(y.shape)}")
    x = x.double()
    mu, sd = x.mean(0), x.std(0)
    sd = torch.where(sd > 0, sd, torch.ones_like(sd))
    z = (x - mu) / sd
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=200, tolerance_grad=1e-7, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(z @ w + b, y) + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    gnorm = math.inf
    for _ in range(max_rounds):
        opt.step(closure)
        closure()
        gnorm = float(max(w.grad.abs().max(), b.grad.abs().max()))
        if gnorm < 1e-5:
            break
    w, b = w.detach(), b.detach()
    return (lambda xn: (((xn.double() - mu) / sd) @ w + b)), gnorm


def head_curves(c: HeadSweepRun, source: dict, device=None) -> dict:
    """One seed of the head sweep: every (path, optimizer, lr) head, evaluated at every checkpoint.

    Returns ``records``: dicts ``path, optimizer, lr, step, split, accuracy`` (``split`` is
    ``validation`` or ``test``; the reference, :func:`fit_logistic` on ``n_fit`` task-B samples
    drawn with their own tag, has ``optimizer="reference"``, ``lr=0`` and is fitted on the
    features as they are at step ``ref_step``: with the drifted running statistics on the
    ``batch_stats`` path, task A's on the ``pinned`` path), and the reference's convergence
    (``reference_grad_<path>``: the final gradient's max-norm). Every head of the seed starts from
    the engine's head-B initialisation and sees the engine's task-B batch stream.
    """
    rc = c.run_config()
    device = torch.device("cpu") if device is None else torch.device(device)
    task_b = make_task(rc.seed, "B", rc.n_classes, rc.noise, rc.brightness, rc.contrast)
    sets = {"test": eval_set(task_b, rc.n_eval, rc.seed, "B"), "validation": eval_set(task_b, c.n_val, rc.seed, VAL_TAG)}
    fit = eval_set(task_b, c.n_fit, rc.seed, FIT_TAG)
    stream = BatchStream(task_b, rc.batch_size, generator(rc.seed, "stream", "B"), rc.sampler)
    paths = {}
    for path, modes in PATHS.items():
        fmt = memory_format_for(modes[0])
        bb = ConvBackbone(3, rc.widths, rc.norm, rc.momentum)
        bb.load_state_dict(source["backbone"])
        bb.requires_grad_(False)
        bb = bb.to(device, memory_format=fmt).train(path == "batch_stats")
        heads = []
        for opt_name, lrs in (("sgd", c.sgd_lrs), ("adam", c.adam_lrs)):
            for lr in lrs:
                head = seeded((rc.seed, "init", "head_b", "linear"),
                              lambda: make_head("linear", bb.out_features, rc.n_classes, rc.hidden, rc.momentum))
                head = head.to(device)
                heads.append((opt_name, lr, head, make_optimizer(opt_name, head.parameters(), lr)))
        paths[path] = (bb, fmt, heads)
    records, extra = [], {}
    for step in range(1, max(c.checkpoints) + 1):
        x, y = stream.next()
        y = y.to(device)
        for bb, fmt, heads in paths.values():
            with torch.no_grad():
                f = bb(x.to(device, memory_format=fmt))
            for _, _, head, opt in heads:
                loss = F.cross_entropy(head(f), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        if step in c.checkpoints:
            for path, (bb, fmt, heads) in paths.items():
                bb.eval()
                feats = {s: logits_of(bb, xs, device, fmt) for s, (xs, _) in sets.items()}
                for opt_name, lr, head, _ in heads:
                    with torch.no_grad():
                        for s, (_, ys) in sets.items():
                            records.append(dict(path=path, optimizer=opt_name, lr=lr, step=step, split=s,
                                                accuracy=_accuracy(head(feats[s].to(device)).cpu(), ys)))
                if step == c.ref_step:
                    predict, gnorm = fit_logistic(logits_of(bb, fit[0], device, fmt), fit[1], rc.n_classes, c.ref_l2)
                    extra[f"reference_grad_{path}"] = gnorm
                    for s, (_, ys) in sets.items():
                        records.append(dict(path=path, optimizer="reference", lr=0.0, step=step, split=s,
                                            accuracy=_accuracy(predict(feats[s]).float(), ys)))
                bb.train(path == "batch_stats")
    return dict(records=records, **extra)


def _head_sweep_group(configs: list[HeadSweepRun], cache_root: str, version: str) -> list[dict]:
    return [head_curves(c, load_source(c.run_config().source, cache_root, version)) for c in configs]


def run_head_sweep(config: Config, execution: Execution | None = None, version: str | None = None) -> pd.DataFrame:
    """The head sweep (cached, resumable): a tidy table ``seed, role, path, optimizer, lr, step, split, accuracy``.

    ``table.attrs["reference_grads"]``: every reference fit's final gradient max-norm. Raises
    ``ValueError`` unless ``config.head == "linear"`` (the two-path shortcut needs a head
    without modes of its own).
    """
    if config.head != "linear":
        raise ValueError(f"the head sweep needs head='linear' (two feature paths cover the four modes only for a "
                         f"linear head), got head={config.head!r}")
    ex = execution or Execution()
    root = str(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    version = version or code_version()
    runs = head_sweep_runs(config)
    ensure_sources([r.run_config().source for r in runs], ex, version)
    out = run_sweep(runs, _head_sweep_group, namespace=SWEEP_NAMESPACE, cache_dir=root, execution=ex,
                    group_kwargs={"cache_root": root, "version": version}, version=version, desc="head sweep")
    recs = [dict(seed=r.seed, role=r.role, **rec) for r, (_, row) in zip(runs, out.iterrows()) for rec in row["records"]]
    table = pd.DataFrame(recs, columns=["seed", "role", "path", "optimizer", "lr", "step", "split", "accuracy"])
    table.attrs["reference_grads"] = [float(row[f"reference_grad_{p}"]) for _, row in out.iterrows() for p in PATHS]
    return table


def gap_table(chosen: pd.DataFrame, step: int) -> pd.DataFrame:
    """Tidy paired gaps ``seed, role, optimizer, gap`` (``batch_stats - pinned`` test accuracy) at ``step``
    (the reference at its own single step)."""
    recs = []
    for (role, o), g in chosen.groupby(["role", "optimizer"]):
        st = step if o != "reference" else g["step"].min()
        piv = g[g["step"] == st].pivot(index="seed", columns="path", values="accuracy")
        recs += [dict(seed=s, role=role, optimizer=o, gap=float(v)) for s, v in (piv["batch_stats"] - piv["pinned"]).items()]
    return pd.DataFrame(recs, columns=["seed", "role", "optimizer", "gap"])


def choose_lrs(sweep: pd.DataFrame, step: int) -> dict:
    """Learning rate per ``(optimizer, path)``: the best mean *validation* accuracy over the tuning seeds at ``step``.

    Only rows with ``role == "tune"`` and ``split == "validation"`` are read (never a test set, never a
    reported seed). Ties go to the smaller learning rate. Raises ``ValueError`` if none are present.
    """
    t = sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["step"] == step)
              & (sweep["optimizer"] != "reference")]
    if t.empty:
        raise ValueError(f"choose_lrs: no tuning-seed validation rows at step {step}")
    mean = t.groupby(["optimizer", "path", "lr"])["accuracy"].mean().reset_index()
    mean = mean.sort_values(["optimizer", "path", "accuracy", "lr"], ascending=[True, True, False, True])
    return {(o, p): float(g["lr"].iloc[0]) for (o, p), g in mean.groupby(["optimizer", "path"])}


def chosen_table(sweep: pd.DataFrame, lrs: dict) -> pd.DataFrame:
    """Test-set rows of the chosen heads (and the reference), reported and confirmation seeds:
    ``seed, role, path, optimizer, lr, step, accuracy``."""
    t = sweep[(sweep["split"] == "test") & (sweep["role"] != "tune")]
    keep = t.apply(lambda r: r["optimizer"] == "reference" or lrs.get((r["optimizer"], r["path"])) == r["lr"], axis=1)
    return t[keep].drop(columns="split").reset_index(drop=True)


def lr_table(sweep: pd.DataFrame, step: int) -> pd.DataFrame:
    """What was tried: validation accuracy per tuning seed, ``seed, path, optimizer, lr, accuracy`` at ``step``."""
    t = sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["step"] == step)
              & (sweep["optimizer"] != "reference")]
    return t[["seed", "path", "optimizer", "lr", "accuracy"]].reset_index(drop=True)


def _path_gap(t: pd.DataFrame, optimizer: str, role: str, step: int) -> pd.Series:
    s = t[(t["optimizer"] == optimizer) & (t["role"] == role) & (t["step"] == step)]
    piv = s.pivot(index="seed", columns="path", values="accuracy")
    return piv["batch_stats"] - piv["pinned"]


@dataclass(frozen=True)
class OptimizerFindings:
    """Finding 3 (task B) per head optimizer and for the optimizer-free reference (accuracies 0..1).

    ``lr``: chosen learning rate per ``<optimizer>_<path>``. ``acc``: mean test accuracy of the
    reported seeds at the main step per ``<optimizer>_<path>`` (optimizer ``reference`` too).
    ``gap`` / ``gap_confirm``: paired ``batch_stats - pinned`` (= ``train_mode`` minus
    ``backbone_eval``) per optimizer on the reported / confirmation seeds at the main step;
    ``f3`` / ``f3_confirm``: ``"holds"`` when that interval lies above 0. ``gap_by_step``: per
    ``<optimizer>_<step>`` on the reported seeds, ``gap_last`` per optimizer at the last
    checkpoint. ``gain_last``: paired gain per
    ``<optimizer>_<path>`` from the second-to-last to the last checkpoint; ``still_improving``:
    ``"yes"`` where that interval lies above 0. ``reference_converged``: every fit's gradient
    max-norm below 1e-5. ``engine_check``: largest |sweep - engine| test accuracy for the main
    run's optimizer and lr (NaN when its lr is not in the grid).
    """

    main_step: int
    last_step: int
    prev_step: int
    lr: dict
    acc: dict
    gap: dict
    f3: dict
    gap_confirm: dict
    f3_confirm: dict
    gap_by_step: dict
    gap_last: dict
    gain_last: dict
    still_improving: dict
    reference_converged: bool
    engine_check: float


def optimizer_findings(sweep: pd.DataFrame, main_step: int, reference_grads=None,
                       main: pd.DataFrame | None = None) -> OptimizerFindings:
    """:class:`OptimizerFindings` from :func:`run_head_sweep`'s table.

    ``reference_grads``: the fits' gradient max-norms (``None``: not checked, reported as converged
    only if empty). ``main``: the engine's results table (for ``engine_check``). Raises
    ``ValueError`` if ``main_step`` is not a checkpoint or fewer than two checkpoints exist.
    """
    steps = sorted(sweep["step"].unique())
    if main_step not in steps or len(steps) < 2:
        raise ValueError(f"optimizer_findings needs main_step among >= 2 checkpoints, got {main_step} in {steps}")
    lrs = choose_lrs(sweep, main_step)
    t = chosen_table(sweep, lrs)
    ref_steps = sorted(t[t["optimizer"] == "reference"]["step"].unique())
    opts = [o for o in ("sgd", "adam") if (o, "pinned") in lrs] + (["reference"] if ref_steps else [])
    step_of = lambda o: (ref_steps[0] if o == "reference" else main_step)
    acc, gap, f3, gapc, f3c, gain, improving, by_step = {}, {}, {}, {}, {}, {}, {}, {}
    rep = t[t["role"] == "report"]
    for o in opts:
        for p in PATHS:
            acc[f"{o}_{p}"] = float(rep[(rep["optimizer"] == o) & (rep["path"] == p) & (rep["step"] == step_of(o))]
                                    ["accuracy"].mean())
        gap[o] = mean_ci(_path_gap(t, o, "report", step_of(o)))
        f3[o] = verdict(gap[o].low > 0)
        if (t["role"] == "confirm").any():
            gapc[o] = mean_ci(_path_gap(t, o, "confirm", step_of(o)))
            f3c[o] = verdict(gapc[o].low > 0)
        if o != "reference":
            for s in steps:
                by_step[f"{o}_{s}"] = mean_ci(_path_gap(t, o, "report", s))
            for p in PATHS:
                piv = rep[(rep["optimizer"] == o) & (rep["path"] == p)].pivot(index="seed", columns="step",
                                                                             values="accuracy")
                gain[f"{o}_{p}"] = mean_ci(piv[steps[-1]] - piv[steps[-2]])
                improving[f"{o}_{p}"] = "yes" if gain[f"{o}_{p}"].low > 0 else "no"
    check = math.nan
    if main is not None:
        o, lr = str(main["optimizer"].iloc[0]), float(main["lr"].iloc[0])
        s = sweep[(sweep["role"] == "report") & (sweep["split"] == "test") & (sweep["step"] == main_step)
                  & (sweep["optimizer"] == o) & (sweep["lr"] == lr)]
        if not s.empty:
            diffs = [abs(float(r["accuracy"]) - float(main[(main["seed"] == r["seed"]) & (main["mode"] == m)]["task_b"].iloc[0]))
                     for _, r in s.iterrows() for m in PATHS[r["path"]] if r["seed"] in set(main["seed"])]
            check = max(diffs) if diffs else math.nan
    grads = [] if reference_grads is None else list(reference_grads)
    return OptimizerFindings(main_step=int(main_step), last_step=int(steps[-1]), prev_step=int(steps[-2]),
                             lr={f"{o}_{p}": v for (o, p), v in lrs.items()}, acc=acc, gap=gap, f3=f3,
                             gap_confirm=gapc, f3_confirm=f3c, gap_by_step=by_step,
                             gap_last={o: by_step[f"{o}_{steps[-1]}"] for o in opts if o != "reference"}, gain_last=gain,
                             still_improving=improving, reference_converged=bool(all(g < 1e-5 for g in grads)),
                             engine_check=float(check))


# --- numerical noise: the same runs at another torch thread count (issue 10) ---------------------------------------

def thread_check(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """The first ``config.thread_seeds`` seeds run end to end (stage 1 included) at two torch thread counts.

    ``execution.threads`` (the main run's) and the other of 1/2, the second in its own cache
    folder (``threads`` is not part of a cache key). Returns ``seed, mode, threads, task_b,
    task_a_after`` (tidy). Raises ``ValueError`` when ``thread_seeds < 2``.
    """
    if config.thread_seeds < 2:
        raise ValueError(f"thread_check needs thread_seeds >= 2, got {config.thread_seeds}")
    ex = execution or Execution()
    root = Path(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    other = 2 if ex.threads == 1 else 1
    sub = config.replace(seeds=config.seeds[:config.thread_seeds])
    frames = []
    for th, cache in ((ex.threads, root), (other, root / f"threads{other}")):
        e = ex.replace(threads=th, cache_dir=str(cache))
        d = transfer_sweep(sub.run_configs(), NAMESPACE, e, desc=f"thread check ({th} threads)")
        frames.append(d.assign(threads=th)[["seed", "mode", "threads", "task_b", "task_a_after"]])
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class ThreadFindings:
    """Run-to-run variation between two torch thread counts (accuracies 0..1).

    ``max_diff_b`` / ``mean_diff_b``: largest and mean |task_b(t1) - task_b(t2)| over (seed, mode);
    ``max_diff_a``: the same for task A after stage 2; ``n_differ``: runs whose task B differs;
    ``gap_diff_max``: largest change of the per-seed gap ``train_mode - backbone_eval``;
    ``gap_seed_sd``: the standard deviation over seeds of that gap (1 thread), for scale.
    """

    n_runs: int
    n_differ: int
    max_diff_b: float
    mean_diff_b: float
    max_diff_a: float
    gap_diff_max: float
    gap_seed_sd: float


def thread_findings(tc: pd.DataFrame) -> ThreadFindings:
    """:class:`ThreadFindings` from :func:`thread_check`'s table (two thread counts). Raises ``ValueError`` otherwise."""
    ths = sorted(tc["threads"].unique())
    if len(ths) != 2:
        raise ValueError(f"thread_findings needs exactly two thread counts, got {ths}")
    a, b = (tc[tc["threads"] == t].set_index(["seed", "mode"]).sort_index() for t in ths)
    d_b, d_a = (a["task_b"] - b["task_b"]).abs(), (a["task_a_after"] - b["task_a_after"]).abs()
    gap = lambda x: x["task_b"].xs("train_mode", level="mode") - x["task_b"].xs("backbone_eval", level="mode")
    ga, gb = gap(a), gap(b)
    return ThreadFindings(n_runs=len(d_b), n_differ=int((d_b > 0).sum()), max_diff_b=float(d_b.max()),
                          mean_diff_b=float(d_b.mean()), max_diff_a=float(d_a.max()),
                          gap_diff_max=float((ga - gb).abs().max()), gap_seed_sd=float(ga.std(ddof=1)))
