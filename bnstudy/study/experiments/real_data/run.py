"""Chapter 7, what is trained: scikit-learn's digit scans (:mod:`bnstudy.study.data`; task A digits 0-4, task B digits
5-9 under a corruption) on the small CNN, ResNet-18 and MobileNetV3-small (:mod:`bnstudy.study.vision`, random
initialization) with linear heads. Per (network, seed), :func:`run_group`: stage 1 on task A, then at every condition
the freeze modes in lockstep on the same task-B batches, and chapter 3's mismatch. ``Config`` -> :func:`run` -> rows.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ...config import Execution, _Frozen, check_int, check_seeds, check_sequence, from_profile, seeds_label
from ...data import CORRUPTIONS, MAX_SEVERITY
from ...design import ChapterConfig, Rule
from ... import engine
from ...engine import accuracy, copy_norm_buffers, feature_groups, logits_of, make_optimizer, seeded, set_features, train_step
from ...models import make_head
from ...modes import MODE_NAMES, TransferModel, get_mode
from ....running_stats import statistics_mismatch
from ...sweep import default_cache_dir, run_sweep

NAMESPACE = "ch07_real_data"
#: Parameters added after rows of the release were computed, with the value those rows had (issue 35).
READ_DEFAULTS: dict = {"own_momentum": False}
#: The table saved beside ``07_real_data.csv`` (:func:`run_tables`).
SIBLING_TABLES = ("own_momentum",)
#: Each network's own BatchNorm momentum as its library builds it (PyTorch's convention: the new batch's weight).
OWN_MOMENTUM = {"small_cnn": 0.1, "resnet18": 0.1, "mobilenet_v3_small": 0.01}
#: Modes at every condition; all four run at the reference condition and without corruption.
SWEEP_MODES = ("train_mode", "backbone_eval", "separate_stats")
#: bnstudy.study.vision.NETWORKS, repeated so that importing this module needs no torchvision.
NETWORKS = ("small_cnn", "resnet18", "mobilenet_v3_small")

#: Settings tried before the committed ones, on the shared 2-core CPU: seconds per train-mode pass of 32 images with a
#: stride-1 against a stride-2 first convolution, MobileNetV3's own momentum, and the quick profile's stage-1 steps
#: that left MobileNetV3-small at chance in eval mode against those that did not.
TRIED = dict(batch_images=32, resnet_stride1_s=0.71, resnet_stride2_s=0.12, mobilenet_stride1_s=0.94,
             mobilenet_stride2_s=0.41, mobilenet_default_momentum=0.01, mobilenet_chance_stage1_steps=40,
             mobilenet_ok_stage1_steps=60)
#: quick: a pipeline check (66 runs, 18 min on the shared 2-core machine at load 20); full: 1,500 runs.
PROFILES = {
    "quick": dict(seeds=2, networks=NETWORKS, corruptions=("inversion", "gaussian_noise"), severities=(5,),
                  stage1_steps=60, steps=40, own_momentum=False),
    "full": dict(seeds=10, networks=NETWORKS, corruptions=("brightness", "contrast", "gaussian_noise", "blur", "inversion"),
                 severities=(1, 3, 5), stage1_steps=200, steps=100, own_momentum=True),
}


class Config(ChapterConfig):
    """Chapter 7's parameters (the notebook's parameters cell): task B's shifts are every (corruption, severity) plus
    none; ``reference``: where chapter 1's findings are judged; ``stage1_*``: Adam on task A; ``steps``, ``lr``: SGD
    on head B; ``epoch_steps``: ``model.train()`` every so many steps; ``own_momentum``: also rerun every network at
    its own momentum (:func:`own_momentum_config`). Raises ``ValueError`` naming the parameter for any bad value."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1), networks=NETWORKS, corruptions=("inversion", "gaussian_noise"),
                      severities=(5,), reference=("inversion", 5), size=16, stage1_steps=60, stage1_lr=1e-3, steps=40,
                      lr=0.05, batch_size=32, epoch_steps=20, momentum=0.1, own_momentum=False)

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds,
                 "severities": lambda v: tuple(sorted(check_sequence("severities", v,
                                                                     lambda n, x: check_int(n, x, 1)))),
                 "reference": lambda v: (v[0], int(v[1])) if isinstance(v, (list, tuple)) and len(v) == 2
                 and isinstance(v[1], numbers.Integral) else v}
    RULES = (
        Rule("networks", f"one or more of {list(NETWORKS)}", lambda c: c.networks and set(c.networks) <= set(NETWORKS)),
        Rule("corruptions", f"one or more of {list(CORRUPTIONS)}",
             lambda c: c.corruptions and set(c.corruptions) <= set(CORRUPTIONS)),
        Rule("severities", f"one or more distinct integers in 1..{MAX_SEVERITY}",
             lambda c: c.severities and max(c.severities) <= MAX_SEVERITY),
        Rule("reference", "a (corruption, severity) pair among the conditions", lambda c: isinstance(c.reference, tuple)
             and len(c.reference) == 2 and c.reference[0] in c.corruptions and c.reference[1] in c.severities),
        Rule("size", "an integer >= 8", lambda c: c.size >= 8),
        *(Rule(n, "an integer >= 1", lambda c, n=n: getattr(c, n) >= 1)
          for n in ("stage1_steps", "steps", "epoch_steps")),
        *(Rule(n, "> 0", lambda c, n=n: getattr(c, n) > 0) for n in ("stage1_lr", "lr")),
        Rule("batch_size", "an integer >= 2", lambda c: c.batch_size >= 2),
        Rule("momentum", "in (0, 1]", lambda c: 0 < c.momentum <= 1),
    )

    def conditions(self) -> list[tuple[str, int]]:
        """``("none", 0)`` then every ``(corruption, severity)``."""
        return [("none", 0)] + [(c, s) for c in self.corruptions for s in self.severities]

    def modes_at(self, condition: tuple[str, int]) -> tuple[str, ...]:
        """All four modes at the reference condition and without corruption; :data:`SWEEP_MODES` elsewhere."""
        return MODE_NAMES if condition in (("none", 0), self.reference) else SWEEP_MODES

    def run_configs(self) -> list["RunSpec"]:
        """One :class:`RunSpec` per (network, seed, condition, mode): the run cache's keys and the table's rows."""
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(RunSpec)[5:]}
        return [RunSpec(network=n, seed=s, corruption=c, severity=v, mode=m, **common)
                for n in self.networks for s in self.seeds for (c, v) in self.conditions()
                for m in self.modes_at((c, v))]

    def describe(self) -> str:
        """The parameters for the page's run line (lists comma-separated, the reference as ``inversion 5``)."""
        def text(name, v):
            if name == "seeds":
                return seeds_label(v)
            if isinstance(v, tuple):
                v = (" " if name == "reference" else ", ").join(map(str, v))
            return f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}"
        return ", ".join(text(name, v) for name, v in self.asdict().items())


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
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


