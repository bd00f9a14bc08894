"""Chapter 7: do the findings hold on real handwritten digits and standard torchvision networks?

Data (:mod:`bnstudy.data`): scikit-learn's 1,797 bundled 8x8 digit scans, upsampled to 16x16
(bilinear) and repeated to 3 channels; task A = digits 0-4, task B = digits 5-9 (relabelled
0-4); task B's shift is a corruption (brightness, contrast, Gaussian noise, blur, inversion) at a
severity 0..5 (0: none). One fixed held-out split for every seed (60 images per digit).

Networks (:mod:`bnstudy.vision`): the book's small CNN, ResNet-18 and MobileNetV3-small
(``weights=None``; stems adapted to 16x16 inputs), each wrapped as
``TransferModel(backbone, head_a, head_b)`` with linear heads.

Per (network, seed), one lockstep group (:func:`run_group`): stage 1 trains backbone + head A
on task A with Adam; then for every condition (corruption, severity) the freeze modes
(:mod:`bnstudy.modes`) each train a new linear head on corrupted task B with SGD, all modes
consuming the same batch indices (a paired design; the same indices for every condition too),
and the statistics mismatch (:func:`bnstudy.stats.statistics_mismatch`, KL, eval pass) of the
stage-1 backbone against the condition's task-B training images is recorded. Chapter 1's four
modes all run at the reference condition and without corruption; elsewhere ``all_eval`` is left
out (with a linear head it computes exactly what ``backbone_eval`` computes).

``Config`` -> :func:`run` -> results table -> :func:`findings` (chapter 1's four findings and
chapter 3's conclusions per network, with verdicts) -> :func:`verdict_table`, and the tidy figure
tables :func:`effects_table` and :func:`condition_table`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats as sps

from ..report import p_text
from ..analysis import Interval, mean_ci
from ..config import Execution, _Frozen, check_choice, check_float, check_int, check_seeds, check_sequence, \
    from_profile, seeds_label
from .. import engine
from ..engine import accuracy, copy_norm_buffers, feature_groups, logits_of, make_optimizer, seeded, set_features, train_step
from ..models import make_head
from ..modes import MODE_NAMES, TransferModel, get_mode
from ..stats import statistics_mismatch
from ..sweep import default_cache_dir, run_sweep

NAMESPACE = "ch07_real_data"
#: Modes at every condition; all four run at the reference condition and without corruption.
SWEEP_MODES = ("train_mode", "backbone_eval", "separate_stats")
#: Tie margin (accuracy, fraction) of the equivalence tests (TOST at 5%: the 90% interval inside +-margin).
TIE_MARGIN = 0.02
#: A cost below this (accuracy, fraction) with 95% confidence counts as "safe" (chapter 3's ``min_effect``).
MIN_EFFECT = 0.01
#: The other safe/harm margins the page reports chapter 3's threshold verdict at (``c2_margin_002`` / ``_003``).
MARGIN_SWEEP = (0.02, 0.03)

#: The networks (bnstudy.vision.NETWORKS, repeated here so that importing this module needs no torchvision).
NETWORKS = ("small_cnn", "resnet18", "mobilenet_v3_small")
#: Readable names of the networks, corruptions and conditions for prose, tables and figures.
NETWORK_LABELS = {"small_cnn": "small CNN", "resnet18": "ResNet-18", "mobilenet_v3_small": "MobileNetV3-small"}
CORRUPTION_LABELS = {"none": "no corruption", "brightness": "brightness", "contrast": "contrast",
                     "gaussian_noise": "Gaussian noise", "blur": "blur", "inversion": "inversion"}


def network_label(name: str) -> str:
    """``"resnet18"`` -> ``"ResNet-18"`` (unknown names unchanged)."""
    return NETWORK_LABELS.get(name, name)


def _in_prose(name: str) -> str:
    """A network's name inside a sentence: "the small CNN", "ResNet-18"."""
    return ("the " if name == "small_cnn" else "") + network_label(name)


def condition_label(corruption: str, severity: int) -> str:
    """``("gaussian_noise", 5)`` -> ``"Gaussian noise at severity 5"``; ``("none", 0)`` -> ``"no corruption"``."""
    if corruption == "none":
        return "no corruption"
    return f"{CORRUPTION_LABELS.get(corruption, corruption)} at severity {int(severity)}"


#: Profile sizes (the only place they are set). quick: 2 seeds, 2 corruptions at severity 5, short training
#: (a pipeline check: 66 runs; 18 min of wall time measured on the shared 2-core machine at load 20). Tried:
#: stage1_steps=40, steps=30 (14 min) left MobileNetV3-small at chance in eval mode after stage 1 (0.200 held-out
#: in both seeds: its running statistics had not caught up with its weights), 60 gave 0.952. full: 10 seeds, all five corruptions at severities 1, 3, 5 (1,500 runs).
#: Settings tried before the committed ones (measured on this project's shared 2-core CPU; bnstudy.vision's
#: docstring): seconds per train-mode forward pass / train step of 32 images with a stride-1 first convolution
#: against the committed stride 2, torchvision MobileNetV3's own BatchNorm momentum (overridden by
#: ``Config.momentum``), and the quick profile's stage-1 steps that left MobileNetV3-small at chance (eval mode).
TRIED = dict(batch_images=32, resnet_stride1_s=0.71, resnet_stride2_s=0.12, mobilenet_stride1_s=0.94, mobilenet_stride2_s=0.41,
             mobilenet_default_momentum=0.01, mobilenet_chance_stage1_steps=40, mobilenet_ok_stage1_steps=60)
PROFILES = {
    "quick": dict(seeds=2, networks=NETWORKS, corruptions=("inversion", "gaussian_noise"), severities=(5,),
                  stage1_steps=60, steps=40),
    "full": dict(seeds=10, networks=NETWORKS, corruptions=("brightness", "contrast", "gaussian_noise", "blur", "inversion"),
                 severities=(1, 3, 5), stage1_steps=200, steps=100),
}


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 7's parameters (the notebook's parameters cell, one for one).

    ``seeds``: an int ``n`` (0..n-1) or a list. ``networks``: among :data:`bnstudy.vision.NETWORKS`.
    ``corruptions`` (:data:`bnstudy.data.CORRUPTIONS`) and ``severities`` (1..5): task B's shifts, all
    combinations plus no corruption. ``reference``: the corruption and severity at which chapter 1's four
    findings are judged (must be among the conditions). ``size``: input pixels (square). ``stage1_steps``,
    ``stage1_lr``: Adam on task A. ``steps``, ``lr``: SGD (momentum 0.9) on head B; ``batch_size`` both
    stages; ``epoch_steps``: ``model.train()`` every so many steps; ``momentum``: every BatchNorm's.
    Raises ``ValueError`` naming the parameter for any bad value.
    """

    profile: str = "quick"
    seeds: tuple = (0, 1)
    networks: tuple = ("small_cnn", "resnet18", "mobilenet_v3_small")
    corruptions: tuple = ("inversion", "gaussian_noise")
    severities: tuple = (5,)
    reference: tuple = ("inversion", 5)
    size: int = 16
    stage1_steps: int = 60
    stage1_lr: float = 1e-3
    steps: int = 40
    lr: float = 0.05
    batch_size: int = 32
    epoch_steps: int = 20
    momentum: float = 0.1

    def __post_init__(self):
        from ..data import CORRUPTIONS, MAX_SEVERITY
        from ..vision import NETWORKS
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("networks", check_sequence("networks", self.networks, lambda n, v: check_choice(n, v, NETWORKS), 1))
        self._set("corruptions", check_sequence("corruptions", self.corruptions,
                                                lambda n, v: check_choice(n, v, CORRUPTIONS), 1))
        sev = check_sequence("severities", self.severities, lambda n, v: check_int(n, v, 1), 1)
        if max(sev) > MAX_SEVERITY or len(set(sev)) != len(sev):
            raise ValueError(f"severities must be distinct integers in 1..{MAX_SEVERITY}, got {list(sev)}")
        self._set("severities", tuple(sorted(sev)))
        ref = tuple(self.reference) if isinstance(self.reference, (list, tuple)) else self.reference
        if not (isinstance(ref, tuple) and len(ref) == 2 and ref[0] in self.corruptions and ref[1] in self.severities):
            raise ValueError(f"reference must be a (corruption, severity) pair among the conditions "
                             f"{list(self.corruptions)} x {list(self.severities)}, got {self.reference!r}")
        self._set("reference", (ref[0], int(ref[1])))
        self._set("size", check_int("size", self.size, 8))
        self._set("stage1_steps", check_int("stage1_steps", self.stage1_steps, 1))
        self._set("stage1_lr", check_float("stage1_lr", self.stage1_lr, 0.0, low_open=True))
        self._set("steps", check_int("steps", self.steps, 1))
        self._set("lr", check_float("lr", self.lr, 0.0, low_open=True))
        self._set("batch_size", check_int("batch_size", self.batch_size, 2))
        self._set("epoch_steps", check_int("epoch_steps", self.epoch_steps, 1))
        self._set("momentum", check_float("momentum", self.momentum, 0.0, 1.0, low_open=True))

    def conditions(self) -> list[tuple[str, int]]:
        """``("none", 0)`` then every ``(corruption, severity)``."""
        return [("none", 0)] + [(c, s) for c in self.corruptions for s in self.severities]

    def modes_at(self, condition: tuple[str, int]) -> tuple[str, ...]:
        """All four modes at the reference condition and without corruption; :data:`SWEEP_MODES` elsewhere."""
        return MODE_NAMES if condition in (("none", 0), self.reference) else SWEEP_MODES

    def run_configs(self) -> list["RunSpec"]:
        """One :class:`RunSpec` per (network, seed, condition, mode): the run cache's keys and the table's rows."""
        common = {k: getattr(self, k) for k in ("size", "stage1_steps", "stage1_lr", "steps", "lr", "batch_size",
                                                "epoch_steps", "momentum")}
        return [RunSpec(network=n, seed=s, corruption=c, severity=v, mode=m, **common)
                for n in self.networks for s in self.seeds for (c, v) in self.conditions()
                for m in self.modes_at((c, v))]

    def describe(self) -> str:
        """The parameters for the page's run line."""
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, networks={', '.join(self.networks)}, "
                f"corruptions={', '.join(self.corruptions)}, severities={', '.join(map(str, self.severities))}, "
                f"reference={self.reference[0]} {self.reference[1]}, size={self.size}, "
                f"stage1_steps={self.stage1_steps}, stage1_lr={self.stage1_lr:g}, steps={self.steps}, lr={self.lr:g}, "
                f"batch_size={self.batch_size}, epoch_steps={self.epoch_steps}, momentum={self.momentum:g}")


