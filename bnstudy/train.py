"""Training and evaluation: stage 1 (source training) and stage 2 (freeze and transfer).

Both stages can run *packed*: a list of run configs that differ only in
per-replica fields (``seed``, the task-B shift) trains as one grouped network
whose replicas never exchange a number (see :mod:`bnstudy.models`). A single run
is a pack of one. Each replica draws its initialisation, templates, batch stream
and evaluation sets from its own generators (:func:`bnstudy.tasks.derive_seed`),
so within a seed every freeze mode sees the same trained backbone, head-B
initialisation and task-B batch stream (a paired design). A packed run equals
the same run alone up to float rounding (grouped and plain convolutions sum in
different orders), which long training can amplify; the sweeps therefore pack
only where it pays (CUDA; see :func:`bnstudy.experiments.common.default_pack_size`).

Configs are plain dicts; :data:`DEFAULTS` documents every key.
"""

from __future__ import annotations

import math
import numbers
import time

import torch
import torch.nn.functional as F

from . import freeze as fz
from .models import ConvBackbone, Classifier, make_head, pack_states, unpack_state, NORM_KINDS, HEAD_KINDS
from .tasks import BatchStream, make_task, eval_set, generator, derive_seed, pack_images, SAMPLERS

#: Every config key, its default, and (in the comment) its meaning and unit.
DEFAULTS: dict = dict(
    seed=0,                 # run seed: templates, initialisation, batch streams, eval sets
    n_classes=10,           # classes per task
    noise=3.0,              # per-pixel noise std (templates have std 1)
    widths=(16, 32, 64),    # backbone block widths
    norm="batch",           # backbone norm: batch | group | layer | none
    momentum=0.1,           # BatchNorm momentum (PyTorch convention: weight of the new batch)
    stage1_steps=400,       # stage-1 optimizer steps on task A (backbone + head A)
    stage1_lr=3e-3,         # Adam learning rate, stage 1
    stage1_batch_size=64,   # stage-1 batch size
    mode="train_mode",      # freeze mode for stage 2 (bnstudy.freeze.MODE_NAMES)
    head="linear",          # new head kind: linear | mlp | mlp_bn
    hidden=64,              # hidden units of mlp heads
    steps=800,              # stage-2 optimizer steps on task B (head B only)
    batch_size=64,          # stage-2 batch size
    optimizer="sgd",        # stage-2 optimizer for head B: sgd (momentum 0.9) | adam
    lr=0.05,                # stage-2 learning rate
    brightness=4.0,         # task-B additive shift (template std units)
    contrast=5.0,           # task-B multiplicative gain (1 = none)
    sampler="shuffled",     # stage-2 batch sampler: shuffled | class_sorted
    n_eval=1000,            # held-out samples per task
    epoch_steps=100,        # the loop calls model.train() every epoch_steps steps, as real loops do
)

STAGE1_KEYS = ("seed", "n_classes", "noise", "widths", "norm", "momentum",
               "stage1_steps", "stage1_lr", "stage1_batch_size", "n_eval")
#: Keys that may differ inside one pack (each replica has its own value).
REPLICA_KEYS = ("seed", "brightness", "contrast")
#: Log-spaced stage-2 steps at which running statistics are recorded.
DRIFT_STEPS = (0, 1, 2, 3, 5, 8, 12, 17, 25, 35, 50, 66, 80, 100, 150, 200, 300, 400, 600, 800)


#: Memory format of images and conv weights when the backbone's BatchNorm normalises with batch
#: statistics (stage 1; stage 2 in train_mode and separate_stats). Channels-last (NHWC) lets oneDNN
#: run convolution and train-mode BatchNorm without layout conversions: measured on this project's
#: 2-core CPU, a train-mode backbone forward at batch 64 took 0.89 ms against 1.86 ms in NCHW.
TRAIN_MEMORY_FORMAT = torch.channels_last
#: ... and when it uses running statistics throughout (stage 2 in backbone_eval and all_eval), where
#: NCHW measured faster (0.92 ms against 1.17 ms channels-last).
EVAL_MEMORY_FORMAT = torch.contiguous_format


