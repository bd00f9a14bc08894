"""Chapter 7, what is trained: real handwritten digits and standard torchvision networks.

Data (:mod:`bnstudy.study.data`): scikit-learn's 1,797 bundled 8x8 digit scans, upsampled to 16x16
(bilinear) and repeated to 3 channels; task A = digits 0-4, task B = digits 5-9 (relabelled
0-4); task B's shift is a corruption (brightness, contrast, Gaussian noise, blur, inversion) at a
severity 0..5 (0: none). One fixed held-out split for every seed (60 images per digit).

Networks (:mod:`bnstudy.study.vision`): the book's small CNN, ResNet-18 and MobileNetV3-small
(``weights=None``; stems adapted to 16x16 inputs), each wrapped as
``TransferModel(backbone, head_a, head_b)`` with linear heads.

Per (network, seed), one lockstep group (:func:`run_group`): stage 1 trains backbone + head A
on task A with Adam; then for every condition (corruption, severity) the freeze modes
(:mod:`bnstudy.study.modes`) each train a new linear head on corrupted task B with SGD, all modes
consuming the same batch indices (a paired design; the same indices for every condition too),
and the statistics mismatch (:func:`bnstudy.statistics_mismatch`, KL, eval pass) of the
stage-1 backbone against the condition's task-B training images is recorded. Chapter 1's four
modes all run at the reference condition and without corruption; elsewhere ``all_eval`` is left
out (with a linear head it computes exactly what ``backbone_eval`` computes).

``Config`` -> :func:`run` -> the results table (one row per network, seed, condition and mode), which
:mod:`.findings` analyses and :mod:`.figures` draws.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ...config import Execution, _Frozen, check_choice, check_float, check_int, check_seeds, check_sequence, \
    from_profile, seeds_label
from ... import engine
from ...engine import accuracy, copy_norm_buffers, feature_groups, logits_of, make_optimizer, seeded, set_features, train_step
from ...models import make_head
from ...modes import MODE_NAMES, TransferModel, get_mode
from ....running_stats import statistics_mismatch
from ...sweep import default_cache_dir, run_sweep

NAMESPACE = "ch07_real_data"
#: Parameters this design added after rows of the release were computed, with the value those older rows were
#: computed with: rows that do not record one read as that value (bnstudy.study.report.load_rows), so a new axis
#: costs a recompute of its new cells, never a broken page (docs/chapter-code.md). Empty: none yet.
READ_DEFAULTS: dict = {}
#: Modes at every condition; all four run at the reference condition and without corruption.
SWEEP_MODES = ("train_mode", "backbone_eval", "separate_stats")

#: The networks (bnstudy.study.vision.NETWORKS, repeated here so that importing this module needs no torchvision).
NETWORKS = ("small_cnn", "resnet18", "mobilenet_v3_small")


#: Profile sizes (the only place they are set). quick: 2 seeds, 2 corruptions at severity 5, short training
#: (a pipeline check: 66 runs; 18 min of wall time measured on the shared 2-core machine at load 20). Tried:
#: stage1_steps=40, steps=30 (14 min) left MobileNetV3-small at chance in eval mode after stage 1 (0.200 held-out
#: in both seeds: its running statistics had not caught up with its weights), 60 gave 0.952. full: 10 seeds, all five corruptions at severities 1, 3, 5 (1,500 runs).
#: Settings tried before the committed ones (measured on this project's shared 2-core CPU; bnstudy.study.vision's
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

    ``seeds``: an int ``n`` (0..n-1) or a list. ``networks``: among :data:`bnstudy.study.vision.NETWORKS`.
    ``corruptions`` (:data:`bnstudy.study.data.CORRUPTIONS`) and ``severities`` (1..5): task B's shifts, all
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
        from ...data import CORRUPTIONS, MAX_SEVERITY
        from ...vision import NETWORKS
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
    from ...vision import make_backbone
    return seeded((seed, "init", "backbone", network), lambda: make_backbone(network, momentum))


def train_stage1(spec: RunSpec, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, dict, int]:
    """Backbone and head A trained on task A (``x (N, 3, S, S)`` normalised, ``y (N,)`` 0..4) with Adam.

    Returns the backbone's and head A's state dicts and ``out_features``. Batches are drawn with
    replacement by ``generator(seed, "stream", "A")``; train mode throughout.
    """
    from ...tasks import generator
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
    ``task_b``: ``(x_train, y_train, x_test, y_test)`` corrupted task B (:func:`bnstudy.study.data.corrupted_task_b`).
    Returns one row per spec: the spec's fields, ``task_a_before``, ``task_a_after``, ``task_b``
    (fractions, eval mode, held-out), ``max_param_change``, ``max_buffer_change`` (running
    statistics of the original backbone), ``max_old_logit_change`` (head A's logits on held-out A).
    """
    from ...tasks import generator
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
    # Shared backbone forwards (issue 9, as in bnstudy.study.engine.transfer): the pinned modes' features of the whole
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
    and ``wall_s`` (the group's wall time divided by its runs). A :func:`bnstudy.study.sweep.run_sweep` group function.
    """
    from ...data import corrupted_task_b, digits_tasks, normalise, pixel_statistics
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