@dataclass(frozen=True)
class RunSpec(_Frozen):
    """One run of chapter 7 (a results row and a run-cache key)."""

    network: str
    seed: int
    corruption: str
    severity: int
    mode: str
    size: int
    stage1_steps: int
    stage1_lr: float
    steps: int
    lr: float
    batch_size: int
    epoch_steps: int
    momentum: float


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``seeds=None``: the profile's)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the experiment ---------------------------------------------------------------------------------------------

def _backbone(network: str, seed: int, momentum: float):
    from ..vision import make_backbone
    return seeded((seed, "init", "backbone", network), lambda: make_backbone(network, momentum))


def train_stage1(spec: RunSpec, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, dict, int]:
    """Backbone and head A trained on task A (``x (N, 3, S, S)`` normalised, ``y (N,)`` 0..4) with Adam.

    Returns the backbone's and head A's state dicts and ``out_features``. Batches are drawn with
    replacement by ``generator(seed, "stream", "A")``; train mode throughout.
    """
    from ..tasks import generator
    net, out = _backbone(spec.network, spec.seed, spec.momentum)
    head = seeded((spec.seed, "init", "head_a", spec.network), lambda: make_head("linear", out, 5))
    model = torch.nn.Sequential(net, head)
    opt = torch.optim.Adam(model.parameters(), lr=spec.stage1_lr)
    g = generator(spec.seed, "stream", "A")
    model.train()
    for _ in range(spec.stage1_steps):
        idx = torch.randint(len(y), (spec.batch_size,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    state = lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()}
    return state(net), state(head), out


def _max_change(before: dict, after: dict, keep) -> float:
    d = [float((after[k].double() - v.double()).abs().max()) for k, v in before.items() if keep(k) and v.numel()]
    return max(d, default=0.0)


def _frozen_state(model: TransferModel) -> dict:
    items = list(model.backbone.state_dict().items()) + [("head_a." + k, v) for k, v in model.head_a.state_dict().items()]
    return {k: v.detach().clone() for k, v in items}


def run_condition(specs: list[RunSpec], source: tuple, task_a_test: tuple, task_b: tuple) -> list[dict]:
    """Stage 2 of one (network, seed, condition): every spec's mode in lockstep on the same batches.

    ``source``: :func:`train_stage1`'s output; ``task_a_test``: ``(x, y)`` clean held-out task A;
    ``task_b``: ``(x_train, y_train, x_test, y_test)`` corrupted task B (:func:`bnstudy.data.corrupted_task_b`).
    Returns one row per spec: the spec's fields, ``task_a_before``, ``task_a_after``, ``task_b``
    (fractions, eval mode, held-out), ``max_param_change``, ``max_buffer_change`` (running
    statistics of the original backbone), ``max_old_logit_change`` (head A's logits on held-out A).
    """
    from ..tasks import generator
    state_bb, state_ha, out = source
    xa, ya = task_a_test
    xbt, ybt, xbe, ybe = task_b
    s0 = specs[0]
    runs = []
    for spec in specs:
        net, _ = _backbone(spec.network, spec.seed, spec.momentum)
        net.load_state_dict(state_bb)
        head_a = make_head("linear", out, 5)
        head_a.load_state_dict(state_ha)
        head_b = seeded((spec.seed, "init", "head_b", spec.network), lambda: make_head("linear", out, 5))
        model = TransferModel(net, head_a, head_b).eval()
        logits0 = logits_of(model.forward_a, xa, "cpu")
        before = _frozen_state(model)
        get_mode(spec.mode).apply(model)
        runs.append(dict(spec=spec, model=model, logits0=logits0, before=before,
                         opt=make_optimizer("sgd", model.head_b.parameters(), spec.lr)))
    # Shared backbone forwards (issue 9, as in bnstudy.engine.transfer): the pinned modes' features of the whole
    # training set are computed once (set_features: chunks of the batch size, so rows equal the per-step
    # forward bit for bit) and the batch-statistics modes share one train-mode forward per step. Measured on the
    # idle-ish 2-core machine, 1 thread, 100 steps of batch 32, CPU s shared vs every mode its own forward:
    # ResNet-18 4 modes 9.2 vs 21.7 (2.35x), 3 modes 8.5 vs 15.6 (1.83x); MobileNetV3-small 11.6 vs 25.6 (2.21x),
    # 11.4 vs 27.1 (2.38x). Rows are == (tests/test_real_data.py).
    for r in runs:
        model = r["model"]
        r["feature_module"] = model.backbone if model.backbone_b is None else model.backbone_b
        r["feature_key"] = ("batch" if get_mode(r["spec"].mode).backbone_batch_stats else "fixed", torch.contiguous_format)
    units = [SimpleNamespace(**r) for r in runs]
    groups = feature_groups(units) if engine.SHARE_FEATURES else {}
    tables = {key: set_features(rs[0].feature_module, xbt, "cpu", key[1], s0.batch_size)
              for key, rs in groups.items() if key[0] == "fixed"}
    g = generator(s0.seed, "stream", "B")  # the same indices for every mode and condition of a seed
    for step in range(1, s0.steps + 1):
        idx = torch.randint(len(ybt), (s0.batch_size,), generator=g)
        feats = {}
        for key, rs in groups.items():
            if key in tables:
                feats[key] = tables[key][idx]
                continue
            with torch.no_grad():
                feats[key] = rs[0].feature_module(xbt[idx])
            for follower in rs[1:]:  # the leader's forward updated its running statistics; the same update
                copy_norm_buffers(rs[0].feature_module, follower.feature_module)
        for r in runs:
            f = feats.get(r["feature_key"])
            if f is None:
                train_step(r["model"], r["model"].forward_b, r["opt"], step, xbt[idx], ybt[idx], s0.epoch_steps, "cpu")
            else:
                train_step(r["model"], r["model"].head_b, r["opt"], step, f, ybt[idx], s0.epoch_steps, "cpu")
    rows = []
    for r in runs:
        model = r["model"].eval()
        logits1 = logits_of(model.forward_a, xa, "cpu")
        after = _frozen_state(model)
        params = {n for n, _ in model.backbone.named_parameters()} | {"head_a." + n for n, _ in model.head_a.named_parameters()}
        row = r["spec"].asdict()
        row.update(task_a_before=accuracy(r["logits0"], ya), task_a_after=accuracy(logits1, ya),
                   task_b=accuracy(logits_of(model.forward_b, xbe, "cpu"), ybe),
                   max_param_change=_max_change(r["before"], after, lambda k: k in params),
                   max_buffer_change=_max_change(r["before"], after, lambda k: k.endswith(("running_mean", "running_var"))),
                   max_old_logit_change=float((logits1.double() - r["logits0"].double()).abs().max()))
        rows.append(row)
    return rows


def mismatch_kl(backbone: torch.nn.Module, x: torch.Tensor, chunk: int = 256) -> float:
    """Chapter 3's mismatch: mean over BN layers of the channel-mean KL (eval pass) of ``x``'s statistics."""
    backbone.eval()
    batches = [x[i:i + chunk] for i in range(0, len(x), chunk)]
    return float(np.mean(list(statistics_mismatch(backbone, batches, "kl", "eval").values())))


def run_group(specs: list[RunSpec]) -> list[dict]:
    """Every run of one (network, seed): stage 1 once, then each condition's modes in lockstep; rows in order.

    Each row also carries ``source_task_a_accuracy`` (stage 1, held-out), ``mismatch_kl`` of its condition
    and ``wall_s`` (the group's wall time divided by its runs). A :func:`bnstudy.sweep.run_sweep` group function.
    """
    from ..data import corrupted_task_b, digits_tasks, normalise, pixel_statistics
    t0 = time.perf_counter()
    s0 = specs[0]
    if len({(s.network, s.seed) for s in specs}) != 1:
        raise ValueError("run_group needs the runs of one (network, seed)")
    tasks = digits_tasks(s0.size)
    mean, std = pixel_statistics(tasks["A"])
    xa_tr, xa_te = normalise(tasks["A"].x_train, mean, std), normalise(tasks["A"].x_test, mean, std)
    source = train_stage1(s0, xa_tr, tasks["A"].y_train)
    net, _ = _backbone(s0.network, s0.seed, s0.momentum)
    net.load_state_dict(source[0])
    head_a = make_head("linear", source[2], 5)
    head_a.load_state_dict(source[1])
    src_acc = accuracy(logits_of(torch.nn.Sequential(net, head_a).eval(), xa_te, "cpu"), tasks["A"].y_test)
    by_cond: dict = {}
    for i, s in enumerate(specs):
        by_cond.setdefault((s.corruption, s.severity), []).append(i)
    rows: list = [None] * len(specs)
    for (corr, sev), idx in by_cond.items():
        tb = corrupted_task_b(tasks, "brightness" if corr == "none" else corr, sev, s0.seed)
        mm = mismatch_kl(net, tb[0])
        for i, row in zip(idx, run_condition([specs[i] for i in idx], source, (xa_te, tasks["A"].y_test), tb)):
            row.update(source_task_a_accuracy=src_acc, mismatch_kl=mm)
            rows[i] = row
    wall = (time.perf_counter() - t0) / len(specs)
    for r in rows:
        r["wall_s"] = wall
    return rows


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Run chapter 7's experiment (cached, resumable): one row per (network, seed, condition, mode)."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs a real_data.Config (see make_config), got {type(config).__name__}")
    ex = execution or Execution()
    specs = config.run_configs()
    groups: dict = {}
    for i, s in enumerate(specs):
        groups.setdefault((s.network, s.seed), []).append(i)
    root = ex.cache_dir if ex.cache_dir is not None else default_cache_dir()
    return run_sweep(specs, run_group, namespace=NAMESPACE, cache_dir=str(root), execution=ex,
                     groups=list(groups.values()), desc="chapter 7 (network x seed)")


# --- tidy tables ----------------------------------------------------------------------------------------------------

def _pair(df: pd.DataFrame, value: str, a: str, b: str) -> pd.DataFrame:
    """Per (network, corruption, severity, seed): ``value[mode a] - value[mode b]`` as column ``diff``."""
    keys = ["network", "corruption", "severity", "seed"]
    piv = df.pivot_table(index=keys, columns="mode", values=value, aggfunc="first")
    return (piv[a] - piv[b]).dropna().rename("diff").reset_index()


def effects(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, corruption, severity, seed): chapter 3's ``cost`` (task A lost by ``train_mode`` against
    ``backbone_eval``), ``benefit`` (task B gained), ``net = benefit - cost`` and the condition's ``mismatch_kl``."""
    cost = _pair(df, "task_a_after", "backbone_eval", "train_mode").rename(columns={"diff": "cost"})
    ben = _pair(df, "task_b", "train_mode", "backbone_eval").rename(columns={"diff": "benefit"})
    keys = ["network", "corruption", "severity", "seed"]
    out = cost.merge(ben, on=keys)
    out["net"] = out["benefit"] - out["cost"]
    mm = df.groupby(keys)["mismatch_kl"].first().reset_index()
    return out.merge(mm, on=keys)