def own_momentum_networks(config: Config) -> dict:
    """``{network: momentum}`` of the networks whose own momentum is not ``config.momentum`` (``{}`` when off)."""
    return {n: OWN_MOMENTUM[n] for n in config.networks if config.own_momentum and OWN_MOMENTUM[n] != config.momentum}


def own_momentum_config(config: Config, network: str) -> Config:
    """``config`` for one network at its own momentum, all else equal: its rows pair with the main table's (the
    stage-1 weights are the same too, since a train-mode pass does not read the running statistics)."""
    return config.replace(networks=(network,), momentum=OWN_MOMENTUM[network], own_momentum=False)


# --- the experiment ---------------------------------------------------------------------------------------------

def _backbone(network: str, seed: int, momentum: float):
    from ...vision import make_backbone
    return seeded((seed, "init", "backbone", network), lambda: make_backbone(network, momentum))


def train_stage1(spec: RunSpec, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, dict, int]:
    """Backbone and head A trained on task A (``x (N, 3, S, S)`` normalised, ``y (N,)`` 0..4) with Adam, in train
    mode on batches drawn with replacement: the backbone's and head A's state dicts and ``out_features``."""
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
    """Stage 2 of one (network, seed, condition): every spec's mode in lockstep on the same batches. ``source``:
    :func:`train_stage1`'s output; ``task_a_test``: clean held-out ``(x, y)``; ``task_b``: corrupted ``(x_train,
    y_train, x_test, y_test)`` (:func:`bnstudy.study.data.corrupted_task_b`). One row per spec: its fields,
    ``task_a_before``, ``task_a_after``, ``task_b`` (held-out accuracies, eval mode), ``max_param_change``,
    ``max_buffer_change`` (the backbone's running statistics), ``max_old_logit_change`` (head A on held-out A)."""
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
        # Shared backbone forwards (issue 9, as bnstudy.study.engine.transfer; 1.8-2.4x less CPU, benchmarks/bench_engine.py):
        # the pinned modes' features of the training set once, one train-mode forward per step for the others (rows ==).
        runs.append(SimpleNamespace(spec=spec, model=model, logits0=logits0, before=before,
                                    opt=make_optimizer("sgd", model.head_b.parameters(), spec.lr),
                                    feature_module=model.backbone if model.backbone_b is None else model.backbone_b,
                                    feature_key=("batch" if get_mode(spec.mode).backbone_batch_stats else "fixed",
                                                 torch.contiguous_format)))
    groups = feature_groups(runs) if engine.SHARE_FEATURES else {}
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
            f = feats.get(r.feature_key)
            if f is None:
                train_step(r.model, r.model.forward_b, r.opt, step, xbt[idx], ybt[idx], s0.epoch_steps, "cpu")
            else:
                train_step(r.model, r.model.head_b, r.opt, step, f, ybt[idx], s0.epoch_steps, "cpu")
    rows = []
    for r in runs:
        model = r.model.eval()
        logits1 = logits_of(model.forward_a, xa, "cpu")
        after = _frozen_state(model)
        params = {n for n, _ in model.backbone.named_parameters()} | {"head_a." + n for n, _ in model.head_a.named_parameters()}
        row = r.spec.asdict()
        row.update(task_a_before=accuracy(r.logits0, ya), task_a_after=accuracy(logits1, ya),
                   task_b=accuracy(logits_of(model.forward_b, xbe, "cpu"), ybe),
                   max_param_change=_max_change(r.before, after, lambda k: k in params),
                   max_buffer_change=_max_change(r.before, after, lambda k: k.endswith(("running_mean", "running_var"))),
                   max_old_logit_change=float((logits1.double() - r.logits0.double()).abs().max()))
        rows.append(row)
    return rows


def mismatch_kl(backbone: torch.nn.Module, x: torch.Tensor, chunk: int = 256) -> float:
    """Chapter 3's mismatch: mean over BN layers of the channel-mean KL (eval pass) of ``x``'s statistics."""
    backbone.eval()
    batches = [x[i:i + chunk] for i in range(0, len(x), chunk)]
    return float(np.mean(list(statistics_mismatch(backbone, batches, "kl", "eval").values())))


def run_group(specs: list[RunSpec]) -> list[dict]:
    """Every run of one (network, seed) (a :func:`bnstudy.study.sweep.run_sweep` group): stage 1 once, then each
    condition's modes in lockstep. Rows also carry ``source_task_a_accuracy`` (stage 1, held-out), the condition's
    ``mismatch_kl`` and ``wall_s`` (the group's wall time over its runs)."""
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


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """``(run(config), {"own_momentum": rows})``: the second the networks of :func:`own_momentum_networks` at their own
    momentum (empty, with the main table's columns, when there is none)."""
    main = run(config, execution)
    own = [run(own_momentum_config(config, n), execution) for n in own_momentum_networks(config)]
    return main, dict(own_momentum=pd.concat(own, ignore_index=True) if own else main.iloc[:0].copy())


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
