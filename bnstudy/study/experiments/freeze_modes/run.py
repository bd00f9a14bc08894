"""Chapter 1, what is trained: stage 2 freezes the backbone in one of the four modes (:mod:`bnstudy.study.modes`),
trains a new head on task B and measures task A again, paired over seeds (same backbone, head-B initialisation and
batch stream); then the head sweep and the thread check. :func:`run_tables` returns every table the page analyses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ...config import Execution, RunConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label
from ...config import RunConfig as _RunConfig
from ...design import ChapterConfig, Rule
from ....freeze import batchnorm_layers
from ...engine import DRIFT_STEPS, accuracy as _accuracy, ensure_sources, load_source, logits_of, make_optimizer, \
    memory_format_for, seeded, source_version, transfer_sweep
from ...models import ConvBackbone, make_head
from ...modes import MODE_NAMES
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, eval_set, generator, make_task

NAMESPACE = "ch01_freeze_modes"
#: Learning rates tried per optimizer in the head sweep (validation accuracy on the tuning seeds picks one per
#: optimizer and path). SGD's grid reaches down to 0.001 so that the pinned path's best rate is inside it and up to
#: 0.5 because the 400-step choice on the ``train_mode`` path was the former top, 0.2 (referee, item 8).
SGD_LRS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2, 0.5)
ADAM_LRS = (0.001, 0.003, 0.01, 0.03, 0.1)
#: Standardized heads (referee item 6): the same linear head fed ``(f - mean) / sd``, the path's training-feature
#: statistics on the fit set, fixed before training (only the optimization's conditioning changes).
STD_SUFFIX = "-std"
STD_SGD_LRS = (0.005, 0.02, 0.05, 0.2)
STD_ADAM_LRS = (0.003, 0.01, 0.03)
#: quick: the pipeline in minutes (each path's best rate and a neighbour either side, two checkpoints); full: all.
PROFILES = {"quick": dict(seeds=3, tuning_seeds=(100, 101), confirm_seeds=(200, 201), checkpoints=(400, 800),
                          sgd_lrs=(0.001, 0.005, 0.05, 0.2), adam_lrs=(0.003, 0.01, 0.03, 0.1),
                          std_sgd_lrs=(0.02, 0.05, 0.2), std_adam_lrs=(0.003, 0.01, 0.03), ablation=False),
            "full": dict(seeds=10, tuning_seeds=(100, 101, 102), confirm_seeds=(200, 201, 202, 203, 204),
                         checkpoints=(400, 800, 1600, 3200), sgd_lrs=SGD_LRS, adam_lrs=ADAM_LRS,
                         std_sgd_lrs=STD_SGD_LRS, std_adam_lrs=STD_ADAM_LRS, ablation=True)}
#: The drift figure's noise floor is read at recorded steps where (1 - m)^t is below this.
FLOOR_WEIGHT = 1e-4
#: Analysis-only parameters: none. Added after the release's rows were computed (docs/chapter-code.md): ``ablation``.
ANALYSIS_PARAMETERS = ()
READ_DEFAULTS: dict = {"ablation": False}
#: The tables :func:`run_tables` returns beside the main one (``01_freeze_modes_<suffix>.csv``), in this order.
SIBLING_TABLES = ("drift", "logit_quantiles", "head_sweep", "reference_grads", "buffers", "drift_targets", "threads",
                  "ablation")
#: Issue 35's ablation of the reproduction's sizes against the seed article's: the main run's ``train_mode`` and
#: ``backbone_eval`` at other pixel noise (1: the tasks' default, 3: the book's) and stage-1 length (400: the book's),
#: all else equal, on the reported seeds. The seed article gives neither value; fixed before any was run.
ABLATION = dict(noise=(1.0, 2.0, 3.0), stage1_steps=(400, 1600), modes=("train_mode", "backbone_eval"))


def floor_steps(momentum: float, steps: int) -> list[int]:
    """Recorded drift steps (:data:`bnstudy.study.engine.DRIFT_STEPS`) up to ``steps`` where ``(1 - m)^t < 1e-4``."""
    return [t for t in DRIFT_STEPS if 0 < t <= steps and (1 - momentum) ** t < FLOOR_WEIGHT]


def _positive_floats(name):
    return lambda v: check_sequence(name, v, lambda n, x: check_float(n, x, 0.0, low_open=True), 1)


def _checkpoints_fix(c) -> list:
    """The checkpoints to suggest: those below ``steps`` (else half of it), then ``steps``."""
    below = [x for x in c.checkpoints if x < c.steps] or ([c.steps // 2] if c.steps >= 2 else [])
    return below + [c.steps]


class Config(ChapterConfig):
    """Chapter 1's parameters (the notebook's parameters cell, one for one, documented there). Raises
    ``ValueError`` naming the parameter for any bad value (every run's also by
    :class:`bnstudy.study.config.RunConfig`), before any work starts."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1, 2), modes=MODE_NAMES, steps=800, brightness=4.0, contrast=5.0,
                      noise=3.0, momentum=0.1, head="linear", optimizer="sgd", lr=0.05, tuning_seeds=(100, 101),
                      confirm_seeds=(200, 201), checkpoints=(400, 800, 1600), sgd_lrs=SGD_LRS, adam_lrs=ADAM_LRS,
                      std_sgd_lrs=STD_SGD_LRS, std_adam_lrs=STD_ADAM_LRS, thread_seeds=2, ablation=False)

    PROFILES = PROFILES
    NORMALIZE = {
        "seeds": check_seeds, "tuning_seeds": check_seeds, "confirm_seeds": check_seeds,
        "modes": lambda v: check_sequence("modes", v, lambda n, x: check_choice(n, x, MODE_NAMES), 1),
        "momentum": lambda v: check_float("momentum", v, 0.0, 1.0, low_open=True),
        "checkpoints": lambda v: tuple(sorted(check_sequence("checkpoints", v, lambda n, x: check_int(n, x, 1), 2))),
        **{name: _positive_floats(name) for name in ("sgd_lrs", "adam_lrs", "std_sgd_lrs", "std_adam_lrs")},
        "thread_seeds": lambda v: check_int("thread_seeds", v, 0),
    }
    RULES = (
        Rule("seeds", "disjoint from tuning_seeds and confirm_seeds (a setting chosen on a seed would be judged on it)",
             lambda c: not ({*c.seeds} & {*c.tuning_seeds} or {*c.seeds} & {*c.confirm_seeds}
                            or {*c.tuning_seeds} & {*c.confirm_seeds})),
        Rule("thread_seeds", "from 2 (the thread check's interval needs two seeds) to the number of seeds",
             lambda c: 2 <= c.thread_seeds <= len(c.seeds)),
        Rule("head", "'linear' (the head sweep, compared with the main run at steps, trains a linear head: two "
             "feature paths cover the four modes only for it; chapter 4 compares heads)", lambda c: c.head == "linear"),
        Rule("ablation", "True or False", lambda c: isinstance(c.ablation, bool)),
        Rule("steps", f"at least the first recorded step where (1 - momentum)^t < {FLOOR_WEIGHT} (the drift analysis' "
             "noise floor; 100 at momentum 0.1)", lambda c: "train_mode" not in c.modes or floor_steps(c.momentum,
                                                                                                       c.steps)),
        Rule("checkpoints", lambda c: f"a list that includes steps={c.steps} (the head sweep is compared with the main run there); "
             f"pass checkpoints={_checkpoints_fix(c)} with it (on the command line: -y \"checkpoints: "
             f"{_checkpoints_fix(c)}\")", lambda c: c.steps in c.checkpoints),
    )

    def __post_init__(self):
        super().__post_init__()
        self.run_configs()  # every run's values, with the engine's own messages

    def run_configs(self) -> list[RunConfig]:
        """One :class:`RunConfig` per (seed, mode), seeds outermost."""
        return [RunConfig(seed=s, mode=m, steps=self.steps, brightness=self.brightness, contrast=self.contrast,
                          noise=self.noise, momentum=self.momentum, head=self.head, optimizer=self.optimizer,
                          lr=self.lr)
                for s in self.seeds for m in self.modes]

    def describe(self) -> str:
        """The page's run line (the grids as ``a/b/c``)."""
        g = lambda v: "/".join(f"{x:g}" for x in v)  # noqa: E731
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, "
                f"brightness={self.brightness:g}, contrast={self.contrast:g}, noise={self.noise:g}, "
                f"momentum={self.momentum:g}, head={self.head}, optimizer={self.optimizer}, lr={self.lr:g}; "
                f"head sweep: sgd lrs {g(self.sgd_lrs)}, adam lrs {g(self.adam_lrs)} (standardized features: sgd "
                f"{g(self.std_sgd_lrs)}, adam {g(self.std_adam_lrs)}), tuning {seeds_label(self.tuning_seeds)}, "
                f"confirmation {seeds_label(self.confirm_seeds)}, checkpoints {'/'.join(map(str, self.checkpoints))}; "
                f"thread check on {self.thread_seeds} seeds (1 vs 2 torch threads)"
                + ("; ablation: noise " + "/".join(f"{x:g}" for x in ABLATION["noise"]) + ", stage-1 steps "
                   + "/".join(map(str, ABLATION["stage1_steps"])) if self.ablation else ""))


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``seeds=None``: the profile's)."""
    return from_profile(Config, PROFILES, profile, **overrides)