def effects_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``network, corruption, severity, effect, mean, ci_low, ci_high, n_seeds`` (effect: cost/benefit/net)."""
    e = effects(df)
    recs = []
    for key, g in e.groupby(["network", "corruption", "severity"], sort=False):
        for eff in ("cost", "benefit", "net"):
            iv = mean_ci(g[eff])
            recs.append(dict(zip(["network", "corruption", "severity"], key), effect=eff, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(recs)


def condition_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, corruption, severity): the mismatch over seeds (``mismatch_kl``: the **median**, robust to
    the few seeds whose KL explodes; ``mismatch_kl_q25``/``_q75``: its quartiles; ``mismatch_kl_mean``), the
    cost's mean and 95% interval (``cost_lo``/``cost_hi``) and the mean ``benefit``."""
    e = effects(df)
    recs = []
    for key, g in e.groupby(["network", "corruption", "severity"], sort=False):
        iv = mean_ci(g["cost"])
        kl = g["mismatch_kl"]
        recs.append(dict(zip(["network", "corruption", "severity"], key), mismatch_kl=float(kl.median()),
                         mismatch_kl_q25=float(kl.quantile(0.25)), mismatch_kl_q75=float(kl.quantile(0.75)),
                         mismatch_kl_mean=float(kl.mean()), cost=iv.mean, cost_lo=iv.low, cost_hi=iv.high,
                         benefit=float(g["benefit"].mean())))
    return pd.DataFrame(recs)