def memory_format_for(mode: str | None) -> torch.memory_format:
    """The memory format stage 2 uses for ``mode`` (``None``: stage 1). A speed choice only."""
    return EVAL_MEMORY_FORMAT if mode in ("backbone_eval", "all_eval") else TRAIN_MEMORY_FORMAT


def _input(x: torch.Tensor, device, fmt: torch.memory_format) -> torch.Tensor:
    return x.to(device, memory_format=fmt)


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


OPTIMIZERS = ("sgd", "adam")


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """``sgd``: SGD with momentum 0.9 (no weight decay); ``adam``: Adam with PyTorch defaults.

    Both act element-wise, so packed replicas stay independent.
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer={name!r} is not allowed; choose one of {list(OPTIMIZERS)}")


def complete_config(config: dict) -> dict:
    """``config`` with defaults filled in and every value checked.

    Raises ``ValueError`` naming the key for an unknown key, an unknown mode,
    norm, head or sampler, a non-positive step count or learning rate, or a
    batch size below 2 where a train-mode BatchNorm would see the batch
    (BatchNorm cannot estimate a variance from one value per channel).
    """
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; allowed keys are {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    for key in ("noise", "momentum", "stage1_lr", "lr", "brightness", "contrast"):
        v = cfg[key]
        if key == "momentum" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise ValueError(f"{key} must be a finite number, got {v!r}")
        cfg[key] = float(v)
    for key in ("seed", "n_classes", "steps", "stage1_steps", "batch_size", "stage1_batch_size", "n_eval",
                "epoch_steps", "hidden"):
        v = cfg[key]
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            cfg[key] = int(v)
    if isinstance(cfg["widths"], (str, bytes)) or not all(
            isinstance(w, numbers.Integral) and not isinstance(w, bool) and w > 0 for w in cfg["widths"]):
        raise ValueError(f"widths must be a sequence of positive integers, got {cfg['widths']!r}")
    cfg["widths"] = tuple(int(w) for w in cfg["widths"])
    fz.get_mode(cfg["mode"])
    if not isinstance(cfg["seed"], int) or isinstance(cfg["seed"], bool) or cfg["seed"] < 0:
        raise ValueError(f"seed must be a non-negative integer, got {cfg['seed']!r}")
    for key, allowed in (("norm", NORM_KINDS), ("head", HEAD_KINDS), ("sampler", SAMPLERS), ("optimizer", OPTIMIZERS)):
        if cfg[key] not in allowed:
            raise ValueError(f"{key}={cfg[key]!r} is not allowed; choose one of {list(allowed)}")
    for key in ("steps", "stage1_steps", "batch_size", "stage1_batch_size", "n_eval", "epoch_steps", "hidden"):
        v = cfg[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    for key in ("lr", "stage1_lr"):
        if not cfg[key] > 0:
            raise ValueError(f"{key} must be > 0, got {cfg[key]!r}")
    if cfg["momentum"] is not None and not 0.0 <= cfg["momentum"] <= 1.0:
        raise ValueError(f"momentum must be in [0, 1] or None, got {cfg['momentum']!r}")
    if cfg["contrast"] <= 0:
        raise ValueError(f"contrast must be > 0 (a multiplicative gain), got {cfg['contrast']!r}")
    uses_batch_stats = cfg["norm"] == "batch" or cfg["head"] == "mlp_bn"
    if uses_batch_stats and cfg["stage1_batch_size"] < 2:
        raise ValueError(f"stage1_batch_size must be >= 2 with a train-mode BatchNorm, got {cfg['stage1_batch_size']}")
    train_bn_in_stage2 = (cfg["norm"] == "batch" and cfg["mode"] in ("train_mode", "separate_stats")) or (
        cfg["head"] == "mlp_bn" and cfg["mode"] != "all_eval")
    if train_bn_in_stage2 and cfg["batch_size"] < 2:
        raise ValueError(f"batch_size must be >= 2 when mode={cfg['mode']!r} leaves a BatchNorm in train mode, "
                         f"got {cfg['batch_size']}")
    return cfg


def _check_pack(cfgs: list[dict], keys_that_may_differ) -> dict:
    base = {k: v for k, v in cfgs[0].items() if k not in keys_that_may_differ}
    for c in cfgs[1:]:
        other = {k: v for k, v in c.items() if k not in keys_that_may_differ}
        if other != base:
            diff = sorted(k for k in base if base[k] != other.get(k))
            raise ValueError(f"configs in one pack may differ only in {list(keys_that_may_differ)}; they differ in {diff}")
    return base


def _seeded(seed_parts, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(*seed_parts))
        return build()


def _packed_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum over replicas of each replica's mean cross-entropy. logits (B, R*K), y (B, R)."""
    b, r = y.shape
    return F.cross_entropy(logits.reshape(b * r, -1), y.reshape(b * r)) * r