def ablation_configs(config: Config) -> list[RunConfig]:
    """The ablation's runs (:data:`ABLATION`; none when ``config.ablation`` is off): the main run's
    :class:`RunConfig` at each noise and stage-1 length (the book's own cell is the main run's, from the cache)."""
    if not config.ablation:
        return []
    base = config.run_configs()[0].asdict()
    return [RunConfig(**{**base, "seed": s, "mode": m, "noise": n, "stage1_steps": k})
            for n in ABLATION["noise"] for k in ABLATION["stage1_steps"] for s in config.seeds
            for m in ABLATION["modes"]]


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run chapter 1's experiment; one row per (seed, mode), columns of :func:`bnstudy.study.engine.transfer`."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs a freeze_modes.Config (see make_config), got {type(config).__name__}")
    return transfer_sweep(config.run_configs(), NAMESPACE, execution)


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without the list-valued columns (those are in the tidy tables below)."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]


def _block(i) -> str:
    return f"block {int(i) + 1}"


def drift_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy drift of the ``train_mode`` runs: ``seed, layer, step, weight`` (weight left on task A's running_mean)."""
    tm = df[df["mode"] == "train_mode"]
    cols = sorted(c for c in df.columns if c.startswith("drift_weight_l"))
    recs = [dict(seed=r["seed"], layer=_block(col.rsplit("l", 1)[1]), step=t, weight=w)
            for _, r in tm.iterrows() for col in cols for t, w in zip(r["drift_steps"], r[col])]
    return pd.DataFrame(recs, columns=["seed", "layer", "step", "weight"])


def logit_quantile_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy table of the old head's absolute logit change: ``mode, seed, quantile, change``."""
    qs = np.linspace(0, 1, 21)
    recs = [dict(mode=r["mode"], seed=r["seed"], quantile=q, change=v)
            for _, r in df.iterrows() for q, v in zip(qs, r["old_logit_change_q"])]
    return pd.DataFrame(recs, columns=["mode", "seed", "quantile", "change"])


# --- the head's optimizer, swept (issue 10) ------------------------------------------------------------------------
# With a linear head the four modes feed the new head through two feature maps ("paths"): batch statistics in
# training, drifted running statistics at evaluation (``train_mode``, ``separate_stats``), or task A's throughout
# (``backbone_eval``, ``all_eval``). Every (optimizer, lr) head trains on both paths in one pass per seed.

SWEEP_NAMESPACE = "ch01_head_sweep"
#: path -> the freeze modes whose task-B head it computes (linear head).
PATHS = {"batch_stats": ("train_mode", "separate_stats"), "pinned": ("backbone_eval", "all_eval")}
#: Validation and reference-fit sets: their own generator tags, never the test set's ``("eval", "B")``.
VAL_TAG, FIT_TAG = "B-validation", "B-reference-fit"
N_VAL, N_FIT = 1000, 4000
#: L2 penalty of the reference logistic regression (on standardised features; mean cross-entropy + l2/2 |W|^2).
REF_L2 = 1e-4
#: The reference's fits (l2 penalty, fit-set size: the first ``n`` samples); the first is the primary test's.
REF_VARIANTS = ((REF_L2, N_FIT), (1e-2, N_FIT), (1e-6, N_FIT), (REF_L2, 1000), (1e-2, 1000), (1e-6, 1000))
#: The drift check's target: precise BN over this many batches of the engine's population stream (the engine
#: uses its first :data:`ENGINE_TARGET_BATCHES`).
DRIFT_TARGET_BATCHES = 400
ENGINE_TARGET_BATCHES = 20


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
    ref_variants: tuple = REF_VARIANTS
    std_sgd_lrs: tuple = ()
    std_adam_lrs: tuple = ()
    drift_batches: int = 0

    def run_config(self) -> _RunConfig:
        return _RunConfig(**{**self.run, "seed": self.seed, "mode": "train_mode", "steps": max(self.checkpoints)})


def head_sweep_runs(config: Config) -> list[HeadSweepRun]:
    """The sweep's runs: tuning seeds, the reported seeds, the confirmation seeds (in that order)."""
    base = config.run_configs()[0].asdict()
    base = {k: v for k, v in base.items() if k not in ("seed", "mode", "steps", "optimizer", "lr")}
    base["head"] = "linear"
    return [HeadSweepRun(seed=s, role=role, run=base, checkpoints=config.checkpoints, sgd_lrs=config.sgd_lrs,
                         adam_lrs=config.adam_lrs, ref_step=config.steps, std_sgd_lrs=config.std_sgd_lrs,
                         std_adam_lrs=config.std_adam_lrs,
                         drift_batches=DRIFT_TARGET_BATCHES if role == "report" else 0)
            for role, seeds in (("tune", config.tuning_seeds), ("report", config.seeds),
                                ("confirm", config.confirm_seeds)) for s in seeds]


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float = REF_L2, max_rounds: int = 50):
    """Multinomial logistic regression on ``x (N, D)``, ``y (N,)``, fitted to convergence by full-batch L-BFGS
    (float64, strong-Wolfe line search as scikit-learn's ``lbfgs``) on features standardised with the fit set's mean
    and SD; objective mean cross-entropy + ``l2 / 2 * ||W||^2`` (bias unpenalised), strictly convex. Returns
    ``(predict, grad_norm)``: ``predict(x) -> logits (N, K)`` and the final gradient's max-norm (converged: < 1e-5).
    Raises ``ValueError`` on mismatched shapes."""
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