def per_seed_rho(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, seed): Spearman's rho over the conditions of that seed's mismatch and cost (``rho``;
    NaN with fewer than 3 conditions or a constant column)."""
    e = effects(df)
    recs = []
    for (net, seed), g in e.groupby(["network", "seed"], sort=False):
        ok = len(g) >= 3 and g["mismatch_kl"].nunique() > 1 and g["cost"].nunique() > 1
        rho = float(sps.spearmanr(g["mismatch_kl"], g["cost"]).statistic) if ok else math.nan
        recs.append(dict(network=net, seed=seed, rho=rho))
    return pd.DataFrame(recs)


def accuracy_table(df: pd.DataFrame, config_reference: tuple) -> pd.DataFrame:
    """Tidy, at the reference condition: ``network, mode, metric, mean, ci_low, ci_high, n_seeds``."""
    ref = df[(df.corruption == config_reference[0]) & (df.severity == config_reference[1])]
    recs = []
    for (net, mode), g in ref.groupby(["network", "mode"], sort=False):
        for metric in ("task_a_before", "task_a_after", "task_b"):
            iv = mean_ci(g[metric])
            recs.append(dict(network=net, mode=mode, metric=metric, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             n_seeds=iv.n))
    return pd.DataFrame(recs)


# --- findings ---------------------------------------------------------------------------------------------------

def tost_interval(values, confidence: float = 0.90) -> Interval:
    """The 90% Student-t interval used by the TOST equivalence test at 5% (equivalent if inside +-margin)."""
    return mean_ci(values, confidence)


@dataclass(frozen=True)
class Findings:
    """Every number and verdict chapter 7's prose cites, per network (dicts keyed by network name).

    ``networks``: their names, comma-separated. Chapter 1 (at the reference condition): ``f1_weights_unchanged``
    (every weight's change == 0); ``f2_task_a_falls`` (``train_mode``'s task A: "holds" if a one-sided t-test
    shows its mean at most 1.5x chance, "drops, not to chance" if only significantly below where it started);
    ``f3_pinned_keep_a`` (pinned modes' task A after == before) and ``f3_pinned_lower_b`` (``train_mode -
    pinned`` on task B, 95% interval above zero, both pinned modes); ``f4_separate_exact`` (old logits change
    == 0) and ``f4_separate_matches_b`` (TOST: 90% interval of ``separate_stats - train_mode`` on task B inside
    +-:data:`TIE_MARGIN`). Chapter 3 (all conditions; a condition's mismatch is its **median** over seeds):
    ``c1_mismatch_ranks_cost`` (Spearman rho of condition mismatch and cost > 0 with Holm-adjusted one-sided
    p < 0.05 over networks, and the per-seed rho's 95% interval ``rho_seed`` above 0; ``rho_cost_mean_kl``: the
    rho on seed-mean mismatches, for comparison), ``c2_threshold_separates`` (:func:`_threshold`: every safe
    condition's mismatch below every harmful one's; without a safe condition, "no safe level" when the
    lowest-mismatch condition ``lowest_condition`` is harmful), ``c3_separate_gain_without_loss`` (task A
    unchanged in every run and task B within 0.01 of ``train_mode``'s mean in every condition). Intervals are
    95% over seeds.

    Verdict words (the page states these rules): "holds"; "inconclusive" (the interval crosses zero, no
    equivalence shown); "reversed" (significant in the opposite direction); "drops, not to chance" (F2: task A
    significantly below where it started, not shown within 1.5x chance); "by construction (checked ==)" (an
    identity of the code, confirmed exactly on every run: not a finding). Over all conditions
    (``f2_all_conditions``, ``f3_all_conditions``, tests Holm-adjusted over the network's conditions,
    :func:`condition_verdicts`): "holds" at every condition, "holds in part" at some and reversed at none,
    "mixed" (holds at some, reversed at others), "reversed in part", "inconclusive" (at none either way), "not
    shown" (F2: within 1.5x chance at no condition; ``f2_n_above`` conditions are shown above it by the opposite
    one-sided test, Holm over the same conditions, and ``f2_n_undecided`` neither). ``f2_n_mean_at_chance``: conditions whose *mean* is at most 1.5x chance (a point
    estimate, not a test); ``f2_min_lo``: the lowest 95% lower bound of task A over conditions
    (``f2_lowest_bound``: over networks too); ``f3_p_holm_reference``: F3's Holm p (over conditions) at the reference; ``f3_n_tie``: inconclusive conditions where the TOST shows a tie
    within +-:data:`TIE_MARGIN`. ``most_severe``: the condition of largest median mismatch and
    ``gap_b_most_severe`` F3's gap there. ``task_b_clean_pinned`` / ``task_b_clean_train``: task B without
    corruption (``backbone_eval`` / ``train_mode``); ``task_b_ref_minus_clean_pinned``: ``backbone_eval``'s task B
    at the reference minus without corruption, paired within seed. ``cost_none``: the cost without corruption.
    ``rho_within``: mean over corruptions of Spearman's rho within a corruption (no corruption + its
    severities); ``rho_across``: rho over corruptions at the highest severity (``*_text``: the same as printed,
    "not computable" with fewer than 3 points per group). ``rho_p_text``: the Holm p (one-sided) as printed
    ("< 0.001" below 0.001). ``c2_phrase``: chapter 3's threshold test in words (never NaN);
    ``c2_margin_002``/``_003``: its verdict with safe/harm margins 0.02 and 0.03. ``inversion_monotone``: whether
    inversion's median mismatch rises with severity; ``inversion_nonmonotone_seeds``: seeds where it does not;
    ``inversion_sentence`` says both over networks. ``kl_max_over_median``: over conditions, the
    largest ratio of one seed's mismatch to the condition's median. ``example_pair``: two corruptions of about the same mismatch
    and very different cost (:func:`_example_pair`).
    """

    n_seeds: int
    chance: float
    networks: str
    reference: str
    n_conditions: int
    task_a_source: dict
    task_a_train_mode: dict
    task_a_before: dict
    gap_b_backbone_eval: dict
    gap_b_all_eval: dict
    diff_b_separate: dict
    f1_weights_unchanged: dict
    f2_task_a_falls: dict
    f3_pinned_keep_a: dict
    f3_pinned_lower_b: dict
    f4_separate_exact: dict
    f4_separate_matches_b: dict
    rho_cost: dict
    rho_p_holm: dict
    safe_max_kl: dict
    harm_min_kl: dict
    n_safe: dict
    n_harm: dict
    cost_max: dict
    sep_max_task_a_change: dict
    sep_vs_train_max_b_diff: dict
    c1_mismatch_ranks_cost: dict
    c2_threshold_separates: dict
    c3_separate_gain_without_loss: dict
    all_hold: dict
    f2_all_conditions: dict
    f2_n_chance: dict
    f2_n_drop: dict
    f3_all_conditions: dict
    f3_n_gain: dict
    f3_n_reversed: dict
    f3_n_inconclusive: dict
    most_severe: dict
    gap_b_most_severe: dict
    check_all_eval_is_backbone_eval: dict
    n_neither: dict
    c2_phrase: dict
    c2_margin_002: dict
    c2_margin_003: dict
    rho_p_text: dict
    rho_within: dict
    rho_across: dict
    rho_within_text: dict
    rho_across_text: dict
    inversion_monotone: dict
    inversion_nonmonotone_seeds: dict
    f2_n_mean_at_chance: dict
    f2_n_above: dict
    f2_n_undecided: dict
    f2_min_lo: dict
    f3_n_tie: dict
    task_b_clean_pinned: dict
    task_b_clean_train: dict
    task_b_ref_minus_clean_pinned: dict
    rho_seed: dict
    rho_cost_mean_kl: dict
    lowest_condition: dict
    cost_none: dict
    kl_max_over_median: dict
    f3_p_holm_reference: dict
    inversion_sentence: str = ""
    f2_lowest_bound: float = math.nan
    example_pair: str = ""


def spearman_greater(x, y, exact_max: int = 8) -> tuple[float, float]:
    """Spearman's rho of ``x`` and ``y`` and its one-sided p-value against rho <= 0.

    Up to ``exact_max`` points the p-value is exact (the share of all ``n!`` orderings of ``y`` whose rho is at
    least the observed one; scipy's t approximation gives p = 0 for a perfect rank correlation of 3 points,
    whose exact p is 1/6); above it, scipy's t approximation (``alternative="greater"``).
    """
    import itertools
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = float(sps.spearmanr(x, y).statistic)
    if len(x) > exact_max:
        return rho, float(sps.spearmanr(x, y, alternative="greater").pvalue)
    rx = sps.rankdata(x)
    ry = sps.rankdata(y)
    rhos = np.array([np.corrcoef(rx, ry[list(p)])[0, 1] for p in itertools.permutations(range(len(y)))])
    return rho, float(np.mean(rhos >= rho - 1e-12))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment of ``{name: p}`` (family-wise error over the names)."""
    names = sorted(pvalues, key=lambda k: pvalues[k])
    m, out, running = len(names), {}, 0.0
    for i, k in enumerate(names):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def _word(ok: bool) -> str:
    return "holds" if ok else "does not hold"


def _check(ok: bool) -> str:
    return BY_CONSTRUCTION if ok else "does not hold"

BY_CONSTRUCTION = "by construction (checked ==)"


def _paired_p(diff, alternative: str = "two-sided") -> float:
    """Student-t p-value of a paired difference (1.0 when every difference is equal, e.g. all zero)."""
    d = np.asarray(diff, float)
    if len(d) < 2 or np.all(d == d[0]):
        return 0.0 if (len(d) >= 2 and d[0] != 0 and (alternative == "two-sided" or
                                                        (alternative == "less") == (d[0] < 0))) else 1.0
    return float(sps.ttest_1samp(d, 0.0, alternative=alternative).pvalue)


