"""The one training engine: device choice, seeding, stage 1, stage 2, accuracy, cached sweeps.

*Stage 1* (:func:`train_source`) trains a backbone and head A on task A. *Stage 2*
(:func:`transfer`) freezes the backbone in a freeze mode (:mod:`bnstudy.study.modes`), trains a new
head on task B and measures both tasks. Every chapter runs through these two functions and
:func:`transfer_sweep`, which caches stage 1 per distinct :class:`~bnstudy.study.config.SourceConfig`
and stage 2 per :class:`~bnstudy.study.config.RunConfig` (:mod:`bnstudy.study.sweep`).

Randomness: every run draws its initialisation, templates, batch streams and evaluation sets
from generators derived from ``(seed, purpose)`` (:func:`bnstudy.study.tasks.derive_seed`), never from
global RNG state, so within a seed every freeze mode sees the same trained backbone, head-B
initialisation and task-B batch stream (a paired design).

*Lockstep:* the runs of one seed and shift that differ only in freeze mode, head, optimizer,
learning rate or step count (:data:`LOCKSTEP_FREE`) run together, one model per run, consuming
the *same* task-B batch tensors (each batch is drawn once per step) and sharing backbone forwards. That saves the data generation, makes the pairing literal, and changes no number:
every model runs its own mode's code path on the values it would have drawn alone
(``tests/test_engine.py`` checks lockstep against separate runs with ``==``).
"""

from __future__ import annotations

import copy
import io
import math
import threading
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from .config import RunConfig, SourceConfig, Execution
from ..freeze import batchnorm_layers
from .models import ConvBackbone, Classifier, make_head
from .modes import TransferModel, get_mode
from .sweep import RunCache, atomic_write_bytes, code_version, current_run_threads, default_cache_dir, run_sweep, \
    torch_threads
from .tasks import BatchStream, SetBatches, derive_seed, eval_set, generator, make_task, task_b_of, train_set

#: Log-spaced stage-2 steps at which running statistics are recorded.
DRIFT_STEPS = (0, 1, 2, 3, 5, 8, 12, 17, 25, 35, 50, 66, 80, 100, 150, 200, 300, 400, 600, 800)

#: Memory format of images and conv weights when the backbone's BatchNorm normalises with batch
#: statistics (stage 1; stage 2 in modes with ``backbone_batch_stats``). Channels-last (NHWC) lets
#: oneDNN run convolution and train-mode BatchNorm without layout conversions: measured on this
#: project's 2-core CPU, a train-mode backbone forward at batch 64 took 0.89 ms against 1.86 ms in NCHW.
TRAIN_MEMORY_FORMAT = torch.channels_last
#: ... and when it uses running statistics throughout (``backbone_eval``, ``all_eval``), where NCHW
#: measured faster (0.92 ms against 1.17 ms channels-last).
EVAL_MEMORY_FORMAT = torch.contiguous_format

#: Evaluation chunk (samples per forward pass).
EVAL_CHUNK = 500

#: Task-B batches (of the run's batch size, from their own random stream) over which a ``std_linear`` head's fixed
#: standardization is fitted before stage 2 (:meth:`_ModeRun._fit_standardize`): 20 batches of 64 are 1,280 images.
STANDARDIZE_BATCHES = 20


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def memory_format_for(mode: str | None) -> torch.memory_format:
    """The memory format stage 2 uses for ``mode`` (``None``: stage 1). A speed choice only."""
    if mode is None or get_mode(mode).backbone_batch_stats:
        return TRAIN_MEMORY_FORMAT
    return EVAL_MEMORY_FORMAT


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """``sgd``: SGD with momentum 0.9 (no weight decay); ``adam``: Adam with PyTorch's defaults, in torch's fused
    implementation (``fused=True``); ``sgd_plain``: SGD without momentum (no weight decay).

    Why fused Adam: the default (for-loop) Adam takes its ``exp_avg_sq.sqrt()`` from torch's float32 ``sqrt``, whose
    last bits differ between CPUs even under the kernel pin (:mod:`bnstudy.study.numerics`: measured on this project's AVX-512
    EPYC against emulated AVX2 CPUs, AMD and Intel), while the fused kernel is ATen code under the pinned dispatch and
    gave the same weights on all of them. The update is the same algorithm (torch documents the two as equivalent)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "sgd_plain":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, fused=True)
    raise ValueError(f"optimizer={name!r} is not allowed; choose one of ['sgd', 'adam', 'sgd_plain']")


_SEED_LOCK = threading.Lock()


def seeded(seed_parts: tuple, build):
    """``build()`` under a torch RNG seeded with ``derive_seed(*seed_parts)``; global RNG state untouched.

    Thread-safe: torch's default generator is process-global, so runs executing in threads (joblib's
    ``threading`` backend, an in-process dask cluster) would otherwise reseed it under each other.
    """
    with _SEED_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(*seed_parts))
        return build()


@torch.no_grad()
def logits_of(forward, x: torch.Tensor, device, fmt=torch.contiguous_format, chunk: int = EVAL_CHUNK) -> torch.Tensor:
    """Logits ``(N, K)`` of ``forward`` on ``x (N, C, H, W)``, in chunks, returned on the CPU as float32."""
    outs = [forward(x[i:i + chunk].to(device, memory_format=fmt)).float().cpu() for i in range(0, x.shape[0], chunk)]
    return torch.cat(outs)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction (0..1) of rows of ``logits (N, K)`` whose argmax equals ``y (N,)``: an exact ratio of counts."""
    return int((logits.argmax(-1) == y).sum()) / len(y)