def buffer_changes(backbone: torch.nn.Module, source_state: dict) -> dict:
    """How far each BatchNorm layer's buffers moved from ``source_state`` (task A's), per layer ``i`` (the engine's
    ``l<i>`` order) the largest over channels of: ``buffer_mean_sd_l<i>`` ``|mean1 - mean0| / sqrt(var0 + eps)``
    (task A's running SDs), ``buffer_log_var_l<i>`` ``|log((var1 + eps) / (var0 + eps))|``, and the raw changes
    ``buffer_mean_abs_l<i>`` / ``buffer_var_abs_l<i>`` (the engine's ``drift_mean_l<i>`` / ``drift_var_l<i>``)."""
    out = {}
    for i, (name, m) in enumerate((n, m) for n, m in batchnorm_layers(backbone).items() if m.running_mean is not None):
        m0 = source_state[f"{name}.running_mean"].double()
        v0 = source_state[f"{name}.running_var"].double()
        m1, v1 = m.running_mean.detach().cpu().double(), m.running_var.detach().cpu().double()
        # rsqrt, not / sqrt: torch's float32 sqrt differs in the last bits between CPUs (bnstudy.study.numerics)
        out[f"buffer_mean_sd_l{i}"] = float(((m1 - m0).abs() * (v0 + m.eps).rsqrt()).max())
        out[f"buffer_log_var_l{i}"] = float(torch.log((v1 + m.eps) / (v0 + m.eps)).abs().max())
        out[f"buffer_mean_abs_l{i}"] = float((m1 - m0).abs().max())
        out[f"buffer_var_abs_l{i}"] = float((v1 - v0).abs().max())
    return out