def condition_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """Chapter 1's F2 and F3 judged at every condition of every network, Holm-adjusted over the network's conditions.

    Tidy: ``network, corruption, severity, mismatch_kl`` (median over seeds), ``task_a_train_mode, task_a_lo,
    task_a_hi, f2_chance_p_holm, f2_above_p_holm, f2_drop_p_holm, f2, task_b_<mode>`` (mean task-B accuracy of each mode run at the
    condition), ``gap_b, gap_b_lo, gap_b_hi, f3_p_holm, f3_tie, f3``. F2: "holds" if a one-sided t-test shows the
    mean of ``train_mode``'s task A at most 1.5x chance (Holm p < 0.05), else "drops, not to chance" if a one-sided
    paired t-test shows it below where it started (Holm p < 0.05), else "does not hold";
    ``f2_above_p_holm``: the opposite one-sided test (mean above 1.5x chance), Holm over the same conditions. F3 (two-sided paired t
    of ``train_mode - backbone_eval`` on task B): "holds" (positive, Holm p < 0.05), "reversed" (negative, Holm
    p < 0.05), else "inconclusive"; ``f3_tie``: the TOST (90% interval inside +-:data:`TIE_MARGIN`) shows a tie.
    """
    chance = 1 / 5
    keys = ["network", "corruption", "severity"]
    recs = []
    for key, g in df.groupby(keys, sort=False):
        piv = {c: g.pivot(index="seed", columns="mode", values=c) for c in ("task_a_before", "task_a_after", "task_b")}
        a_vals = piv["task_a_after"]["train_mode"]
        a = mean_ci(a_vals)
        gap_d = piv["task_b"]["train_mode"] - piv["task_b"]["backbone_eval"]
        gap = mean_ci(gap_d)
        t90 = tost_interval(gap_d)
        rec = dict(zip(keys, key), mismatch_kl=float(g.groupby("seed")["mismatch_kl"].first().median()),
                   task_a_train_mode=a.mean, task_a_lo=a.low, task_a_hi=a.high,
                   f2_chance_p=_paired_p(a_vals - 1.5 * chance, "less"),
                   f2_above_p=_paired_p(a_vals - 1.5 * chance, "greater"),
                   f2_drop_p=_paired_p(a_vals - piv["task_a_before"]["train_mode"], "less"))
        rec.update({f"task_b_{m}": float(piv["task_b"][m].mean()) for m in MODE_NAMES if m in piv["task_b"]})
        rec.update(gap_b=gap.mean, gap_b_lo=gap.low, gap_b_hi=gap.high, f3_p=_paired_p(gap_d),
                   f3_tie=bool(_above(t90.low, -TIE_MARGIN) and _below(t90.high, TIE_MARGIN)))
        recs.append(rec)
    t = pd.DataFrame(recs)
    out = []
    for net, g in t.groupby("network", sort=False):
        g = g.copy()
        idx = [str(i) for i in g.index]
        for col in ("f2_chance_p", "f2_above_p", "f2_drop_p", "f3_p"):
            adj = holm(dict(zip(idx, g[col])))
            g[f"{col}_holm"] = [adj[i] for i in idx]
        g["f2"] = ["holds" if qc < 0.05 else ("drops, not to chance" if qd < 0.05 else "does not hold")
                   for qc, qd in zip(g["f2_chance_p_holm"], g["f2_drop_p_holm"])]
        g["f3"] = [("holds" if m > 0 else "reversed") if q < 0.05 else "inconclusive"
                   for m, q in zip(g["gap_b"], g["f3_p_holm"])]
        out.append(g)
    t = pd.concat(out).drop(columns=["f2_chance_p", "f2_above_p", "f2_drop_p", "f3_p"]).reset_index(drop=True)
    first = ["network", "corruption", "severity", "mismatch_kl", "task_a_train_mode", "task_a_lo", "task_a_hi",
             "f2_chance_p_holm", "f2_above_p_holm", "f2_drop_p_holm", "f2"]
    return t[first + [c for c in t.columns if c not in first]]


def _over_conditions(words) -> str:
    """One verdict over conditions from per-condition words (see :class:`Findings`)."""
    words = list(words)
    k_hold, k_rev = words.count("holds"), words.count("reversed")
    if k_hold == len(words):
        return "holds"
    if k_hold and k_rev:
        return "mixed"
    if k_hold:
        return "holds in part"
    if k_rev:
        return "reversed in part"
    return "not shown" if "drops, not to chance" in words or "does not hold" in words else "inconclusive"


#: Tolerance of comparisons of accuracy differences with a margin: accuracies are counts over the evaluation set
#: (steps of 1/n_eval, at least 1e-4 here), so a mean of exactly 30/3000 computed as 0.009999999999999998 is *at*
#: the margin 0.01, not below it.
MARGIN_TOL = 1e-9


def _below(x, margin: float):
    """``x < margin`` at the accuracy resolution (beyond :data:`MARGIN_TOL`); works on floats and Series."""
    return x < margin - MARGIN_TOL


def _above(x, margin: float):
    """``x > margin`` at the accuracy resolution (beyond :data:`MARGIN_TOL`); works on floats and Series."""
    return x > margin + MARGIN_TOL


def _seeds_needed(row, margin: float, n_seeds: int) -> int:
    """About how many seeds would put the 95% upper bound of a condition's cost below ``margin``, at its observed
    mean and spread (normal approximation: (1.96 sd / (margin - mean))^2; sd from the Student-t half-width)."""
    half = float(row["cost_hi"] - row["cost"])
    sd = half * math.sqrt(n_seeds) / float(sps.t.ppf(0.975, n_seeds - 1))
    return int(math.ceil((1.96 * sd / (margin - float(row["cost"]))) ** 2))


def _threshold(c: pd.DataFrame, margin: float) -> tuple[str, pd.Series, pd.Series]:
    """Chapter 3's threshold test at a safe/harm ``margin``: (verdict, safe conditions' KL, harmful ones' KL).

    Without a safe condition: "no safe level (harmful already without corruption)" when the uncorrupted
    condition is harmful, "no safe level (harmful already at the lowest mismatch)" when the condition of
    lowest (median) mismatch is; "too little power (no condition shown safe)" when some undecided
    condition's mean cost is below the margin; else "no condition shown safe (every mean cost at or above the
    margin)"."""
    safe, harm = c[_below(c["cost_hi"], margin)]["mismatch_kl"], c[_above(c["cost_lo"], margin)]["mismatch_kl"]
    if not len(safe):
        none = c[c["corruption"] == "none"]
        if len(none) and _above(none["cost_lo"], margin).all():
            return "no safe level (harmful already without corruption)", safe, harm
        lowest = c.loc[c["mismatch_kl"].idxmin()]
        if _above(lowest["cost_lo"], margin):
            return "no safe level (harmful already at the lowest mismatch)", safe, harm
        undecided = c[~_above(c["cost_lo"], margin) & ~_below(c["cost_hi"], margin)]
        if _below(undecided["cost"], margin).any():
            return "too little power (no condition shown safe)", safe, harm
        return "no condition shown safe (every mean cost at or above the margin)", safe, harm
    if not len(harm):
        return "too little power (no condition shown harmful)", safe, harm
    return _word(bool(safe.max() < harm.min())), safe, harm


def _ci_text(iv: Interval) -> str:
    return f"{iv.mean:.3f} (95% interval {iv.low:.3f} to {iv.high:.3f})"