def train_step(model: torch.nn.Module, forward, optimizer: torch.optim.Optimizer, step: int, x: torch.Tensor,
               y: torch.Tensor, epoch_steps: int, device, fmt=torch.contiguous_format,
               loss_fn=F.cross_entropy) -> torch.Tensor:
    """Step ``step`` (counted from 1) of the one stage-2 training loop; returns the loss (detached).

    ``model.train()`` at the start of every epoch (steps 1, 1 + ``epoch_steps``, ...), as ordinary
    loops do; then ``loss_fn(forward(x), y)``, ``zero_grad``, ``backward`` and ``optimizer.step()``.
    """
    if (step - 1) % epoch_steps == 0:
        model.train()  # what every training loop does at the start of an epoch
    loss = loss_fn(forward(x.to(device, memory_format=fmt)), y.to(device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def build_backbone(cfg: SourceConfig) -> ConvBackbone:
    """The seed's initial backbone (drawn from ``(seed, "init", "backbone")``)."""
    return seeded((cfg.seed, "init", "backbone"), lambda: ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum))


def train_source(cfg: SourceConfig, device=None) -> dict:
    """Stage 1: train backbone + head A on task A with Adam (train mode throughout).

    Returns ``backbone`` and ``head_a`` state dicts (on CPU), ``task_a_accuracy`` (eval mode,
    fraction 0..1 on the held-out set) and ``wall_s`` (seconds).
    """
    t0 = time.perf_counter()
    if not isinstance(cfg, SourceConfig):
        raise TypeError(f"train_source needs a SourceConfig, got {type(cfg).__name__}")
    cfg = SourceConfig(**{k: getattr(cfg, k) for k in SourceConfig.__dataclass_fields__})
    device = pick_device(device)
    backbone = build_backbone(cfg)
    head = seeded((cfg.seed, "init", "head_a"), lambda: make_head("linear", backbone.out_features, cfg.n_classes))
    fmt = memory_format_for(None)
    model = Classifier(backbone, head).to(device, memory_format=fmt)
    task = make_task(cfg.seed, "A", cfg.n_classes, cfg.noise)
    stream = batch_source(task, cfg.stage1_batch_size, cfg.train_size, cfg.seed, "A")
    opt = torch.optim.Adam(model.parameters(), lr=cfg.stage1_lr, fused=True)  # fused: see make_optimizer
    model.train()
    for _ in range(cfg.stage1_steps):
        x, y = stream.next()
        loss = F.cross_entropy(model(x.to(device, memory_format=fmt)), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    xe, ye = eval_set(task, cfg.n_eval, cfg.seed, "A")
    acc = accuracy(logits_of(model, xe, device, fmt), ye)
    state = lambda m: {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}
    return dict(backbone=state(model.backbone), head_a=state(model.head), task_a_accuracy=acc,
                wall_s=time.perf_counter() - t0)


def _running_stats(backbone) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per BatchNorm layer with buffers: (running_mean, running_var) copies on CPU."""
    return {name: (m.running_mean.detach().cpu().clone(), m.running_var.detach().cpu().clone())
            for name, m in batchnorm_layers(backbone).items() if m.running_mean is not None}


def _max_abs_change(before: dict, after: dict, include) -> float:
    m = 0.0
    for k in before:
        if include(k):
            d = (after[k].double() - before[k].double()).abs()
            m = max(m, float(d.max()) if d.numel() else 0.0)
    return m


class _Stream:
    """Task A and B, their evaluation sets and the task-B batch stream of one (seed, shift)."""

    def __init__(self, c: RunConfig):
        self.task_a = make_task(c.seed, "A", c.n_classes, c.noise)
        self.task_b = task_b_of(c)  # make_task(seed, "B", ...) unless the run asks for issue 10's options
        self.eval_a = eval_set(self.task_a, c.n_eval, c.seed, "A")
        self.eval_b = eval_set(self.task_b, c.n_eval, c.seed, eval_tag("B", c.eval_split))
        self.batches = batch_source(self.task_b, c.batch_size, c.train_size, c.seed, "B", c.sampler)
        self.pop_means: dict = {}  # memory format -> task-B population means (shared by the modes)


class _ModeRun:
    """One freeze mode's model inside :func:`transfer`: its own code path on the shared batches."""

    def __init__(self, c: RunConfig, source: dict, data: _Stream, device):
        self.c, self.source, self.data, self.device = c, source, data, device
        mode = get_mode(c.mode)
        backbone = ConvBackbone(3, c.widths, c.norm, c.momentum)
        backbone.load_state_dict(source["backbone"])
        head_a = make_head("linear", backbone.out_features, c.n_classes)
        head_a.load_state_dict(source["head_a"])
        head_b = seeded((c.seed, "init", "head_b", c.head),
                        lambda: make_head(c.head, backbone.out_features, c.n_classes, c.hidden, c.momentum))
        self.fmt = fmt = memory_format_for(c.mode)
        self.model = model = TransferModel(backbone, head_a, head_b).to(device, memory_format=fmt)
        model.eval()
        self.logits_a0 = logits_of(model.forward_a, data.eval_a[0], device, fmt)
        self.frozen_before = self._frozen_state()
        self.stats0 = _running_stats(model.backbone)
        mode.apply(model)
        self.stat_owner = model.backbone if model.backbone_b is None else model.backbone_b
        self.track_drift = c.norm == "batch"
        self.pop_means = None
        if self.track_drift:
            self.pop_means = self._population_means()
        self.drift_record = {0: _running_stats(self.stat_owner)} if self.track_drift else {}
        self.opt = make_optimizer(c.optimizer, model.head_b.parameters(), c.lr)
        #: the module whose output feeds head B (the backbone, or its buffer copy in separate_stats)
        self.feature_module = model.backbone if model.backbone_b is None else model.backbone_b
        self.feature_key = ("fixed" if features_fixed(c) else "batch", self.fmt)
        if c.head == "std_linear":
            self._fit_standardize()

    @torch.no_grad()
    def _fit_standardize(self, n_batches: int = STANDARDIZE_BATCHES) -> None:
        """Fit the ``std_linear`` head's :class:`bnstudy.study.models.Standardize` on the features the head trains
        on: ``n_batches`` task-B batches from their own stream (the training stream is untouched) through a copy of
        the module that feeds head B, in its stage-2 state (batch statistics per batch for a train-mode backbone,
        whose buffers stay untouched; running statistics for a pinned one). Fixed before the head trains, as
        chapter 1's standardized heads (``freeze_modes.run._feature_standardizer``)."""
        c = self.c
        work = copy.deepcopy(self.feature_module)
        stream = BatchStream(self.data.task_b, c.batch_size, generator(c.seed, "standardize", "B"))
        f = torch.cat([work(stream.next()[0].to(self.device, memory_format=self.fmt)) for _ in range(n_batches)])
        self.model.head_b.norm.fit(f)

    @torch.no_grad()
    def _population_means(self, n_batches: int = 20) -> dict[str, torch.Tensor]:
        """Task-B population mean at each BN layer (precise BN on a copy; see :mod:`bnstudy.running_stats`).

        The same for every mode of a lockstep group (same source backbone, same batches; precise BN
        ignores train/eval flags and pins), so computed once per memory format (issue 9: saves
        20 train-mode forwards per extra mode).
        """
        if self.fmt not in self.data.pop_means:
            self.data.pop_means[self.fmt] = self._compute_population_means(n_batches)
        return self.data.pop_means[self.fmt]

    @torch.no_grad()
    def _compute_population_means(self, n_batches: int) -> dict[str, torch.Tensor]:
        from ..running_stats import precise_bn_statistics
        c = self.c
        stream = BatchStream(self.data.task_b, max(c.batch_size, 2), generator(c.seed, "population", "B"))
        batches = [stream.next()[0].to(self.device, memory_format=self.fmt) for _ in range(n_batches)]
        return {n: mean.cpu() for n, (mean, _var) in precise_bn_statistics(self.model.backbone, batches).items()}

    def _frozen_state(self) -> dict:
        m = self.model
        items = list(m.backbone.state_dict().items()) + [("head_a." + k, v) for k, v in m.head_a.state_dict().items()]
        return {k: v.detach().cpu().clone() for k, v in items}

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor, features: torch.Tensor | None = None) -> None:
        if features is None:
            train_step(self.model, self.model.forward_b, self.opt, step, x, y, self.c.epoch_steps, self.device, self.fmt)
        else:  # the backbone's output for x (fixed features, see transfer): only the head runs
            train_step(self.model, self.model.head_b, self.opt, step, features, y, self.c.epoch_steps, self.device)
        if self.track_drift and step in DRIFT_STEPS:
            self.drift_record[step] = _running_stats(self.stat_owner)

    def finish(self) -> dict:
        model, data, c, fmt, device = self.model, self.data, self.c, self.fmt, self.device
        model.eval()
        logits_a1 = logits_of(model.forward_a, data.eval_a[0], device, fmt)
        before, after = self.frozen_before, self._frozen_state()
        param_names = ({n for n, _ in model.backbone.named_parameters()}
                       | {"head_a." + n for n, _ in model.head_a.named_parameters()})
        stats1 = _running_stats(model.backbone)
        d_logit = (logits_a1.double() - self.logits_a0.double()).abs().flatten()
        row = c.asdict()
        row["widths"] = "-".join(map(str, c.widths))
        row.update(
            task_a_before=accuracy(self.logits_a0, data.eval_a[1]),
            task_a_after=accuracy(logits_a1, data.eval_a[1]),
            task_b=accuracy(logits_of(model.forward_b, data.eval_b[0], device, fmt), data.eval_b[1]),
            max_param_change=_max_abs_change(before, after, lambda k: k in param_names),
            max_buffer_change=_max_abs_change(before, after,
                                              lambda k: k.endswith("running_mean") or k.endswith("running_var")),
            num_batches_tracked_change=int(_max_abs_change(before, after, lambda k: k.endswith("num_batches_tracked"))),
            max_old_logit_change=float(d_logit.max()),
            old_logit_change_q=[float(v) for v in torch.quantile(d_logit, torch.linspace(0, 1, 21, dtype=torch.float64))],
            source_task_a_accuracy=self.source["task_a_accuracy"],
        )
        for i, name in enumerate(self.stats0):
            (m0, v0), (m1, v1) = self.stats0[name], stats1[name]
            row[f"drift_mean_l{i}"] = float((m1 - m0).abs().max())
            row[f"drift_var_l{i}"] = float((v1 - v0).abs().max())
        if self.track_drift:
            row["drift_steps"] = sorted(self.drift_record)
            for i, name in enumerate(self.stats0):
                target = self.pop_means[name]
                gap = self.drift_record[0][name][0] - target
                denom = float(gap @ gap)
                row[f"drift_weight_l{i}"] = [float((self.drift_record[t][name][0] - target) @ gap) / denom
                                             if denom > 0 else math.nan for t in row["drift_steps"]]
        return row


#: RunConfig fields that shape only head B's training, never the backbone's input stream: runs of one seed and
#: shift that differ only in these run in one lockstep group (:func:`transfer`). ``steps`` is here because a
#: shorter run consumes a prefix of the same stream (the ``model.train()`` calls fall on the same steps).
#: Measured (issue 9, idle 2-core machine, 1 thread, CPU seconds): chapter 4's 5 heads x 3 optimizers x 4 modes
#: at 100 steps took 23.8 s as 15 mode-only groups and 14.7 s as one group (1.62x), rows ``==``.
LOCKSTEP_FREE = ("mode", "head", "hidden", "optimizer", "lr", "steps")


def _lockstep_key(c: RunConfig) -> str:
    return repr({k: v for k, v in c.asdict().items() if k not in LOCKSTEP_FREE})


def transfer(configs: list[RunConfig], source: dict, device=None) -> list[dict]:
    """Stage 2 for runs of one seed and shift in lockstep (they may differ only in :data:`LOCKSTEP_FREE`).

    ``source`` is the :func:`train_source` output of their common :attr:`RunConfig.source`.
    The freeze mode is applied by :meth:`bnstudy.study.modes.FreezeMode.apply`; the loop then calls
    ``model.train()`` every ``epoch_steps`` steps and trains only head B. Runs that differ in
    freeze mode, head, optimizer, learning rate or number of steps consume the same task-B
    batches (a run of fewer steps stops early, on a prefix of the stream) and share backbone
    forwards (:func:`feature_groups`).

    Returns one row per config, in order: the config's fields, then ``task_a_before``,
    ``task_a_after``, ``task_b`` (accuracies 0..1, eval mode), ``max_param_change`` (largest
    absolute change of any backbone or head-A parameter), ``max_buffer_change`` (of the
    original backbone's running_mean/running_var), ``num_batches_tracked_change``,
    ``max_old_logit_change`` and ``old_logit_change_q`` (21 quantiles of head A's absolute
    logit change on the task-A held-out set), per-layer drift ``drift_mean_l<i>`` /
    ``drift_var_l<i>`` (max absolute change of the running statistics), and with BatchNorm
    ``drift_steps`` / ``drift_weight_l<i>``: the weight left on the original running_mean at
    :data:`DRIFT_STEPS`, by projection on the task-B population mean (compare with
    ``(1 - momentum) ** t``). ``wall_s`` is the call's wall time divided by the number of runs.
    Raises ``ValueError`` if the configs differ in anything outside :data:`LOCKSTEP_FREE` or
    repeat a config.
    """
    t0 = time.perf_counter()
    if not configs:
        raise ValueError("transfer needs at least one config")
    base = {k: v for k, v in configs[0].asdict().items() if k not in LOCKSTEP_FREE}
    for c in configs[1:]:
        other = {k: v for k, v in c.asdict().items() if k not in LOCKSTEP_FREE}
        if other != base:
            raise ValueError(f"configs run in lockstep may differ only in {list(LOCKSTEP_FREE)}; they differ in "
                             f"{sorted(k for k in base if base[k] != other[k])}")
    if len(set(map(repr, configs))) != len(configs):
        raise ValueError(f"configs run in lockstep must be distinct, got a repeated config among "
                         f"{[(c.mode, c.head, c.optimizer, c.lr, c.steps) for c in configs]}")
    device = pick_device(device)
    data = _Stream(configs[0])
    runs = [_ModeRun(c, source, data, device) for c in configs]
    finite = isinstance(data.batches, SetBatches)
    # Fixed features of a finite set are computed once per (kind, format) for the whole set.
    tables = {}
    if SHARE_FEATURES and finite:
        tables = {key: set_features(rs[0].feature_module, data.batches.x, device, key[1], configs[0].batch_size)
                  for key, rs in feature_groups(runs).items() if key[0] == "fixed"}
    for step in range(1, max(c.steps for c in configs) + 1):
        active = [run for run in runs if run.c.steps >= step]
        # Runs that would compute the same backbone output share one forward per step (issue 9, see
        # feature_groups). Regrouped every step: a run that has finished leaves its group, and the next
        # active run, whose buffers were kept equal to the leader's, leads.
        groups = feature_groups(active) if SHARE_FEATURES else {}
        if finite:
            idx = data.batches.next_indices()
            x, y = data.batches.x[idx], data.batches.y[idx]
        else:
            x, y = data.batches.next()
        feats = {}
        for key, rs in groups.items():
            if key in tables:
                feats[key] = tables[key][idx]
                continue
            with torch.no_grad():
                feats[key] = rs[0].feature_module(x.to(device, memory_format=key[1]))
            for follower in rs[1:]:  # batch statistics: the leader's forward updated its buffers; same update
                copy_norm_buffers(rs[0].feature_module, follower.feature_module)
        for run in active:
            run.step(step, x, y, feats.get(run.feature_key))
    wall = (time.perf_counter() - t0) / len(configs)
    rows = [run.finish() for run in runs]
    for r in rows:
        r["wall_s"] = wall
    return rows


# --- cached sweeps -------------------------------------------------------------------------------------------------

def source_version() -> str:
    """The code version of the stage-1 cache (namespace ``source``, shared by every chapter): the code
    :func:`train_source` reaches (:func:`bnstudy.study.sweep.code_version`), so no chapter's analysis is in its key."""
    return code_version(_stage1_group, SourceConfig)


def _source_path(cache_root, cfg: SourceConfig, version: str) -> Path:
    return RunCache(cache_root, "source", version).path(cfg.asdict()).with_suffix(".pt")


def _stage1_group(configs: list[SourceConfig], cache_root: str, version: str) -> list[dict]:
    rows = []
    for c in configs:
        out = train_source(c)
        buf = io.BytesIO()
        torch.save({k: out[k] for k in ("backbone", "head_a", "task_a_accuracy")}, buf)
        atomic_write_bytes(_source_path(cache_root, c, version), buf.getvalue())
        rows.append(dict(seed=c.seed, source_task_a_accuracy=out["task_a_accuracy"], stage1_wall_s=out["wall_s"]))
    return rows


def load_source(cfg: SourceConfig, cache_dir=None, version: str | None = None) -> dict:
    """The cached stage-1 result for ``cfg`` (state dicts and accuracy).

    A source whose weights file is missing from the cache (a cache filled from a release's recorded rows, which
    ship no weights, or a file removed by hand) is trained here and stored, as :func:`ensure_sources` would:
    training is deterministic per config, so the result is the one the cache lost.
    """
    root = cache_dir if cache_dir is not None else default_cache_dir()
    version = version or source_version()
    path = _source_path(root, cfg, version)
    if not path.exists():
        # Inside a sweep's run the thread count is the sweep's already; elsewhere the default runs use.
        with torch_threads(current_run_threads() or Execution().threads):
            _stage1_group([cfg], str(root), version)
    return torch.load(path, map_location="cpu", weights_only=True)


def ensure_sources(sources: list[SourceConfig], execution: Execution | None = None,
                   version: str | None = None) -> pd.DataFrame:
    """Train (or find in the run cache) the stage-1 result of every distinct ``SourceConfig``.

    The results are stored under the cache's ``source`` namespace, shared by every chapter, and
    read back with :func:`load_source`. Returns one row per distinct source (``seed``,
    ``source_task_a_accuracy``, ``stage1_wall_s``), in first-seen order.
    """
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    version = version or source_version()
    sources = list(dict.fromkeys(sources))
    return run_sweep(sources, _stage1_group, namespace="source", cache_dir=root, execution=ex,
                     group_kwargs={"cache_root": root, "version": version}, version=version,
                     desc="stage 1 (source)")


def _stage2_group(configs: list[RunConfig], cache_root: str, version: str) -> list[dict]:
    return transfer(configs, load_source(configs[0].source, cache_root, version))


def lockstep_groups(configs: list[RunConfig]) -> list[list[int]]:
    """Indices of ``configs`` grouped by everything but :data:`LOCKSTEP_FREE` (first-seen order)."""
    groups: dict = {}
    for i, c in enumerate(configs):
        groups.setdefault(_lockstep_key(c), []).append(i)
    return list(groups.values())


#: Split lockstep groups when a sweep has fewer than this many groups per worker and they do not divide evenly
#: among the workers (:func:`split_groups`).
SPLIT_BELOW_PER_WORKER = 4


def sweep_workers(execution: Execution | None = None) -> int:
    """The worker processes :func:`bnstudy.study.sweep.run_sweep` uses for ``execution`` (1 for the sequential backend)."""
    import os
    ex = execution or Execution()
    if ex.backend == "sequential":
        return 1
    if ex.n_jobs is not None:
        return ex.n_jobs
    return 1 if torch.cuda.is_available() else (os.cpu_count() or 1)


def split_groups(configs: list[RunConfig], groups: list[list[int]], workers: int) -> list[list[int]]:
    """``groups`` (lockstep groups, indices into ``configs``) split so that ``workers`` processes all have work.

    Unchanged when there is one worker, when the groups divide evenly among the workers, or when there are at
    least :data:`SPLIT_BELOW_PER_WORKER` per worker (the last round's idle share is then small). Otherwise
    every group is split into ``workers`` sub-groups: its runs are bundled by everything but the freeze mode
    (so the modes of a head/optimizer/learning rate keep sharing backbone forwards) and the bundles dealt,
    largest step count first, to the sub-group with the fewest steps so far. A sub-group of a lockstep group
    is itself one (same seed, shift and stream), and a lockstep run's row does not depend on its companions
    (``tests/test_engine.py``), so rows are ``==``; only the stream draws and shared forwards are repeated
    per sub-group. Chapter 4's learning-rate search (3 tuning seeds, 2 workers): 3 groups become 6, so the
    makespan falls from 2 group-times to 1.5 (1.33x), less what splitting costs. Measured 2026-11-30 (1 thread, CPU
    seconds, load ~14, +-15%): chapter 4's 5 heads x 3 optimizers x 4 modes, 100 steps, as one group 17.1 s, as the
    two sub-groups this makes 7.8 + 7.0 = 14.9 s, i.e. no cost measurable above the noise.
    """
    if workers <= 1 or len(groups) % workers == 0 or len(groups) >= SPLIT_BELOW_PER_WORKER * workers:
        return groups
    out = []
    for g in groups:
        bundles: dict = {}
        for i in g:
            c = configs[i]
            bundles.setdefault(tuple(getattr(c, k) for k in LOCKSTEP_FREE if k != "mode"), []).append(i)
        if len(bundles) < workers:
            bundles = {i: [i] for i in g}
        parts: list[list[int]] = [[] for _ in range(min(workers, len(bundles)))]
        load = [0] * len(parts)
        for b in sorted(bundles.values(), key=lambda b: -sum(configs[i].steps for i in b)):
            j = load.index(min(load))
            parts[j].extend(b)
            load[j] += sum(configs[i].steps for i in b)
        out.extend(sorted(p) for p in parts)
    return out


def transfer_sweep(configs: list[RunConfig], namespace: str, execution: Execution | None = None,
                   version: str | None = None, desc: str | None = None) -> pd.DataFrame:
    """Stage 1 (cached per distinct source) then stage 2 for every config; one row per config, in order.

    Runs in parallel and resumes from the run cache (:func:`bnstudy.study.sweep.run_sweep`); the runs
    of one seed and shift run in lockstep (:func:`transfer`), split into sub-groups where workers would
    otherwise idle (:func:`split_groups`). ``version`` fixes the code version of every cache key, stage 1's
    and stage 2's (default: each keyed on the code its runs reach, :func:`source_version` and
    :func:`bnstudy.study.sweep.namespace_version`).
    """
    if not configs:
        raise ValueError("transfer_sweep: configs is empty")
    for c in configs:
        if not isinstance(c, RunConfig):
            raise TypeError(f"transfer_sweep needs RunConfig objects, got {type(c).__name__}")
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    sv = source_version() if version is None else version
    ensure_sources([c.source for c in configs], ex, sv)
    kw = dict(cache_dir=root, execution=ex, group_kwargs={"cache_root": root, "version": sv}, version=version)
    groups = split_groups(configs, lockstep_groups(configs), sweep_workers(ex))
    return run_sweep(configs, _stage2_group, namespace=namespace, groups=groups,
                     desc=desc or f"stage 2 ({namespace})", **kw)


# --- chapter 4 (issue 12): a validation set for choosing settings ----------------------------------------------------

def eval_tag(task: str, split: str = "test") -> str:
    """The generator tag of ``task``'s held-out set for ``split`` (:data:`bnstudy.study.config.EVAL_SPLITS`).

    ``test`` is the task name itself (the set every chapter reports, unchanged); ``validation`` is
    ``"<task>/validation"``, an independent draw of the same size and class balance, used to choose
    settings (chapter 4's learning rates) without touching the test set. Raises ``ValueError`` for
    another ``split``.
    """
    from .config import EVAL_SPLITS
    if split not in EVAL_SPLITS:
        raise ValueError(f"eval_split={split!r} is not allowed; choose one of {list(EVAL_SPLITS)}")
    return task if split == "test" else f"{task}/validation"

# --- chapter 5 (issue 13): whole-backbone fine-tuning under a norm strategy ---------------------------------------

#: Samples per draw of the fine-tuning and AdaBN streams: batches of any even size are whole draws
#: concatenated, so every batch size sees the same images in the same order (a paired design).
FINETUNE_UNIT = 2


def _unit_batches(task, n: int, batch_size: int, gen: torch.Generator):
    """``n`` samples of ``task`` as batches of ``batch_size`` built from :data:`FINETUNE_UNIT`-sample draws."""
    unit = BatchStream(task, FINETUNE_UNIT, gen)
    per = max(batch_size // FINETUNE_UNIT, 1)
    for _ in range(n // batch_size):
        if batch_size % FINETUNE_UNIT:
            x, y = BatchStream(task, batch_size, gen).next()
        else:
            xs, ys = zip(*(unit.next() for _ in range(per)))
            x, y = torch.cat(xs), torch.cat(ys)
        yield x, y


class FinetuneData:
    """The draws that the fine-tuning runs of one seed and target share, made once (issue 9's chapter-5 lever).

    Every :func:`finetune` run of a seed and target sees the same task-B images in the same order at every
    batch size (:data:`FINETUNE_UNIT`-sample draws), the same AdaBN images, and the same held-out sets; only
    how the stream is cut into batches differs. Passed to :func:`finetune` (``data=``), this object draws each
    stream once, as one ``(n, 3, 32, 32)`` tensor of the unit draws concatenated, and hands out batches as
    slices of it; a run with ``data=None`` draws its own. The batches are equal element for element
    (``torch.cat`` of the same draws), so every row is ``==`` to the unshared path
    (``tests/test_batch_size.py::test_shared_finetune_data_rows_equal_runs_made_alone``).

    Measured 2026-11-30 (1 torch thread, CPU seconds, the 2-core machine at load 6-14, so +-15%): drawing the
    4096-sample stream takes 0.22-0.26 s and the two held-out sets 0.12 s per run, against 0.6 s (batch 256) to
    6.3 s (batch 2) of training. Full-profile runs (4096 samples) of stats_frozen and bn_train at batch 2, 16
    and 256, in one process: 21.9 s shared against 25.2 s unshared (1.15x); at batch 256 alone 1.70 s against
    2.29 s (1.35x). ``make bench`` repeats the measurement (section "sharing levers", 1024 samples). The
    per-step cost (forward, backward, SGD at batch 2: about 3 ms, of which the optimizer step about 14%) is
    untouched: every strategy trains its own weights, so no forward can be shared.
    """

    def __init__(self):
        self._cache: dict = {}

    def _get(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def eval_set(self, task, task_key: tuple, n: int, seed: int, tag: str):
        """:func:`bnstudy.study.tasks.eval_set`, drawn once per ``task_key`` (what :func:`bnstudy.study.tasks.make_task` was
        given for ``task``), size, seed and tag."""
        return self._get(("eval", task_key, n, seed, tag), lambda: eval_set(task, n, seed, tag))

    def batches(self, task, task_key: tuple, n: int, batch_size: int, seed_parts: tuple):
        """:func:`_unit_batches` of ``task`` (made from ``task_key``) from ``generator(*seed_parts)``, cut from one
        shared draw of ``n`` samples."""
        if batch_size % FINETUNE_UNIT:
            yield from _unit_batches(task, n, batch_size, generator(*seed_parts))
            return

        def draw():
            xs, ys = zip(*_unit_batches(task, n, FINETUNE_UNIT, generator(*seed_parts)))
            return torch.cat(xs), torch.cat(ys)
        x, y = self._get(("stream", task_key, n, seed_parts), draw)
        for i in range(0, n - n % batch_size, batch_size):
            yield x[i:i + batch_size], y[i:i + batch_size]


def apply_strategy(backbone: torch.nn.Module, strategy: str, adabn_batches=None) -> torch.nn.Module:
    """Prepare ``backbone``'s norm layers for fine-tuning by ``strategy``; returns the (converted) backbone.

    ``bn_frozen``: :func:`bnstudy.freeze.freeze_batchnorm` (statistics and affine fixed).
    ``stats_frozen``: :func:`bnstudy.freeze.pin_norm_eval` (running statistics used and kept; affine trainable).
    ``adabn``: :func:`bnstudy.update_bn_stats` on ``adabn_batches`` (precise BN's population
    estimate on the target, every value weighted equally; Li et al., 2016), then pinned as ``stats_frozen``.
    ``bn_train``, ``group_pretrained``, ``layer_pretrained``: unchanged. ``to_group`` / ``to_layer``:
    :func:`bnstudy.replace_norm`. Raises ``ValueError`` for an unknown strategy or ``adabn``
    without batches.
    """
    from ..freeze import freeze_batchnorm, pin_norm_eval
    from ..running_stats import replace_norm, update_bn_stats
    if strategy == "bn_frozen":
        return freeze_batchnorm(backbone)
    if strategy == "stats_frozen":
        pin_norm_eval(backbone)
        return backbone
    if strategy == "adabn":
        if adabn_batches is None:
            raise ValueError("strategy='adabn' needs adabn_batches (unlabelled target inputs)")
        update_bn_stats(backbone, adabn_batches)
        pin_norm_eval(backbone)
        return backbone
    if strategy in ("to_group", "to_layer"):
        return replace_norm(backbone, strategy[3:])
    if strategy in ("bn_train", "group_pretrained", "layer_pretrained"):
        return backbone
    raise ValueError(f"strategy={strategy!r} is not allowed")


@torch.no_grad()
def train_mode_logits(model: torch.nn.Module, x: torch.Tensor, batch_size: int, order: torch.Tensor,
                      device) -> torch.Tensor:
    """Logits ``(N, K)`` of ``model`` in train mode on ``x`` in batches of ``batch_size`` taken in ``order``.

    Runs on a deep copy (running statistics of the model are not touched); pinned layers stay in eval
    mode, as they do during training. Rows are returned in the original order of ``x``.
    """
    import copy
    work = copy.deepcopy(model).train()
    chunks = list(order.split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) == 1:  # a lone last sample has no batch variance: join it
        chunks[-2:] = [torch.cat(chunks[-2:])]
    out = None
    for idx in chunks:
        lg = work(x[idx].to(device)).float().cpu()
        if out is None:
            out = torch.empty(len(order), lg.shape[1])
        out[idx] = lg
    return out


def finetune(cfg, source: dict, device=None, data: FinetuneData | None = None) -> dict:
    """Fine-tune the whole backbone and a new linear head on task B under ``cfg.strategy``; one results row.

    ``cfg``: a :class:`bnstudy.study.config.FinetuneConfig`; ``source``: the :func:`train_source` output of
    ``cfg.source``. Steps: load the source backbone and head A; draw head B from ``(seed, "init",
    "head_b", "linear")``; :func:`apply_strategy`; then ``cfg.steps`` steps of :func:`train_step` (SGD or
    Adam at ``cfg.lr`` on every parameter of backbone and head B that requires a gradient; head A is
    not trained) on batches of the stream ``(seed, "finetune", "B")``, built from 2-sample draws so
    that every batch size sees the same images (:data:`FINETUNE_UNIT`); close and shifted targets of a
    seed share those images, shifted. AdaBN's batches come from ``(seed, "adabn", "B")``, in batches of
    ``min(adabn_batch_size, adabn_samples)`` whatever the fine-tuning batch size. ``data``: a
    :class:`FinetuneData` shared by the runs of a seed and target (the same rows, drawn once); ``None``
    draws everything for this run alone.

    Row: the config's fields, ``steps``, ``task_a_before`` (head A on the prepared backbone, eval mode,
    before training: what the strategy itself costs the source), ``task_a_after`` (source retention),
    ``target`` (task-B accuracy, eval mode), ``target_train_mode`` (the same held-out set in train mode, in
    batches of ``batch_size`` in a fixed shuffled order), ``train_eval_gap`` (train minus eval),
    ``final_loss`` (mean of the last 10% of step losses), ``diverged`` (a non-finite loss),
    ``target_restat`` (``bn_train`` only, NaN otherwise: eval-mode target accuracy after the running statistics
    are re-estimated by :func:`bnstudy.update_bn_stats` on the first ``adabn_samples`` images of the
    fine-tuning stream, in batches as AdaBN's, on a copy), ``source_task_a_accuracy`` and ``wall_s``.
    Accuracies are fractions 0..1.
    """
    t0 = time.perf_counter()
    device = pick_device(device)
    c = cfg
    backbone = ConvBackbone(3, c.widths, c.norm, c.momentum)
    backbone.load_state_dict(source["backbone"])
    head_a = make_head("linear", backbone.out_features, c.n_classes)
    head_a.load_state_dict(source["head_a"])
    head_b = seeded((c.seed, "init", "head_b", "linear"), lambda: make_head("linear", backbone.out_features,
                                                                             c.n_classes))
    key_a, key_b = (c.seed, "A", c.n_classes, c.noise), (c.seed, "B", c.n_classes, c.noise, c.brightness, c.contrast)
    task_a, task_b = make_task(*key_a), make_task(*key_b)
    if data is None:
        eval_a, eval_b = eval_set(task_a, c.n_eval, c.seed, "A"), eval_set(task_b, c.n_eval, c.seed, "B")

        def batches(n, tag, size=c.batch_size):
            return _unit_batches(task_b, n, size, generator(c.seed, tag, "B"))
    else:
        eval_a = data.eval_set(task_a, key_a, c.n_eval, c.seed, "A")
        eval_b = data.eval_set(task_b, key_b, c.n_eval, c.seed, "B")

        def batches(n, tag, size=c.batch_size):
            return data.batches(task_b, key_b, n, size, (c.seed, tag, "B"))
    stat_batch = min(c.adabn_batch_size, c.adabn_samples)
    adabn = None
    if c.strategy == "adabn":
        adabn = [x for x, _ in batches(c.adabn_samples, "adabn", stat_batch)]
    backbone = apply_strategy(backbone, c.strategy, adabn).to(device)
    head_a, head_b = head_a.to(device), head_b.to(device)
    for p in head_a.parameters():
        p.requires_grad_(False)
    model_b, model_a = Classifier(backbone, head_b), Classifier(backbone, head_a)
    model_b.eval()
    a_before = accuracy(logits_of(model_a, eval_a[0], device), eval_a[1])
    params = [p for p in model_b.parameters() if p.requires_grad]
    opt = make_optimizer(c.optimizer, params, c.lr)
    losses = []
    for step, (x, y) in enumerate(batches(c.samples, "finetune"), start=1):
        losses.append(float(train_step(model_b, model_b, opt, step, x, y, c.epoch_steps, device)))
    model_b.eval()
    target = accuracy(logits_of(model_b, eval_b[0], device), eval_b[1])
    order = torch.randperm(len(eval_b[1]), generator=generator(c.seed, "train_eval_order"))
    target_tm = accuracy(train_mode_logits(model_b, eval_b[0], c.batch_size, order, device), eval_b[1])
    model_b.eval()
    target_restat = math.nan
    if c.strategy == "bn_train":
        import copy
        from ..running_stats import update_bn_stats
        work = copy.deepcopy(model_b)
        n_re = min(c.adabn_samples, c.samples)
        update_bn_stats(work.backbone, [x.to(device) for x, _ in batches(n_re, "finetune", min(stat_batch, n_re))])
        target_restat = accuracy(logits_of(work.eval(), eval_b[0], device), eval_b[1])
    tail = losses[-max(1, len(losses) // 10):]
    row = c.asdict()
    row["widths"] = "-".join(map(str, c.widths))
    row.update(steps=c.steps, task_a_before=a_before,
               task_a_after=accuracy(logits_of(model_a, eval_a[0], device), eval_a[1]),
               target=target, target_train_mode=target_tm, train_eval_gap=target_tm - target,
               target_restat=target_restat,
               final_loss=float(sum(tail) / len(tail)), diverged=not all(math.isfinite(v) for v in losses),
               source_task_a_accuracy=source["task_a_accuracy"], wall_s=time.perf_counter() - t0)
    return row

# --- issue 9: finite training sets, fixed features ---------------------------------------------------------------

def batch_source(task, batch_size: int, train_size: int | None, seed: int, tag: str, sampler: str = "shuffled"):
    """The training batches of task ``tag`` of ``seed``: an endless stream of fresh samples
    (:class:`~bnstudy.study.tasks.BatchStream`, ``train_size=None``) or batches sampled from a finite set of
    ``train_size`` samples drawn once (:func:`~bnstudy.study.tasks.train_set`, :class:`~bnstudy.study.tasks.SetBatches`).
    Both sample from the generator ``(seed, "stream", tag)``.
    """
    gen = generator(seed, "stream", tag)
    if train_size is None:
        return BatchStream(task, batch_size, gen, sampler)
    x, y = train_set(task, train_size, seed, tag)
    return SetBatches(x, y, batch_size, gen, sampler)


def features_fixed(c: RunConfig) -> bool:
    """Whether the backbone's output for a given input never changes during ``c``'s stage 2.

    True unless a BatchNorm in the backbone normalises with batch statistics (``norm="batch"`` in a
    mode with ``backbone_batch_stats``): the weights are frozen in every mode, and eval-mode
    BatchNorm, GroupNorm, LayerNorm and the identity act on each sample alone. Then the runs of a
    lockstep group that share a memory format share one backbone forward per step, and with a
    finite training set (``train_size``) the features of the whole set are computed once
    (:func:`set_features`) and only head B runs per step.
    """
    return not (c.norm == "batch" and get_mode(c.mode).backbone_batch_stats)


@torch.no_grad()
def set_features(module: torch.nn.Module, x: torch.Tensor, device, fmt, batch_size: int) -> torch.Tensor:
    """``module``'s output ``(N, F)`` on every row of ``x (N, C, H, W)``, in chunks of exactly ``batch_size``.

    Chunks of the training batch size (the last one padded with the set's first rows and cut
    back) make oneDNN choose the same convolution kernels as a training step does, so each row
    equals, bit for bit, what the per-step forward would give it (``tests/test_engine.py``
    checks the rows of the cached path against the uncached one with ``==``).
    """
    out = []
    for i in range(0, x.shape[0], batch_size):
        xb = x[i:i + batch_size]
        k = xb.shape[0]
        if k < batch_size:
            xb = torch.cat([xb, x[:batch_size - k]])
        out.append(module(xb.to(device, memory_format=fmt))[:k])
    return torch.cat(out)


#: Share backbone forwards between the runs of a lockstep group (:func:`feature_groups`); ``False`` runs every
#: mode's full forward, the reference the tests compare with (rows ``==``). Per step of chapter 1's four modes
#: the backbone forwards fall from 4 to 2 (one train-mode, one eval-mode); with a finite set to 1 plus one
#: feature table per set. Measured in CPU seconds (one process, 2-core machine at load ~24, so +-10%): a
#: 4-mode x 300-step group 7.40 s -> 5.65 s (stream), 3.84 s (train_size=6400); stage 1 (400 steps) 8.14 s ->
#: 5.54 s with a finite set (no per-step noise); the bench workload 6.4 -> 4.5 CPU s.
SHARE_FEATURES = True


def feature_groups(runs: list) -> dict:
    """Runs of one lockstep group whose backbones give the same output on a batch, by ``(kind, memory format)``.

    ``("fixed", fmt)``: features fixed (:func:`features_fixed`); the runs' backbones have the same
    weights and buffers throughout, so one forward serves all. ``("batch", fmt)``: BatchNorm with batch
    statistics (``train_mode``, ``separate_stats``): the output of a train-mode BatchNorm does not
    depend on its running buffers, so every such run computes the same features from the same batch;
    their running buffers also follow the same update sequence from the same start, so the group's
    first run (the leader) does the forward and its buffers are copied to the others' buffer owners
    (:func:`copy_norm_buffers`). A ``batch`` group of one run keeps the ordinary full forward.
    """
    groups: dict = {}
    for run in runs:
        groups.setdefault(run.feature_key, []).append(run)
    return {k: rs for k, rs in groups.items() if k[0] == "fixed" or len(rs) > 1}


@torch.no_grad()
def copy_norm_buffers(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Copy every BatchNorm buffer (running_mean, running_var, num_batches_tracked) of ``src`` into ``dst`` (same architecture)."""
    dst_layers = batchnorm_layers(dst)
    for name, m in batchnorm_layers(src).items():
        d = dst_layers[name]
        for b in ("running_mean", "running_var", "num_batches_tracked"):
            if getattr(m, b) is not None:
                getattr(d, b).copy_(getattr(m, b))