def head_curves(c: HeadSweepRun, source: dict, device=None) -> dict:
    """One seed of the head sweep: every (path, optimizer, lr) head (the engine's head-B initialisation and batch
    stream) at every checkpoint, as ``records`` (``path, optimizer, lr, step, split, accuracy, l2, n_fit``); the
    reference (``optimizer="reference"``): :func:`fit_logistic` per ``c.ref_variants`` on eval-mode features at
    ``ref_step``, with ``reference_grad_<path>``; :func:`buffer_changes` of ``batch_stats`` at ``ref_step``; with
    ``c.drift_batches``, ``drift`` (:class:`_DriftRecorder`)."""
    rc = c.run_config()
    device = torch.device("cpu") if device is None else torch.device(device)
    task_b = make_task(rc.seed, "B", rc.n_classes, rc.noise, rc.brightness, rc.contrast)
    sets = {"test": eval_set(task_b, rc.n_eval, rc.seed, "B"), "validation": eval_set(task_b, c.n_val, rc.seed, VAL_TAG)}
    fit = eval_set(task_b, max(n for _, n in c.ref_variants), rc.seed, FIT_TAG)
    stream = BatchStream(task_b, rc.batch_size, generator(rc.seed, "stream", "B"), rc.sampler)
    nan = math.nan
    paths, std = {}, {}
    for path, modes in PATHS.items():
        fmt = memory_format_for(modes[0])
        bb = ConvBackbone(3, rc.widths, rc.norm, rc.momentum)
        bb.load_state_dict(source["backbone"])
        bb.requires_grad_(False)
        bb = bb.to(device, memory_format=fmt).train(path == "batch_stats")
        heads = []
        for opt_name, lrs in (("sgd", c.sgd_lrs), ("adam", c.adam_lrs), ("sgd" + STD_SUFFIX, c.std_sgd_lrs),
                              ("adam" + STD_SUFFIX, c.std_adam_lrs)):
            for lr in lrs:
                head = seeded((rc.seed, "init", "head_b", "linear"),
                              lambda: make_head("linear", bb.out_features, rc.n_classes, rc.hidden, rc.momentum))
                head = head.to(device)
                heads.append((opt_name, lr, head, make_optimizer(opt_name.removesuffix(STD_SUFFIX),
                                                                  head.parameters(), lr)))
        if c.std_sgd_lrs or c.std_adam_lrs:
            std[path] = _feature_standardizer(bb, fit[0], rc.batch_size, device, fmt)
        paths[path] = (bb, fmt, heads)
    drift = (_DriftRecorder(paths["batch_stats"][0], task_b, rc, c, device, paths["batch_stats"][1])
             if c.drift_batches else None)
    records, extra = [], {}
    for step in range(1, max(c.checkpoints) + 1):
        x, y = stream.next()
        y = y.to(device)
        for path, (bb, fmt, heads) in paths.items():
            with torch.no_grad():
                f = bb(x.to(device, memory_format=fmt))
                fz = std[path](f) if path in std else None
            for name, _, head, opt in heads:
                loss = F.cross_entropy(head(fz if name.endswith(STD_SUFFIX) else f), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        if drift is not None:
            drift.record(step)
        if step in c.checkpoints:
            for path, (bb, fmt, heads) in paths.items():
                bb.eval()
                feats = {s: logits_of(bb, xs, device, fmt) for s, (xs, _) in sets.items()}
                zfeats = {s: std[path](v.to(device)) for s, v in feats.items()} if path in std else None
                for opt_name, lr, head, _ in heads:
                    fs = zfeats if opt_name.endswith(STD_SUFFIX) else feats
                    with torch.no_grad():
                        for s, (_, ys) in sets.items():
                            records.append(dict(path=path, optimizer=opt_name, lr=lr, step=step, split=s,
                                                accuracy=_accuracy(head(fs[s].to(device)).cpu(), ys), l2=nan,
                                                n_fit=nan))
                if step == c.ref_step:
                    if path == "batch_stats":
                        extra.update(buffer_changes(bb, source["backbone"]))
                    fx = logits_of(bb, fit[0], device, fmt)
                    grads = []
                    for l2, n in c.ref_variants:
                        predict, gnorm = fit_logistic(fx[:n], fit[1][:n], rc.n_classes, l2)
                        grads.append(gnorm)
                        for s, (_, ys) in sets.items():
                            records.append(dict(path=path, optimizer="reference", lr=0.0, step=step, split=s,
                                                accuracy=_accuracy(predict(feats[s]).float(), ys), l2=float(l2),
                                                n_fit=int(n)))
                    extra[f"reference_grad_{path}"] = max(grads)
                bb.train(path == "batch_stats")
    if drift is not None:
        extra["drift"] = drift.weights()
    return dict(records=records, **extra)


def _feature_standardizer(bb: torch.nn.Module, x: torch.Tensor, batch_size: int, device, fmt):
    """``f -> (f - mean) / sd`` with the mean and SD of the features ``bb`` *trains* the head on, over ``x``: in
    train mode a deep copy runs batches of ``batch_size`` (``bb``'s buffers untouched), in eval mode the eval-mode
    features. Fixed before the head trains (an affine map a linear head can represent)."""
    import copy
    work = copy.deepcopy(bb)
    n = max(batch_size, len(x) // batch_size * batch_size) if work.training else len(x)
    with torch.no_grad():
        if work.training:
            f = torch.cat([work(x[i:i + batch_size].to(device, memory_format=fmt)) for i in range(0, n, batch_size)])
        else:
            f = logits_of(work, x, device, fmt).to(device)
    mu, sd = f.mean(0), f.std(0)
    sd = torch.where(sd > 0, sd, torch.ones_like(sd))
    return lambda v: (v - mu) / sd


class _DriftRecorder:
    """The drift check on the ``batch_stats`` path: each layer's running_mean at the recorded steps up to
    ``c.ref_step``, projected as the engine does, ``w_t = (m_t - mu) . (m_0 - mu) / |m_0 - mu|^2``, on two targets
    ``mu``: precise BN over the engine's first :data:`ENGINE_TARGET_BATCHES` population batches and over
    ``c.drift_batches``."""

    def __init__(self, bb, task_b, rc, c, device, fmt):
        from ....running_stats import precise_bn_statistics
        self.bb, self.c = bb, c
        self.layers = [(n, m) for n, m in batchnorm_layers(bb).items() if m.running_mean is not None]
        self.means = {0: [m.running_mean.detach().cpu().double().clone() for _, m in self.layers]}

        def batches(k):
            stream = BatchStream(task_b, max(rc.batch_size, 2), generator(rc.seed, "population", "B"))
            return (stream.next()[0].to(device, memory_format=fmt) for _ in range(k))

        self.targets = {}
        for label, k in (("engine", ENGINE_TARGET_BATCHES), ("precise", c.drift_batches)):
            st = precise_bn_statistics(bb, batches(k), num_iters=k)
            self.targets[label] = [st[n][0].cpu().double() for n, _ in self.layers]

    def record(self, step: int) -> None:
        if step in DRIFT_STEPS and step <= self.c.ref_step:
            self.means[step] = [m.running_mean.detach().cpu().double().clone() for _, m in self.layers]

    def weights(self) -> dict:
        """``steps`` and, per target and layer, ``<target>_l<i>``: the weights at those steps."""
        steps = sorted(self.means)
        out = {"steps": steps}
        for label, tg in self.targets.items():
            for i, mu in enumerate(tg):
                gap = self.means[0][i] - mu
                denom = float(gap @ gap)
                out[f"{label}_l{i}"] = [float((self.means[t][i] - mu) @ gap) / denom if denom > 0 else math.nan
                                        for t in steps]
        return out


def _head_sweep_group(configs: list[HeadSweepRun], cache_root: str, version: str) -> list[dict]:
    return [head_curves(c, load_source(c.run_config().source, cache_root, version)) for c in configs]


SWEEP_COLUMNS = ["seed", "role", "path", "optimizer", "lr", "step", "split", "accuracy", "l2", "n_fit"]


def run_head_sweep(config: Config, execution: Execution | None = None, version: str | None = None) -> pd.DataFrame:
    """The head sweep (cached, resumable): a tidy table of :data:`SWEEP_COLUMNS`, its ``attrs``: ``reference_grads``
    / ``reference_fits``, ``buffers`` and ``drift`` (:func:`head_curves`' extras). Raises ``ValueError`` unless
    ``config.head == "linear"``."""
    if config.head != "linear":
        raise ValueError(f"the head sweep needs head='linear' (two feature paths cover the four modes only for a "
                         f"linear head), got head={config.head!r}")
    ex = execution or Execution()
    root = str(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    sv = version or source_version()  # stage 1's code version: the sweep's runs read the backbones with it
    runs = head_sweep_runs(config)
    ensure_sources([r.run_config().source for r in runs], ex, sv)
    out = run_sweep(runs, _head_sweep_group, namespace=SWEEP_NAMESPACE, cache_dir=root, execution=ex,
                    group_kwargs={"cache_root": root, "version": sv}, version=version, desc="head sweep")
    rows = list(zip(runs, (row for _, row in out.iterrows())))
    table = pd.DataFrame([dict(seed=r.seed, role=r.role, **rec) for r, row in rows for rec in row["records"]],
                         columns=SWEEP_COLUMNS)
    fits = [dict(seed=r.seed, role=r.role, path=p, grad_max_norm=float(row[f"reference_grad_{p}"]))
            for r, row in rows for p in PATHS]
    bcols = [c for c in out.columns if c.startswith("buffer_")]
    table.attrs.update(
        reference_grads=[f["grad_max_norm"] for f in fits], reference_fits=fits,
        buffers=[dict(seed=r.seed, role=r.role, **{c: float(row[c]) for c in bcols}) for r, row in rows],
        drift=[dict(seed=r.seed, **row["drift"]) for r, row in rows
               if "drift" in out.columns and isinstance(row["drift"], dict)])
    return table


def sweep_drift_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Tidy drift check from :func:`run_head_sweep`'s ``attrs``: ``seed, layer, step, target (engine | precise),
    weight``."""
    recs = [dict(seed=d["seed"], layer=_block(i), step=int(t), target=target, weight=float(w))
            for d in sweep.attrs.get("drift", []) for k, ws in d.items() if k not in ("seed", "steps")
            for target, i in [k.rsplit("_l", 1)] for t, w in zip(d["steps"], ws)]
    return pd.DataFrame(recs, columns=["seed", "layer", "step", "target", "weight"])


def reference_grad_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The reference fits' convergence per seed and path, ``seed, role, path, grad_max_norm``."""
    return pd.DataFrame(sweep.attrs.get("reference_fits", []), columns=["seed", "role", "path", "grad_max_norm"])


def buffer_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The reported seeds' :func:`buffer_changes`: ``seed, layer, mean_shift_sd, log_var_ratio, mean_abs, var_abs``."""
    names = dict(mean_shift_sd="mean_sd", log_var_ratio="log_var", mean_abs="mean_abs", var_abs="var_abs")
    recs = [dict(seed=b["seed"], layer=_block(i), **{k: b[f"buffer_{v}_l{i}"] for k, v in names.items()})
            for b in sweep.attrs.get("buffers", []) if b["role"] == "report"
            for i in sorted({k.rsplit("_l", 1)[1] for k in b if k.startswith("buffer_mean_sd_l")}, key=int)]
    return pd.DataFrame(recs, columns=["seed", "layer", *names])


def thread_check(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """The first ``config.thread_seeds`` seeds run end to end at ``execution.threads`` and at the other of 1/2 (its
    own cache folder: threads are not in a cache key): ``seed, mode, threads, task_b, task_a_after``."""
    if config.thread_seeds < 2:
        raise ValueError(f"thread_check needs thread_seeds >= 2, got {config.thread_seeds}")
    ex = execution or Execution()
    root = Path(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    other = 2 if ex.threads == 1 else 1
    sub = config.replace(seeds=config.seeds[:config.thread_seeds])
    frames = []
    for th, cache in ((ex.threads, root), (other, root / f"threads{other}")):
        d = transfer_sweep(sub.run_configs(), NAMESPACE, ex.replace(threads=th, cache_dir=str(cache)),
                           desc=f"thread check ({th} threads)")
        frames.append(d.assign(threads=th)[["seed", "mode", "threads", "task_b", "task_a_after"]])
    return pd.concat(frames, ignore_index=True)


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """Everything the page analyses, as the tables it saves: ``(results_table(main run), {name: table})`` for
    :data:`SIBLING_TABLES` (list columns and the sweep's ``attrs`` as tidy tables)."""
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs a freeze_modes.Config (see make_config), got {type(config).__name__}")
    df = run(config, execution)
    sweep = run_head_sweep(config, execution)
    threads = thread_check(config, execution)
    plain = sweep.copy()
    plain.attrs = {}
    abl = ablation_configs(config)
    ablation = results_table(transfer_sweep(abl, NAMESPACE, execution)) if abl else results_table(df).iloc[:0].copy()
    return results_table(df), dict(drift=drift_table(df), logit_quantiles=logit_quantile_table(df), head_sweep=plain,
                                   reference_grads=reference_grad_table(sweep), buffers=buffer_table(sweep),
                                   drift_targets=sweep_drift_table(sweep), threads=threads, ablation=ablation)