def _and(items: list[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def findings(df: pd.DataFrame, reference: tuple) -> Findings:
    """Chapter 7's findings from :func:`run`'s table; ``reference``: the config's ``(corruption, severity)``.

    Needs all four modes at the reference condition and ``train_mode``, ``backbone_eval``,
    ``separate_stats`` at every condition, and at least 2 seeds. Raises ``ValueError`` otherwise.
    """
    ref = df[(df.corruption == reference[0]) & (df.severity == reference[1])]
    if ref.empty:
        raise ValueError(f"findings: no runs at the reference condition {reference}")
    missing = set(MODE_NAMES) - set(ref["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes at the reference condition; missing {sorted(missing)}")
    if df["seed"].nunique() < 2:
        raise ValueError("findings needs at least 2 seeds")
    chance = 1 / 5
    nets = tuple(dict.fromkeys(df["network"]))
    out: dict = {f: {} for f in Findings.__dataclass_fields__ if f not in _FINDINGS_SCALARS}
    pvals = {}
    cond = condition_table(df)
    cvs = condition_verdicts(df)
    seed_rho = per_seed_rho(df)
    for n in nets:
        r, d = ref[ref.network == n], df[df.network == n]
        piv = {c: r.pivot(index="seed", columns="mode", values=c)
               for c in ("task_a_before", "task_a_after", "task_b", "max_old_logit_change")}
        a_tm = mean_ci(piv["task_a_after"]["train_mode"])
        a_before = mean_ci(piv["task_a_before"]["train_mode"])
        out["task_a_source"][n] = mean_ci(d.groupby("seed")["source_task_a_accuracy"].first())
        out["task_a_train_mode"][n], out["task_a_before"][n] = a_tm, a_before
        a_drop_p = _paired_p(piv["task_a_after"]["train_mode"] - piv["task_a_before"]["train_mode"], "less")
        a_chance_p = _paired_p(piv["task_a_after"]["train_mode"] - 1.5 * chance, "less")
        f2 = "holds" if a_chance_p < 0.05 else ("drops, not to chance" if a_drop_p < 0.05 else "does not hold")
        gaps = {p: mean_ci(piv["task_b"]["train_mode"] - piv["task_b"][p]) for p in ("backbone_eval", "all_eval")}
        out["gap_b_backbone_eval"][n], out["gap_b_all_eval"][n] = gaps["backbone_eval"], gaps["all_eval"]
        dsep = piv["task_b"]["separate_stats"] - piv["task_b"]["train_mode"]
        out["diff_b_separate"][n] = mean_ci(dsep)
        t90 = tost_interval(dsep)
        out["f1_weights_unchanged"][n] = _check(bool((d["max_param_change"] == 0).all()))
        out["f2_task_a_falls"][n] = f2
        out["f3_pinned_keep_a"][n] = _check(all((piv["task_a_after"][p] == piv["task_a_before"][p]).all()
                                                for p in ("backbone_eval", "all_eval")))
        out["f3_pinned_lower_b"][n] = ("holds" if all(g.low > 0 for g in gaps.values()) else
                                       "reversed" if any(g.high < 0 for g in gaps.values()) else "inconclusive")
        out["f4_separate_exact"][n] = _check(bool((piv["max_old_logit_change"]["separate_stats"] == 0).all()))
        sep_all = _pair(d, "task_b", "separate_stats", "train_mode")["diff"]
        out["f4_separate_matches_b"][n] = (BY_CONSTRUCTION if (sep_all == 0).all() else
                                           _word(bool(_above(t90.low, -TIE_MARGIN) and _below(t90.high, TIE_MARGIN))))
        ae = d[d["mode"].isin(["all_eval", "backbone_eval"])]
        same = [(_pair(ae, m, "all_eval", "backbone_eval")["diff"] == 0).all() for m in ("task_a_after", "task_b")]
        out["check_all_eval_is_backbone_eval"][n] = BY_CONSTRUCTION if all(same) else "does not hold"
        cv = cvs[cvs.network == n]
        out["f2_all_conditions"][n] = _over_conditions(cv["f2"])
        out["f2_n_chance"][n] = int((cv["f2"] == "holds").sum())
        out["f2_n_drop"][n] = int((cv["f2"] == "drops, not to chance").sum())
        out["f2_n_mean_at_chance"][n] = int((~_above(cv["task_a_train_mode"], 1.5 * chance)).sum())
        out["f2_n_above"][n] = int((cv["f2_above_p_holm"] < 0.05).sum())
        out["f2_n_undecided"][n] = int(((cv["f2"] != "holds") & (cv["f2_above_p_holm"] >= 0.05)).sum())
        out["f2_min_lo"][n] = float(cv["task_a_lo"].min())
        out["f3_all_conditions"][n] = _over_conditions(cv["f3"])
        out["f3_n_gain"][n] = int((cv["f3"] == "holds").sum())
        out["f3_n_reversed"][n] = int((cv["f3"] == "reversed").sum())
        out["f3_n_inconclusive"][n] = int((cv["f3"] == "inconclusive").sum())
        out["f3_n_tie"][n] = int((cv["f3_tie"] & (cv["f3"] == "inconclusive")).sum())
        kl = d.groupby(["corruption", "severity", "seed"])["mismatch_kl"].first()
        kl_med = kl.groupby(level=[0, 1]).median()
        out["kl_max_over_median"][n] = float((kl.groupby(level=[0, 1]).max() / kl_med).max())
        at_ref = cv[(cv.corruption == reference[0]) & (cv.severity == reference[1])]
        out["f3_p_holm_reference"][n] = float(at_ref["f3_p_holm"].iloc[0])
        top = cv.loc[cv["mismatch_kl"].idxmax()]  # median mismatch over seeds
        out["most_severe"][n] = condition_label(top["corruption"], top["severity"])
        ts = d[(d.corruption == top["corruption"]) & (d.severity == top["severity"])]
        out["gap_b_most_severe"][n] = mean_ci(_pair(ts, "task_b", "train_mode", "backbone_eval")["diff"])
        # task B of the pinned head without corruption, and at the reference against it (paired within seed)
        none = d[d.corruption == "none"]
        if len(none):
            pin_none = none[none["mode"] == "backbone_eval"].set_index("seed")["task_b"]
            pin_ref = r[r["mode"] == "backbone_eval"].set_index("seed")["task_b"]
            out["task_b_clean_pinned"][n] = mean_ci(pin_none)
            out["task_b_clean_train"][n] = mean_ci(none[none["mode"] == "train_mode"].set_index("seed")["task_b"])
            out["task_b_ref_minus_clean_pinned"][n] = mean_ci((pin_ref - pin_none.loc[pin_ref.index]).dropna())
        else:
            nan_iv = Interval(math.nan, math.nan, math.nan, 0)
            out["task_b_clean_pinned"][n] = out["task_b_clean_train"][n] = nan_iv
            out["task_b_ref_minus_clean_pinned"][n] = nan_iv
        # chapter 3, over every condition of this network (condition mismatch: the median over seeds)
        c = cond[cond.network == n]
        if len(c) >= 3 and c["mismatch_kl"].nunique() > 1 and c["cost"].nunique() > 1:
            rho, p = spearman_greater(c["mismatch_kl"].to_numpy(), c["cost"].to_numpy())
        else:
            rho, p = math.nan, 1.0
        out["rho_cost"][n], pvals[n] = rho, p
        sr = seed_rho[seed_rho.network == n]["rho"].dropna()
        out["rho_seed"][n] = mean_ci(sr) if len(sr) >= 2 else Interval(math.nan, math.nan, math.nan, len(sr))
        out["rho_cost_mean_kl"][n] = (float(sps.spearmanr(c["mismatch_kl_mean"], c["cost"]).statistic)
                                      if len(c) >= 3 and c["mismatch_kl_mean"].nunique() > 1 else math.nan)
        c2, safe, harm = _threshold(c, MIN_EFFECT)
        out["safe_max_kl"][n] = float(safe.max()) if len(safe) else math.nan
        out["harm_min_kl"][n] = float(harm.min()) if len(harm) else math.nan
        out["n_safe"][n], out["n_harm"][n] = len(safe), len(harm)
        out["n_neither"][n] = len(c) - len(safe) - len(harm)
        out["cost_max"][n] = float(c["cost"].max())
        out["c2_threshold_separates"][n] = c2
        low = c.loc[c["mismatch_kl"].idxmin()]
        out["lowest_condition"][n] = (f"{condition_label(low['corruption'], low['severity'])} (median mismatch "
                                      f"{low['mismatch_kl']:.3g}, cost {low['cost']:.3f}, 95% interval "
                                      f"{low['cost_lo']:.3f} to {low['cost_hi']:.3f})")
        cn = c[c.corruption == "none"]
        out["cost_none"][n] = (Interval(float(cn["cost"].iloc[0]), float(cn["cost_lo"].iloc[0]),
                                        float(cn["cost_hi"].iloc[0]), int(df["seed"].nunique()))
                               if len(cn) else Interval(math.nan, math.nan, math.nan, 0))
        if len(safe) and len(harm):
            out["c2_phrase"][n] = (f"safe conditions reach a median mismatch of {safe.max():.3g}, harmful ones start "
                                   f"at {harm.min():.3g}")
        elif c2 == "no safe level (harmful already at the lowest mismatch)":
            out["c2_phrase"][n] = (f"no condition was shown safe, and the condition of lowest mismatch, "
                                   f"{out['lowest_condition'][n]}, is already harmful")
        elif c2.startswith("no safe level"):
            ci = out["cost_none"][n]
            out["c2_phrase"][n] = (f"the data show harm, not a lack of power: drifting statistics cost task A "
                                   f"{_ci_text(ci)} already without corruption, when task B is merely other clean "
                                   f"digits, and the condition of lowest mismatch is {out['lowest_condition'][n]}")
        elif c2.startswith("too little power"):
            undecided = c[~_above(c["cost_lo"], MIN_EFFECT) & ~_below(c["cost_hi"], MIN_EFFECT)]
            below = undecided[_below(undecided["cost"], MIN_EFFECT)]
            k = len(below)
            names = _and([f"{condition_label(r['corruption'], r['severity'])} ({r['cost']:.4f}; about "
                          f"{_seeds_needed(r, MIN_EFFECT, int(df['seed'].nunique())):,} seeds)"
                          for _, r in below.iterrows()])
            out["c2_phrase"][n] = (f"no condition was shown safe; {k} undecided condition{'s' if k != 1 else ''} "
                                   f"ha{'ve' if k != 1 else 's'} a mean cost below the margin, {names}, where "
                                   f"the number of seeds in parentheses would put the upper bound below the "
                                   f"margin at the observed spread, while the condition of lowest "
                                   f"mismatch is {out['lowest_condition'][n]}")
        else:
            out["c2_phrase"][n] = "no condition was shown safe" if not len(safe) else "no condition was shown harmful"
        out["c2_margin_002"][n] = _threshold(c, MARGIN_SWEEP[0])[0]
        out["c2_margin_003"][n] = _threshold(c, MARGIN_SWEEP[1])[0]
        within = [sps.spearmanr(g["mismatch_kl"], g["cost"]).statistic
                  for corr, g in ((k, pd.concat([c[c.corruption == "none"], c[c.corruption == k]]))
                                  for k in c.corruption.unique() if k != "none") if len(g) >= 3]
        within = [r for r in within if not math.isnan(r)]
        out["rho_within"][n] = float(np.mean(within)) if within else math.nan
        top_sev = c[c.severity == c.severity.max()]
        out["rho_across"][n] = (float(sps.spearmanr(top_sev["mismatch_kl"], top_sev["cost"]).statistic)
                                if len(top_sev) >= 3 else math.nan)
        for k in ("rho_within", "rho_across"):
            v = out[k][n]
            out[f"{k}_text"][n] = "not computable (fewer than 3 points)" if math.isnan(v) else f"{v:.2f}"
        inv = c[c.corruption == "inversion"].sort_values("severity")["mismatch_kl"]
        out["inversion_monotone"][n] = ("not run" if len(inv) < 2 else
                                        "yes" if bool(np.all(np.diff(inv.to_numpy()) > 0)) else "no")
        per_seed = d[d.corruption == "inversion"].groupby(["seed", "severity"])["mismatch_kl"].first().unstack()
        out["inversion_nonmonotone_seeds"][n] = (int((np.diff(per_seed.to_numpy(), axis=1) <= 0).any(axis=1).sum())
                                                 if per_seed.shape[1] >= 2 else 0)
        sp = d[d["mode"] == "separate_stats"]
        tm = d[d["mode"] == "train_mode"].groupby(["corruption", "severity"])["task_b"].mean()
        sb = sp.groupby(["corruption", "severity"])["task_b"].mean()
        out["sep_max_task_a_change"][n] = float((sp["task_a_after"] - sp["task_a_before"]).abs().max())
        out["sep_vs_train_max_b_diff"][n] = float((sb - tm.loc[sb.index]).abs().max())
        out["c3_separate_gain_without_loss"][n] = (
            BY_CONSTRUCTION if out["sep_max_task_a_change"][n] == 0 and out["sep_vs_train_max_b_diff"][n] == 0
            else _word(out["sep_max_task_a_change"][n] == 0 and bool(_below(out["sep_vs_train_max_b_diff"][n], MIN_EFFECT))))
    adj = holm(pvals)
    for n in nets:
        out["rho_p_holm"][n] = adj[n]
        out["rho_p_text"][n] = p_text(adj[n])
        rs = out["rho_seed"][n]
        out["c1_mismatch_ranks_cost"][n] = ("not testable" if math.isnan(out["rho_cost"][n])
                                            else _word(out["rho_cost"][n] > 0 and adj[n] < 0.05
                                                       and not math.isnan(rs.low) and rs.low > 0))
        verdicts = [out[k][n] for k, _, _ in CLAIMS]
        out["all_hold"][n] = "yes" if all(v in ("holds", BY_CONSTRUCTION) for v in verdicts) else "no"
    lab = _in_prose
    # sentences over networks (glued as Markdown; no template slots left for the page)
    mono = {n: out["inversion_monotone"][n] for n in nets}
    if all(v == "not run" for v in mono.values()):
        inv_text = "inversion was not run at two or more severities"
    else:
        run_nets = [n for n in nets if mono[n] != "not run"]
        seeds_txt = _and([f"{out['inversion_nonmonotone_seeds'][n]} of {df['seed'].nunique()} seeds for "
                          f"{lab(n)}" for n in run_nets])
        no = [n for n in run_nets if mono[n] == "no"]
        if len(no) == len(run_nets):
            head = "the median mismatch of inversion does not rise monotonically with severity on any network"
        elif not no:
            head = "the median mismatch of inversion rises monotonically with severity on every network"
        else:
            head = (f"the median mismatch of inversion does not rise monotonically with severity for "
                    f"{_and([lab(n) for n in no])}")
        inv_text = f"{head}, and it fails to rise in {seeds_txt}"
    f2_lo = min(out["f2_min_lo"].values())
    ex = _example_pair(cond)
    return Findings(n_seeds=int(df["seed"].nunique()), chance=chance, networks=", ".join(nets),
                    reference=condition_label(*reference), n_conditions=int(df[["corruption", "severity"]]
                                                                            .drop_duplicates().shape[0]),
                    inversion_sentence=inv_text, f2_lowest_bound=f2_lo, example_pair=ex, **out)


def _example_pair(cond: pd.DataFrame) -> str:
    """A sentence naming two conditions of different corruptions with about the same median mismatch (within
    25%) and the largest difference in cost, over every network; "" when there is no such pair."""
    best = None
    for n, c in cond[cond.corruption != "none"].groupby("network", sort=False):
        rows = list(c.itertuples())
        for i, x in enumerate(rows):
            for y in rows[i + 1:]:
                if x.corruption == y.corruption or x.mismatch_kl <= 0 or y.mismatch_kl <= 0:
                    continue
                if max(x.mismatch_kl, y.mismatch_kl) / min(x.mismatch_kl, y.mismatch_kl) > 1.25:
                    continue
                lo, hi = (x, y) if x.cost < y.cost else (y, x)
                if best is None or hi.cost - lo.cost > best[2].cost - best[1].cost:
                    best = (n, lo, hi)
    if best is None:
        return ""
    n, lo, hi = best
    return (f"on {_in_prose(n)}, {condition_label(lo.corruption, lo.severity)} moves the statistics about as "
            f"much as {condition_label(hi.corruption, hi.severity)} (median mismatch {lo.mismatch_kl:.2f} against "
            f"{hi.mismatch_kl:.2f}) but costs task A {lo.cost:.3f} ({lo.cost_lo:.3f} to {lo.cost_hi:.3f}) against "
            f"{hi.cost:.3f} ({hi.cost_lo:.3f} to {hi.cost_hi:.3f})")


#: Findings fields that are sentences or numbers as text: glued as plain Markdown (``glue_findings(plain=...)``),
#: not bold like verdict words.
PLAIN_FIELDS = ("inversion_sentence", "example_pair", "c2_phrase", "lowest_condition", "rho_p_text",
                "rho_within_text", "rho_across_text")

#: Findings fields that are one value, not a dict per network.
_FINDINGS_SCALARS = ("n_seeds", "chance", "networks", "reference", "n_conditions", "inversion_sentence",
                     "f2_lowest_bound", "example_pair")


#: The verdict table's rows: (finding key, kind, claim as the chapter states it). Kinds: "chapter 1 finding",
#: "chapter 3 conclusion", and "check" (an identity of the code, checked with ==, not a finding).
CLAIMS = (
    ("f2_all_conditions", "chapter 1 finding", "in train_mode task A falls to about chance (each condition, "
                                               "one-sided test of at most 1.5x chance, Holm over conditions)"),
    ("f3_all_conditions", "chapter 1 finding", "pinned modes score lower on task B than train_mode (each "
                                               "condition, Holm over conditions)"),
    ("f2_task_a_falls", "chapter 1 finding", "task A falls to about chance (reference condition only)"),
    ("f3_pinned_lower_b", "chapter 1 finding", "pinned modes lower on task B (reference condition only)"),
    ("c1_mismatch_ranks_cost", "chapter 3 conclusion", "the statistics mismatch ranks the cost of drifting statistics"),
    ("c2_threshold_separates", "chapter 3 conclusion", "a mismatch threshold separates safe from harmful shifts "
                                                       "(margin 0.01)"),
    ("f1_weights_unchanged", "check", "every frozen weight stays exactly unchanged"),
    ("f3_pinned_keep_a", "check", "pinned modes keep task A exactly"),
    ("f4_separate_exact", "check", "separate_stats keeps task A's logits bit-identical"),
    ("c3_separate_gain_without_loss", "check", "separate_stats = train_mode on task B (shared forward) and = "
                                               "pinned on task A"),
    ("check_all_eval_is_backbone_eval", "check", "all_eval = backbone_eval (linear heads, no BatchNorm)"),
)
#: The number each claim is judged by (a key of Findings holding an Interval or a float per network).
CLAIM_NUMBER = {"f2_task_a_falls": "task_a_train_mode", "f3_pinned_lower_b": "gap_b_backbone_eval",
                "f2_all_conditions": "f2_counts", "f3_all_conditions": "f3_counts",
                "c1_mismatch_ranks_cost": "c1_detail"}


def verdict_table(F: Findings) -> pd.DataFrame:
    """Tidy verdict table: ``kind, claim, network, verdict, number, value, ci_low, ci_high, detail`` (kind
    "check": an identity of the code checked with ``==``, not a finding; ``detail``: counts over conditions, or
    the rank correlations behind chapter 3's first conclusion)."""
    recs = []
    for key, kind, claim in CLAIMS:
        for n in F.task_a_source:  # networks, in run order
            num = CLAIM_NUMBER.get(key)
            if num == "f2_counts":
                v = (f"shown within 1.5x chance at {F.f2_n_chance[n]}, shown above it at {F.f2_n_above[n]}, "
                     f"undecided at {F.f2_n_undecided[n]}, of {F.n_conditions}; drops, not to chance, at "
                     f"{F.f2_n_drop[n]}; lowest 95% bound {F.f2_min_lo[n]:.3f}")
            elif num == "f3_counts":
                v = (f"holds at {F.f3_n_gain[n]}, reversed at {F.f3_n_reversed[n]}, inconclusive at "
                     f"{F.f3_n_inconclusive[n]}, of {F.n_conditions}")
            elif num == "c1_detail":
                rs = F.rho_seed[n]
                v = (f"per-seed rho {rs.mean:.2f} [{rs.low:.2f}, {rs.high:.2f}]; on median mismatch "
                     f"{F.rho_cost[n]:.2f}, within a corruption {F.rho_within_text[n]}, across corruptions at the "
                     f"highest severity {F.rho_across_text[n]}")
            else:
                v = getattr(F, num)[n] if num else None
            if isinstance(v, str):
                recs.append(dict(kind=kind, claim=claim, network=n, verdict=getattr(F, key)[n], number=num,
                                 value=math.nan, ci_low=math.nan, ci_high=math.nan, detail=v))
                continue
            iv = v if isinstance(v, Interval) else None
            recs.append(dict(kind=kind, claim=claim, network=n, verdict=getattr(F, key)[n], number=num or "",
                             value=iv.mean if iv else (float(v) if v is not None else math.nan),
                             ci_low=iv.low if iv else math.nan, ci_high=iv.high if iv else math.nan, detail=""))
    return pd.DataFrame(recs)


def verdict_grid(F: Findings) -> pd.DataFrame:
    """The verdict table for the page: one row per claim, one column per network (readable names; verdict and
    number)."""
    t = verdict_table(F)

    def cell(r):
        if r["detail"]:
            return f"{r['verdict']} ({r['detail']})"
        if math.isnan(r["value"]):
            return r["verdict"]
        if math.isnan(r["ci_low"]):
            return f"{r['verdict']} ({r['value']:.3f})"
        return f"{r['verdict']} ({r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}])"
    t["cell"] = t.apply(cell, axis=1)
    g = t.pivot_table(index=["kind", "claim"], columns="network", values="cell", aggfunc="first", sort=False)
    g = g[list(F.task_a_source)].reset_index()
    return g.rename(columns={n: network_label(n) for n in F.task_a_source})


def rows_from(provenance: dict) -> dict:
    """The record of analysed rows' origin for the run line and sidecars, from
    :func:`bnstudy.report.load_rows`' provenance: ``git_commit, written, sha256`` (first 12 hex digits)."""
    return dict(git_commit=provenance.get("git_commit"), written=provenance.get("written"),
                sha256=str(provenance.get("sha256"))[:12])


def origin_sentence(df: pd.DataFrame, profile: str, provenance: dict | None = None,
                    run_wall_s: float | None = None) -> str:
    """Markdown saying where the page's rows came from and what they cost.

    ``provenance``: :func:`bnstudy.report.load_rows`' (rows analysed again), or ``None`` (rows computed by this
    page's run, which took ``run_wall_s`` seconds of wall time, or ``None`` if not timed). ``df``'s ``wall_s``
    (each (network, seed) group's wall time spread over its rows) sum to the worker time.
    """
    worker_min = float(df["wall_s"].sum()) / 60
    units = f"the {len(df):,} runs' own times sum to {worker_min:.0f} worker-minutes"
    if provenance is None:
        wall = ("was not timed" if run_wall_s is None else
                f"took {run_wall_s / 60:.1f} minutes of wall time (runs found in the run cache are read, not "
                f"recomputed)")
        return f"The rows on this page were computed by this page's own run of the experiment, which {wall}; {units}."
    when = str(provenance.get("written") or "at an unrecorded time").replace("T", " ").replace("+00:00", " UTC")
    w = provenance.get("run_wall_s")
    wall = ("That run's wall time is not recorded in its sidecar" if w is None else
            f"That run took {float(w) / 60:.1f} minutes of wall time")
    return (f"The rows on this page were not computed for it: they are those of the {profile}-profile run at git "
            f"commit {provenance.get('git_commit', 'unknown')}, whose table was written {when} (sha256 "
            f"{str(provenance.get('sha256'))[:12]}, checked against its sidecar), analysed again at this page's "
            f"commit (the run line above). {wall}; {units}.")


#: The outcome of tests/test_audit_torchvision.py's all-models test per torchvision classification model
#: (issue 15's closing run: pytest -m torchvision_all plus the same ``audit_outcome`` from a script).
AUDIT_OUTCOMES = __import__("pathlib").Path(__file__).with_name("torchvision_audit_outcomes.csv")


def audit_counts(path=AUDIT_OUTCOMES) -> dict:
    """Counts of the audit's outcomes over every torchvision classification model, read from ``path`` (CSV
    ``model, outcome``): ``models, caught, clean, failed, no_norm, not_run, run`` (ints). Raises ``ValueError``
    naming an outcome outside caught / clean / failed / no norm / not run (...)."""
    t = pd.read_csv(path)
    kind = t["outcome"].str.replace(r"^not run.*", "not run", regex=True)
    bad = set(kind) - {"caught", "clean", "failed", "no norm", "not run"}
    if bad:
        raise ValueError(f"audit_counts: unknown outcomes {sorted(bad)} in {path}")
    k = kind.value_counts()
    out = dict(models=len(t), caught=int(k.get("caught", 0)), clean=int(k.get("clean", 0)),
               failed=int(k.get("failed", 0)), no_norm=int(k.get("no norm", 0)), not_run=int(k.get("not run", 0)))
    out["run"] = out["caught"] + out["clean"] + out["failed"]
    return out


#: Readable names of torchvision models the page names (others are printed as torchvision spells them).
MODEL_LABELS = {"regnet_y_128gf": "RegNetY-128GF", "vit_h_14": "ViT-H/14"}


def severities_text(df: pd.DataFrame) -> str:
    """The corruption severities the rows ran (severity 0, no corruption, left out), as prose: "1, 3 and 5"."""
    vals = [str(int(v)) for v in sorted(set(df["severity"])) if v > 0]
    return _and(vals) if vals else "none"


def audit_not_run_sentence(path=AUDIT_OUTCOMES) -> str:
    """Markdown naming the models of the outcomes file that were not run and why (the file's own words), or
    saying that every model with a norm layer was run."""
    t = pd.read_csv(path)
    nr = t[t["outcome"].str.startswith("not run")]
    if nr.empty:
        return "Every other model was run."
    items = [f"{MODEL_LABELS.get(m, m)} ({o.removeprefix('not run').strip().strip('()')})"
             for m, o in zip(nr["model"], nr["outcome"])]
    k = len(items)
    return f"{'One model was' if k == 1 else f'{k} models were'} not run: {'; '.join(items)}."