@torch.no_grad()
def packed_logits(forward, xs: list[torch.Tensor], device, chunk: int = 500,
                  fmt: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """Logits ``(N, R, K)`` of ``forward`` on ``R`` aligned evaluation sets ``xs[r]: (N, 3, H, W)``."""
    outs = []
    for i in range(0, xs[0].shape[0], chunk):
        x = _input(pack_images([x[i:i + chunk] for x in xs]), device, fmt)
        outs.append(forward(x).float().cpu())
    logits = torch.cat(outs)
    return logits.reshape(logits.shape[0], len(xs), -1)


def accuracy(logits: torch.Tensor, ys: list[torch.Tensor]) -> list[float]:
    """Per-replica accuracy (fraction 0..1) of ``logits (N, R, K)`` against ``ys[r]: (N,)``."""
    pred = logits.argmax(-1)
    return [int((pred[:, r] == y).sum()) / len(y) for r, y in enumerate(ys)]  # exact fraction, no float32 noise


def _sources(cfgs):
    return [make_task(c["seed"], "A", c["n_classes"], c["noise"]) for c in cfgs]


def train_source(configs: list[dict], device=None) -> list[dict]:
    """Stage 1: train backbone + head A on task A for each config, packed.

    ``configs`` must agree on every key in :data:`STAGE1_KEYS` except ``seed``.
    Returns one dict per config: ``backbone`` and ``head_a`` state dicts
    (single-replica, on CPU), ``task_a_accuracy`` (eval mode, fraction) and
    ``wall_s`` (the pack's seconds divided by its size).
    """
    t0 = time.perf_counter()
    device = pick_device(device)
    cfgs = [complete_config({k: c[k] for k in STAGE1_KEYS if k in c}) for c in configs]
    base = _check_pack(cfgs, ("seed",))
    r = len(cfgs)
    backbone = ConvBackbone(3, base["widths"], base["norm"], r, base["momentum"])
    head = make_head("linear", backbone.out_features, base["n_classes"], r)
    backbone.load_state_dict(pack_states([_seeded((c["seed"], "init", "backbone"), lambda: ConvBackbone(
        3, base["widths"], base["norm"], 1, base["momentum"])).state_dict() for c in cfgs]))
    head.load_state_dict(pack_states([_seeded((c["seed"], "init", "head_a"), lambda: make_head(
        "linear", backbone.out_features, base["n_classes"], 1)).state_dict() for c in cfgs]))
    fmt = memory_format_for(None)
    model = Classifier(backbone, head).to(device, memory_format=fmt)
    tasks = _sources(cfgs)
    streams = [BatchStream(t, base["stage1_batch_size"], generator(c["seed"], "stream", "A")) for t, c in zip(tasks, cfgs)]
    opt = torch.optim.Adam(model.parameters(), lr=base["stage1_lr"])
    model.train()
    for _ in range(base["stage1_steps"]):
        batches = [s.next() for s in streams]
        x = _input(pack_images([b[0] for b in batches]), device, fmt)
        y = torch.stack([b[1] for b in batches], 1).to(device)
        loss = _packed_ce(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    evals = [eval_set(t, base["n_eval"], c["seed"], "A") for t, c in zip(tasks, cfgs)]
    acc = accuracy(packed_logits(model, [e[0] for e in evals], device, fmt=fmt), [e[1] for e in evals])
    bb = unpack_state({k: v.cpu() for k, v in model.backbone.state_dict().items()}, r)
    hd = unpack_state({k: v.cpu() for k, v in model.head.state_dict().items()}, r)
    wall = (time.perf_counter() - t0) / r
    return [dict(backbone=b, head_a=h, task_a_accuracy=a, wall_s=wall) for b, h, a in zip(bb, hd, acc)]


def _replica_slices(state: dict, r: int) -> list[dict]:
    return unpack_state({k: v.detach().cpu() for k, v in state.items()}, r)


def _max_abs_change(before: dict, after: dict, include) -> float:
    m = 0.0
    for k in before:
        if include(k):
            d = (after[k].double() - before[k].double()).abs()
            m = max(m, float(d.max()) if d.numel() else 0.0)
    return m


def _bn_stats(backbone, r: int) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per BN layer, per replica: (running_mean, running_var) copies on CPU."""
    out = {}
    for name, m in fz.batchnorm_layers(backbone).items():
        if m.running_mean is None:
            continue
        means = torch.chunk(m.running_mean.detach().cpu().clone(), r)
        varis = torch.chunk(m.running_var.detach().cpu().clone(), r)
        out[name] = list(zip(means, varis))
    return out


@torch.no_grad()
def _population_means(backbone, streams_b, device, fmt, n_batches: int = 20) -> dict[str, list[torch.Tensor]]:
    """Task-B population mean at each BN layer (precise BN on a copy; see bnstudy.stats)."""
    from .stats import precise_bn_statistics
    batches = []
    for _ in range(n_batches):
        bs = [s.next() for s in streams_b]
        batches.append(_input(pack_images([b[0] for b in bs]), device, fmt))
    stats = precise_bn_statistics(backbone, batches)
    r = len(streams_b)
    return {n: list(torch.chunk(mean.cpu(), r)) for n, (mean, _var) in stats.items()}


def transfer(configs: list[dict], sources: list[dict], device=None) -> list[dict]:
    """Stage 2: freeze the trained backbone, train a new head on task B, measure both tasks.

    ``configs`` (one per run; they may differ in :data:`REPLICA_KEYS` and in
    ``mode``) and ``sources`` (the matching :func:`train_source` outputs). Runs
    with the same mode are packed into one network; the modes run in lockstep,
    one model each, and runs with the same seed and shift consume the *same*
    task-B batch tensors (each stream is drawn once per step). That saves the
    data generation, makes the pairing literal, and changes no number: every
    model runs its own mode's code path on the values it would have drawn alone
    (``tests/test_packing.py`` checks lockstep against separate runs with ==).

    The freeze mode (``config["mode"]``) is applied by
    :meth:`bnstudy.freeze.FreezeMode.apply`; the loop then calls ``model.train()``
    every ``epoch_steps`` steps, as an ordinary training loop does, and trains
    only head B (``optimizer``, ``lr``).

    Returns one row per config, in order: the config, then ``task_a_before``,
    ``task_a_after``, ``task_b`` (accuracies 0..1, eval mode), ``max_param_change``
    (largest absolute change of any backbone or head-A parameter),
    ``max_buffer_change`` (largest change of the original backbone's
    running_mean/running_var), ``num_batches_tracked_change``,
    ``max_old_logit_change`` and quantiles ``old_logit_change_q`` (head A's
    logits on the task-A eval set, after minus before, absolute), per-layer
    drift ``drift_mean_<layer>`` / ``drift_var_<layer>`` (max |change| of the
    running statistics), and ``drift_steps`` / ``drift_weight_<layer>``: the
    weight left on the original running_mean after t steps, by projection on
    the task-B population mean (compare with ``(1 - momentum) ** t``).
    ``wall_s`` is the call's wall time divided by the number of runs.
    Raises ``ValueError`` if the configs differ in anything else, or the
    numbers of configs and sources differ.
    """
    t0 = time.perf_counter()
    device = pick_device(device)
    cfgs = [complete_config(c) for c in configs]
    if len(sources) != len(cfgs):
        raise ValueError(f"transfer needs one source per config: {len(cfgs)} configs, {len(sources)} sources")
    base = _check_pack(cfgs, REPLICA_KEYS + ("mode",))
    data = _TaskData(cfgs)
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cfgs):
        groups.setdefault(c["mode"], []).append(i)
    runs = {mode: _ModeRun(mode, [cfgs[i] for i in idx], [sources[i] for i in idx], [data.key(cfgs[i]) for i in idx],
                           data, device) for mode, idx in groups.items()}
    streams = {k: BatchStream(data.tasks_b[k], base["batch_size"], generator(k[0], "stream", "B"), base["sampler"])
               for k in data.keys}
    for step in range(1, base["steps"] + 1):
        batches = {k: st.next() for k, st in streams.items()}
        for run in runs.values():
            run.step(step, batches)
    wall = (time.perf_counter() - t0) / len(cfgs)
    rows: list[dict | None] = [None] * len(cfgs)
    for mode, idx in groups.items():
        for i, row in zip(idx, runs[mode].finish()):
            row.update(wall_s=wall, pack_size=len(cfgs))
            rows[i] = row
    return rows


class _TaskData:
    """Tasks and evaluation sets per distinct (seed, brightness, contrast), shared by all modes."""

    def __init__(self, cfgs):
        self.keys = list(dict.fromkeys(self.key(c) for c in cfgs))
        first = {self.key(c): c for c in reversed(cfgs)}
        self.tasks_a, self.tasks_b, self.evals_a, self.evals_b = {}, {}, {}, {}
        for k in self.keys:
            c = first[k]
            self.tasks_a[k] = make_task(c["seed"], "A", c["n_classes"], c["noise"])
            self.tasks_b[k] = make_task(c["seed"], "B", c["n_classes"], c["noise"], c["brightness"], c["contrast"])
            self.evals_a[k] = eval_set(self.tasks_a[k], c["n_eval"], c["seed"], "A")
            self.evals_b[k] = eval_set(self.tasks_b[k], c["n_eval"], c["seed"], "B")

    @staticmethod
    def key(c: dict) -> tuple:
        return (c["seed"], float(c["brightness"]), float(c["contrast"]))


class _ModeRun:
    """The runs of one freeze mode inside :func:`transfer`: one packed model, its own code path."""

    def __init__(self, mode_name, cfgs, sources, keys, data: _TaskData, device):
        self.cfgs, self.sources, self.keys, self.data, self.device = cfgs, sources, keys, data, device
        base = cfgs[0]
        self.base, r = base, len(cfgs)
        self.r = r
        mode = fz.get_mode(mode_name)
        backbone = ConvBackbone(3, base["widths"], base["norm"], r, base["momentum"])
        backbone.load_state_dict(pack_states([s["backbone"] for s in sources]))
        head_a = make_head("linear", backbone.out_features, base["n_classes"], r)
        head_a.load_state_dict(pack_states([s["head_a"] for s in sources]))
        head_b = make_head(base["head"], backbone.out_features, base["n_classes"], r, base["hidden"], base["momentum"])
        head_b.load_state_dict(pack_states([_seeded((c["seed"], "init", "head_b", base["head"]), lambda: make_head(
            base["head"], backbone.out_features, base["n_classes"], 1, base["hidden"], base["momentum"])).state_dict()
            for c in cfgs]))
        self.fmt = fmt = memory_format_for(mode_name)
        self.model = model = fz.TransferModel(backbone, head_a, head_b).to(device, memory_format=fmt)

        model.eval()
        self.logits_a0 = packed_logits(model.forward_a, [data.evals_a[k][0] for k in keys], device, fmt=fmt)
        self.frozen_before = self._frozen_state()
        self.stats0 = _bn_stats(model.backbone, r)

        mode.apply(model)
        self.stat_owner = model.backbone if model.backbone_b is None else model.backbone_b
        self.track_drift = base["norm"] == "batch"
        self.pop_means = None
        if self.track_drift:
            pop_streams = [BatchStream(data.tasks_b[k], max(base["batch_size"], 2), generator(k[0], "population", "B"))
                           for k in keys]
            self.pop_means = _population_means(model.backbone, pop_streams, device, fmt)
        self.drift_record = {0: _bn_stats(self.stat_owner, r)} if self.track_drift else {}
        self.opt = make_optimizer(base["optimizer"], model.head_b.parameters(), base["lr"])

    def _frozen_state(self) -> dict:
        m = self.model
        items = list(m.backbone.state_dict().items()) + [("head_a." + k, v) for k, v in m.head_a.state_dict().items()]
        return {k: v.detach().cpu().clone() for k, v in items}

    def step(self, step: int, batches: dict) -> None:
        model, base = self.model, self.base
        if (step - 1) % base["epoch_steps"] == 0:
            model.train()  # what every training loop does at the start of an epoch
        x = _input(pack_images([batches[k][0] for k in self.keys]), self.device, self.fmt)
        y = torch.stack([batches[k][1] for k in self.keys], 1).to(self.device)
        loss = _packed_ce(model.forward_b(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.track_drift and step in DRIFT_STEPS:
            self.drift_record[step] = _bn_stats(self.stat_owner, self.r)

    def finish(self) -> list[dict]:
        model, data, keys, r, fmt, device = self.model, self.data, self.keys, self.r, self.fmt, self.device
        model.eval()
        acc_a0 = accuracy(self.logits_a0, [data.evals_a[k][1] for k in keys])
        logits_a1 = packed_logits(model.forward_a, [data.evals_a[k][0] for k in keys], device, fmt=fmt)
        acc_a1 = accuracy(logits_a1, [data.evals_a[k][1] for k in keys])
        acc_b = accuracy(packed_logits(model.forward_b, [data.evals_b[k][0] for k in keys], device, fmt=fmt),
                         [data.evals_b[k][1] for k in keys])
        before_r, after_r = _replica_slices(self.frozen_before, r), _replica_slices(self._frozen_state(), r)
        param_names = ({n for n, _ in model.backbone.named_parameters()}
                       | {"head_a." + n for n, _ in model.head_a.named_parameters()})
        stats1 = _bn_stats(model.backbone, r)
        qs = torch.linspace(0, 1, 21, dtype=torch.float64)
        rows = []
        for i, c in enumerate(self.cfgs):
            d_logit = (logits_a1[:, i].double() - self.logits_a0[:, i].double()).abs().flatten()
            row = dict(c)
            row["widths"] = "-".join(map(str, c["widths"]))
            row.update(
                task_a_before=acc_a0[i], task_a_after=acc_a1[i], task_b=acc_b[i],
                max_param_change=_max_abs_change(before_r[i], after_r[i], lambda k: k in param_names),
                max_buffer_change=_max_abs_change(before_r[i], after_r[i],
                                                  lambda k: k.endswith("running_mean") or k.endswith("running_var")),
                num_batches_tracked_change=int(_max_abs_change(before_r[i], after_r[i],
                                                               lambda k: k.endswith("num_batches_tracked"))),
                max_old_logit_change=float(d_logit.max()),
                old_logit_change_q=[float(v) for v in torch.quantile(d_logit, qs)],
                source_task_a_accuracy=self.sources[i]["task_a_accuracy"],
            )
            for layer_i, name in enumerate(self.stats0):
                m0, v0 = self.stats0[name][i]
                m1, v1 = stats1[name][i]
                row[f"drift_mean_l{layer_i}"] = float((m1 - m0).abs().max())
                row[f"drift_var_l{layer_i}"] = float((v1 - v0).abs().max())
            if self.track_drift:
                row["drift_steps"] = sorted(self.drift_record)
                for layer_i, name in enumerate(self.stats0):
                    start = self.drift_record[0][name][i][0]
                    target = self.pop_means[name][i]
                    gap = start - target
                    denom = float(gap @ gap)
                    row[f"drift_weight_l{layer_i}"] = [
                        float((self.drift_record[t][name][i][0] - target) @ gap) / denom if denom > 0 else math.nan
                        for t in row["drift_steps"]]
            rows.append(row)
        return rows
