"""Chapter 2: the everyday calls that undo a freeze, each caught by the audit and then fixed.

Five traps, each run on the small conv network of chapter 1 (trained on task A,
one per seed, packed) or on a single BatchNorm layer, each wrapped in a
:class:`bnstudy.audit.FreezeAudit` or checked by a :mod:`bnstudy.audit` lint:

1. ``train_call``: a loop calls ``model.train()`` every epoch and undoes the
   backbone's ``eval()``; fixed by :func:`bnstudy.freeze.pin_eval`.
2. ``no_grad``: a teacher (or validation) pass left in train mode under
   ``torch.no_grad()`` still overwrites running statistics, and a sample's
   output depends on its batch mates; fixed by ``eval()``.
3. ``whole_eval``: the whole model in eval mode turns dropout off and changes
   what ``forward`` returns (auxiliary logits only in train mode, as
   torchvision's Inception v3); fixed by pinning only the backbone.
4. ``sorted_batches``: batches whose composition follows the label; the
   train-mode/eval-mode gap grows with the fraction of each batch that shares
   one class.
5. ``tiny_batch``: train-mode accuracy against the per-device batch size, and
   the batch-of-1 and batch-of-2 cases of BatchNorm1d/2d.

:func:`run` returns a tidy long table (one row per seed, trap, case and
quantity); :func:`run_traps` also returns the first seed's audits and lints so
the chapter can show what the audit printed.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .. import audit, train
from ..freeze import TransferModel, pin_eval
from ..models import Classifier, ConvBackbone, make_head
from ..tasks import BatchStream, derive_seed, eval_set, generator, make_task
from .common import mean_ci, seeds_for

#: Every config key, its default and meaning (units in the comment).
DEFAULTS: dict = dict(
    profile="quick",         # quick | full: default seed count (bnstudy.experiments.common.PROFILE_SEEDS)
    seeds=None,              # None (profile's count), an int n (seeds 0..n-1) or a list of seeds
    n_classes=10,            # classes per task
    noise=1.0,               # per-pixel noise std (templates have std 1)
    widths=(8, 16),          # backbone block widths (two conv-BN-ReLU blocks)
    momentum=0.1,            # BatchNorm momentum (PyTorch convention)
    stage1_steps=200,        # optimizer steps training backbone + head A on task A
    stage1_batch_size=32,    # stage-1 batch size
    brightness=4.0,          # task-B additive shift (template std units)
    contrast=5.0,            # task-B multiplicative gain
    steps=60,                # head-training steps in traps 1 and 3
    batch_size=32,           # batch size of those steps, of the teacher passes and of trap 4's batches
    epoch_steps=10,          # the loop calls model.train() every epoch_steps steps
    lr=0.05,                 # SGD (momentum 0.9) learning rate for the new heads
    teacher_batches=3,       # trap 2: no_grad passes of the train-mode teacher
    n_eval=512,              # held-out samples per task (also the probe batch)
    sorted_fractions=(0.0, 0.25, 0.5, 0.75, 1.0),  # trap 4: share of each batch drawn from one class
    batch_sizes=(1, 2, 4, 8, 16, 32, 64),          # trap 5: per-device batch sizes in train mode
    min_batch=audit.MIN_BATCH,  # the small_batch lint's threshold
    threads=1,               # torch CPU threads while running (restored after): these nets are too small to gain
)
TRAPS = ("train_call", "no_grad", "whole_eval", "sorted_batches", "tiny_batch")
COLUMNS = ["seed", "trap", "case", "quantity", "value", "sorted_fraction", "batch_size"]

AuxOutputs = namedtuple("AuxOutputs", "logits aux_logits")


class AuxHeadNet(nn.Module):
    """A backbone, a main head behind dropout, and an auxiliary head that only train mode returns.

    ``forward(x)`` returns ``AuxOutputs(logits, aux_logits)`` (each ``(B, K)``)
    in train mode and the main ``logits`` ``(B, K)`` alone in eval mode, which
    is what torchvision's Inception v3 does with its auxiliary classifier.
    """

    def __init__(self, backbone: nn.Module, n_features: int, n_classes: int, p_drop: float = 0.3):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(p_drop), nn.Linear(n_features, n_classes))
        self.aux = nn.Linear(n_features, n_classes)

    def forward(self, x: torch.Tensor):
        f = self.backbone(x)
        logits = self.head(f)
        return AuxOutputs(logits, self.aux(f)) if self.training else logits


def aux_loss(out, y: torch.Tensor, aux_weight: float = 0.4) -> torch.Tensor:
    """Cross-entropy of the main logits, plus ``aux_weight`` times the auxiliary one when ``out`` has it.

    The usual loss for such models; with the model in eval mode the auxiliary
    term silently disappears.
    """
    if isinstance(out, AuxOutputs):
        return F.cross_entropy(out.logits, y) + aux_weight * F.cross_entropy(out.aux_logits, y)
    return F.cross_entropy(out, y)


def sorted_fraction_labels(n_batches: int, batch_size: int, n_classes: int, sorted_fraction: float,
                           gen: torch.Generator) -> list[torch.Tensor]:
    """Labels of ``n_batches`` batches where ``round(sorted_fraction * batch_size)`` samples share one class.

    The shared class cycles through the classes in a random order (a new order
    every ``n_classes`` batches); the rest of each batch is drawn uniformly at
    random, and each batch is shuffled. ``sorted_fraction=0`` is a shuffled
    loader, ``1`` a class-sorted one. Raises ``ValueError`` for a fraction
    outside [0, 1] or a non-positive size.
    """
    if not 0.0 <= sorted_fraction <= 1.0:
        raise ValueError(f"sorted_fraction must be in [0, 1], got {sorted_fraction!r}")
    for name, v in (("n_batches", n_batches), ("batch_size", batch_size), ("n_classes", n_classes)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    m = round(sorted_fraction * batch_size)
    out, order = [], []
    for _ in range(n_batches):
        if not order:
            order = torch.randperm(n_classes, generator=gen).tolist()
        c = order.pop(0)
        y = torch.cat([torch.full((m,), c, dtype=torch.long),
                       torch.randint(n_classes, (batch_size - m,), generator=gen)])
        out.append(y[torch.randperm(batch_size, generator=gen)])
    return out


def complete_config(config: dict | None) -> dict:
    """``config`` with defaults filled in; raises ``ValueError`` naming an unknown key or a bad value."""
    config = dict(config or {})
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; allowed keys are {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    cfg["widths"] = tuple(cfg["widths"])
    cfg["sorted_fractions"] = tuple(float(p) for p in cfg["sorted_fractions"])
    cfg["batch_sizes"] = tuple(cfg["batch_sizes"])
    for key in ("steps", "batch_size", "epoch_steps", "teacher_batches", "n_eval", "min_batch", "stage1_steps",
                "stage1_batch_size", "threads"):
        v = cfg[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    if cfg["batch_size"] < 2:
        raise ValueError(f"batch_size must be >= 2 (train-mode BatchNorm), got {cfg['batch_size']}")
    if any(not isinstance(b, int) or b < 1 for b in cfg["batch_sizes"]):
        raise ValueError(f"batch_sizes must be positive integers, got {cfg['batch_sizes']!r}")
    if any(not 0.0 <= p <= 1.0 for p in cfg["sorted_fractions"]):
        raise ValueError(f"sorted_fractions must lie in [0, 1], got {cfg['sorted_fractions']!r}")
    if not cfg["lr"] > 0:
        raise ValueError(f"lr must be > 0, got {cfg['lr']!r}")
    cfg["seeds"] = seeds_for(cfg["profile"], cfg["seeds"])
    return cfg


def _stage1_config(cfg: dict, seed: int) -> dict:
    return dict(seed=seed, n_classes=cfg["n_classes"], noise=cfg["noise"], widths=cfg["widths"], norm="batch",
                momentum=cfg["momentum"], stage1_steps=cfg["stage1_steps"], stage1_lr=3e-3,
                stage1_batch_size=cfg["stage1_batch_size"], n_eval=cfg["n_eval"])


@dataclass
class _Ctx:
    """Everything one seed's traps share: the trained source and both tasks' fixed sets."""

    cfg: dict
    seed: int
    source: dict
    task_a: object
    task_b: object
    eval_a: tuple
    eval_b: tuple

    def backbone(self) -> ConvBackbone:
        bb = ConvBackbone(3, self.cfg["widths"], "batch", 1, self.cfg["momentum"])
        bb.load_state_dict(self.source["backbone"])
        return bb

    def head_a(self) -> nn.Module:
        head = make_head("linear", self.cfg["widths"][-1], self.cfg["n_classes"])
        head.load_state_dict(self.source["head_a"])
        return head

    def classifier(self) -> Classifier:
        return Classifier(self.backbone(), self.head_a())

    def seeded(self, tag: str, build):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "ch02", tag))
            return build()

    def stream_b(self, tag: str) -> BatchStream:
        return BatchStream(self.task_b, self.cfg["batch_size"], generator(self.seed, "ch02", "stream", tag))


@torch.no_grad()
def _accuracy(forward, x: torch.Tensor, y: torch.Tensor, chunk: int = 256) -> float:
    pred = torch.cat([forward(x[i:i + chunk]).argmax(-1) for i in range(0, len(x), chunk)])
    return float((pred == y).float().mean())


def _eval_accuracy(model: nn.Module, forward, x, y) -> float:
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False
    try:
        return _accuracy(forward, x, y)
    finally:
        for m, flag in saved:
            m.training = flag


def _train_heads(model: nn.Module, forward, params, stream: BatchStream, cfg: dict, loss_fn) -> list[float]:
    """An ordinary loop: ``model.train()`` at every epoch start, SGD on ``params``; returns the losses."""
    opt = torch.optim.SGD(params, lr=cfg["lr"], momentum=0.9)
    losses = []
    for step in range(cfg["steps"]):
        if step % cfg["epoch_steps"] == 0:
            model.train()  # what every training loop does at the start of an epoch
        x, y = stream.next()
        loss = loss_fn(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _buffer_stats(a: audit.FreezeAudit, module_prefix: str) -> dict:
    rep = a.report()
    inside = rep["module"].map(lambda m: m == module_prefix or m.startswith(module_prefix + ".")) \
        if module_prefix else rep["module"].map(lambda m: True)
    stats = rep[inside & rep["name"].isin(["running_mean", "running_var"])]
    nbt = rep[inside & (rep["name"] == "num_batches_tracked")]
    params = rep[inside & (rep["kind"] == "param")]
    return dict(max_buffer_change=float(stats["max_abs_change"].max()),
                num_batches_tracked_change=float(nbt["max_abs_change"].max()),
                max_param_change=float(params["max_abs_change"].max()))


def _bn_train_fraction(a: audit.FreezeAudit, kinds=("batchnorm",)) -> float:
    modes = a.modes()
    bn = modes[modes["kind"].isin(kinds) & (modes["calls"] > 0)]
    return float(bn["train_calls"].sum() / bn["calls"].sum()) if len(bn) else float("nan")


def _n_warnings(lints) -> int:
    return sum(x.severity == "warning" for x in lints)


@dataclass
class TrapOutcome:
    """One trap's rows (for the tidy table) and, per case, its audit and lints."""

    rows: list = field(default_factory=list)
    audits: dict = field(default_factory=dict)
    lints: dict = field(default_factory=dict)

    def add(self, seed, trap, case, quantities: dict, **sweep) -> None:
        for q, v in quantities.items():
            self.rows.append(dict(seed=seed, trap=trap, case=case, quantity=q, value=float(v), **sweep))


# ---------------------------------------------------------------------------
# The five traps
# ---------------------------------------------------------------------------


def trap_train_call(ctx: _Ctx) -> TrapOutcome:
    """Trap 1: ``backbone.eval()`` once, then ``model.train()`` every epoch, against :func:`pin_eval`."""
    out = TrapOutcome()
    xa, ya = ctx.eval_a
    cfg = ctx.cfg
    for case in ("eval_once", "pinned"):
        head_b = ctx.seeded("head_b", lambda: make_head("linear", cfg["widths"][-1], cfg["n_classes"]))
        model = TransferModel(ctx.backbone(), ctx.head_a(), head_b)
        model.backbone.requires_grad_(False)
        model.head_a.requires_grad_(False)
        if case == "eval_once":
            model.backbone.eval()  # the freeze as usually written
        else:
            pin_eval(model.backbone)
        before = _eval_accuracy(model, model.forward_a, xa, ya)
        with audit.FreezeAudit(model, probe=xa, forward=model.forward_a, warn=False) as a:
            _train_heads(model, model.forward_b, model.head_b.parameters(), ctx.stream_b("train_call"), cfg,
                         F.cross_entropy)
        q = _buffer_stats(a, "backbone")
        q.update(task_a_before=before, task_a_after=_eval_accuracy(model, model.forward_a, xa, ya),
                 task_b=_eval_accuracy(model, model.forward_b, *ctx.eval_b),
                 max_probe_change=float(a.outputs()["max_abs_change"].max()),
                 bn_train_fraction=_bn_train_fraction(a), n_lint_warnings=_n_warnings(a.lints),
                 frozen_bn_lint=float(any(x.code == "frozen_bn_in_train_mode" for x in a.lints)))
        out.add(ctx.seed, "train_call", case, q)
        out.audits[case], out.lints[case] = a, a.lints
    return out


def _batch_mate_logits(model: nn.Module, x_own: torch.Tensor, mates: torch.Tensor, half: int) -> torch.Tensor:
    """Logits of ``x_own`` in chunks of ``half``, each chunk batched with ``half`` rows of ``mates``."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(x_own) - half + 1, half):
            j = (i // half * half) % (len(mates) - half + 1)
            batch = torch.cat([x_own[i:i + half], mates[j:j + half]])
            outs.append(model(batch)[:half])
    return torch.cat(outs)


def trap_no_grad(ctx: _Ctx) -> TrapOutcome:
    """Trap 2: a train-mode teacher under ``no_grad`` drifts; its outputs depend on the batch mates."""
    out = TrapOutcome()
    xa, ya = ctx.eval_a
    xb = ctx.eval_b[0]
    cfg = ctx.cfg
    half = cfg["batch_size"] // 2
    n = (len(xa) // 2) // half * half  # own samples; the other half of the set provides task-A batch mates
    for case in ("train_mode", "eval"):
        teacher = ctx.classifier().train(case == "train_mode")
        before = _eval_accuracy(teacher, teacher, xa, ya)
        stream = ctx.stream_b("teacher")
        with audit.FreezeAudit(teacher, probe=xa, warn=False) as a, torch.no_grad():
            for _ in range(cfg["teacher_batches"]):
                teacher(stream.next()[0])  # soft targets for task B, or a validation pass
        q = _buffer_stats(a, "")
        q.update(task_a_before=before, task_a_after=_eval_accuracy(teacher, teacher, xa, ya),
                 max_probe_change=float(a.outputs()["max_abs_change"].max()),
                 n_lint_warnings=_n_warnings(a.lints),
                 no_grad_lint=float(any(x.code == "train_mode_under_no_grad" for x in a.lints)))
        # The same task-A samples, batched with other task-A samples or with task-B samples.
        fresh = ctx.classifier().train(case == "train_mode")
        with_a = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xa[n:], half)
        with_b = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xb, half)
        q.update(accuracy_with_a_mates=float((with_a.argmax(1) == ya[:n]).float().mean()),
                 accuracy_with_b_mates=float((with_b.argmax(1) == ya[:n]).float().mean()),
                 max_logit_change_by_mates=float((with_a - with_b).abs().max()))
        out.add(ctx.seed, "no_grad", case, q)
        out.audits[case], out.lints[case] = a, a.lints
    return out


def trap_whole_eval(ctx: _Ctx) -> TrapOutcome:
    """Trap 3: the whole model pinned in eval mode (dropout off, no auxiliary logits) against the backbone only."""
    out = TrapOutcome()
    cfg = ctx.cfg
    xb, yb = ctx.eval_b
    for case in ("whole_model", "backbone_only"):
        model = ctx.seeded("aux_net", lambda: AuxHeadNet(ctx.backbone(), cfg["widths"][-1], cfg["n_classes"]))
        model.backbone.requires_grad_(False)
        forward_lints = audit.lint_forward_modes(model, xb[:cfg["batch_size"]], warn=False)
        pin_eval(model if case == "whole_model" else model.backbone)
        aux_terms = []

        def loss_fn(o, y):
            aux_terms.append(isinstance(o, AuxOutputs))
            return aux_loss(o, y)

        with audit.FreezeAudit(model, warn=False) as a:
            _train_heads(model, model, list(model.head.parameters()) + list(model.aux.parameters()),
                         ctx.stream_b("whole_eval"), cfg, loss_fn)
        rep = a.report()
        head = rep[rep["module"].str.startswith("head")]
        aux = rep[rep["module"] == "aux"]
        modes = a.modes()
        drop = modes[modes["kind"] == "dropout"]
        q = dict(head_max_param_change=float(head["max_abs_change"].max()),
                 aux_max_param_change=float(aux["max_abs_change"].max()),
                 backbone_max_buffer_change=_buffer_stats(a, "backbone")["max_buffer_change"],
                 dropout_train_fraction=float(drop["train_calls"].sum() / drop["calls"].sum()),
                 aux_loss_fraction=float(np.mean(aux_terms)),
                 task_b_main=_eval_accuracy(model, model, xb, yb),
                 task_b_aux=_eval_accuracy(model, lambda x: model.aux(model.backbone(x)), xb, yb),
                 forward_mode_lint=float(any(x.code == "forward_changes_with_mode" for x in forward_lints)),
                 dropout_lint=float(any(x.code == "dropout_off_in_training" for x in a.lints)),
                 n_lint_warnings=_n_warnings(a.lints))
        out.add(ctx.seed, "whole_eval", case, q)
        out.audits[case] = a
        out.lints[case] = forward_lints + a.lints
    return out


def trap_sorted_batches(ctx: _Ctx) -> TrapOutcome:
    """Trap 4: the trained model on batches where a fraction of each batch shares one class.

    For each fraction: accuracy in eval mode (running statistics: independent of
    the batching), in train mode (batch statistics, what a training loop's
    accuracy meter sees; the model copy's running statistics are updated as a
    loop would), the eval-mode accuracy on the shuffled held-out set after that
    one train-mode pass, the loader's :func:`bnstudy.audit.batch_label_dependence`
    and whether :func:`bnstudy.audit.lint_loader` flags it.
    """
    out = TrapOutcome()
    cfg = ctx.cfg
    xa, ya = ctx.eval_a
    n_batches = max(cfg["n_eval"] // cfg["batch_size"], 2)
    for p in cfg["sorted_fractions"]:
        g = generator(ctx.seed, "ch02", "sorted", p)
        labels = sorted_fraction_labels(n_batches, cfg["batch_size"], cfg["n_classes"], p, g)
        xs = [ctx.task_a.sample(y, g) for y in labels]
        model = ctx.classifier().eval()
        y_all, x_all = torch.cat(labels), torch.cat(xs)
        eval_acc = _accuracy(model, x_all, y_all)
        model.train()
        with torch.no_grad():
            train_acc = float(torch.cat([model(x).argmax(1) == y for x, y in zip(xs, labels)]).float().mean())
        lints = audit.lint_loader(None, cfg["batch_size"], labels_per_batch=labels, warn=False)
        dep = audit.batch_label_dependence(labels)
        q = dict(eval_accuracy=eval_acc, train_mode_accuracy=train_acc,
                 eval_accuracy_after_pass=_eval_accuracy(model, model, xa, ya),
                 label_dependence=dep["dependence"],
                 sorted_lint=float(any(x.code == "label_sorted_batches" for x in lints)))
        out.add(ctx.seed, "sorted_batches", "fraction", q, sorted_fraction=p)
        out.lints[p] = lints
    return out


def trap_tiny_batch(ctx: _Ctx) -> TrapOutcome:
    """Trap 5: train-mode accuracy of the trained model against the per-device batch size."""
    out = TrapOutcome()
    cfg = ctx.cfg
    xa, ya = ctx.eval_a
    model = ctx.classifier().eval()
    eval_acc = _accuracy(model, xa, ya)
    for b in cfg["batch_sizes"]:
        work = copy.deepcopy(model).train()
        n = len(xa) // b * b
        with torch.no_grad():
            pred = torch.cat([work(xa[i:i + b]).argmax(1) for i in range(0, n, b)])
        lints = audit.lint_model(work, batch_size=b, min_batch=cfg["min_batch"], warn=False)
        codes = {x.code for x in lints}
        q = dict(train_mode_accuracy=float((pred == ya[:n]).float().mean()), eval_accuracy=eval_acc,
                 small_batch_lint=float(bool(codes & {"small_batch", "single_sample_batch"})))
        out.add(ctx.seed, "tiny_batch", "batch_size", q, batch_size=b)
        out.lints[b] = lints
    return out


def single_layer_cases(seed: int = 0) -> dict:
    """The one-layer facts the chapter quotes, computed (not asserted) on fresh layers.

    Returns a dict: ``bn1d_batch1_error`` (the message PyTorch raises for a
    train-mode BatchNorm1d on a ``(1, C)`` batch, and the audit's lint that
    named the layer first), ``bn2d_batch1_output_mean`` (largest |per-channel
    mean| of a train-mode BatchNorm2d's output on one image: 0 up to rounding,
    it normalised the image with its own statistics), ``bn1d_batch2_max_dev``
    (largest | |y| - 1 | of a train-mode BatchNorm1d's output on two samples),
    ``sorted_running_mean``/``shuffled_running_mean``/``data_mean`` (BN1d(1)
    after one epoch at batch 10 over 10 classes x 100 samples drawn from
    N(k, 0.5): class-sorted against shuffled), ``last_batch_lint`` (the lint for
    17 samples at batch size 16), ``untracked_lint`` and ``momentum_zero_lint``.
    """
    g = torch.Generator().manual_seed(derive_seed(seed, "ch02", "single"))
    res = {}
    bn1 = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=nn.BatchNorm1d(4))).train()
    with audit.FreezeAudit(bn1, warn=False) as a:
        try:
            bn1(torch.randn(1, 4, generator=g))
            res["bn1d_batch1_error"] = ""
        except ValueError as e:
            res["bn1d_batch1_error"] = str(e)
    res["bn1d_batch1_lint"] = str(a.lints[0]) if a.lints else ""
    bn2 = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), norm=nn.BatchNorm2d(4))).train()
    with audit.FreezeAudit(bn2, warn=False) as a2:
        y2 = bn2(torch.randn(1, 3, 8, 8, generator=g) * 3 + 1)
    res["bn2d_batch1_output_mean"] = float(y2.detach().mean((0, 2, 3)).abs().max())
    res["bn2d_batch1_lint"] = str(a2.lints[0]) if a2.lints else ""
    y = nn.BatchNorm1d(4, affine=False).train()(torch.randn(2, 4, generator=g) * 5 + 3)
    res["bn1d_batch2_max_dev"] = float((y.abs() - 1).abs().max())
    ys = torch.arange(10).repeat_interleave(100)
    x = (ys.float() + 0.5 * torch.randn(1000, generator=g)).unsqueeze(1)
    for name, order in (("sorted", torch.arange(1000)), ("shuffled", torch.randperm(1000, generator=g))):
        bn = nn.BatchNorm1d(1).train()
        labels = []
        for i in range(0, 1000, 10):
            bn(x[order[i:i + 10]])
            labels.append(ys[order[i:i + 10]])
        res[f"{name}_running_mean"] = float(bn.running_mean)
        res[f"{name}_lints"] = audit.lint_loader(1000, 10, labels_per_batch=labels, warn=False)
    res["data_mean"] = float(x.mean())
    res["last_batch_lint"] = str(audit.lint_loader(17, 16, warn=False)[0])
    untracked = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), norm=nn.BatchNorm1d(3, track_running_stats=False)))
    res["untracked_lint"] = str(audit.lint_model(untracked.eval(), warn=False)[0])
    frozen_stats = nn.Sequential(OrderedDict(norm=nn.BatchNorm1d(3, momentum=0.0)))
    res["momentum_zero_lint"] = str(audit.lint_model(frozen_stats, warn=False)[0])
    return res


@dataclass
class EvalTrapsResult:
    """:func:`run_traps`'s result: the tidy ``table``, and the first seed's ``audits``/``lints`` by trap and case."""

    table: pd.DataFrame
    audits: dict
    lints: dict
    source_accuracy: dict
    config: dict


TRAP_FUNCTIONS = dict(train_call=trap_train_call, no_grad=trap_no_grad, whole_eval=trap_whole_eval,
                      sorted_batches=trap_sorted_batches, tiny_batch=trap_tiny_batch)


def run_traps(config: dict | None = None) -> EvalTrapsResult:
    """Run all five traps for every seed; see :data:`DEFAULTS` for the keys of ``config``.

    Stage 1 trains one source network per seed (packed into one run, see
    :func:`bnstudy.train.train_source`); every trap then starts from a fresh
    copy of it. Runs with ``threads`` torch CPU threads (default 1: these
    networks are too small to gain from more, and spare cores only spin) and
    restores the previous setting. Each trap seeds its own generators from the seed and a tag, so
    the numbers do not depend on which traps ran before. Raises ``ValueError``
    for an unknown key or a bad value.
    """
    cfg = complete_config(config)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(cfg["threads"])
    try:
        return _run_traps(cfg)
    finally:
        torch.set_num_threads(saved_threads)


def _run_traps(cfg: dict) -> EvalTrapsResult:
    sources = train.train_source([_stage1_config(cfg, s) for s in cfg["seeds"]])
    rows, audits, lints, accs = [], {}, {}, {}
    for i, (seed, src) in enumerate(zip(cfg["seeds"], sources)):
        task_a = make_task(seed, "A", cfg["n_classes"], cfg["noise"])
        task_b = make_task(seed, "B", cfg["n_classes"], cfg["noise"], cfg["brightness"], cfg["contrast"])
        ctx = _Ctx(cfg, seed, src, task_a, task_b, eval_set(task_a, cfg["n_eval"], seed, "A"),
                   eval_set(task_b, cfg["n_eval"], seed, "B"))
        accs[seed] = src["task_a_accuracy"]
        for trap, fn in TRAP_FUNCTIONS.items():
            outcome = fn(ctx)
            rows += outcome.rows
            if i == 0:
                audits[trap], lints[trap] = outcome.audits, outcome.lints
    table = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in table:
            table[col] = np.nan
    return EvalTrapsResult(table[COLUMNS], audits, lints, accs, cfg)


def run(config: dict | None = None) -> pd.DataFrame:
    """Chapter 2's tidy results: one row per (seed, trap, case, quantity[, sweep value]).

    Columns: ``seed``, ``trap`` (:data:`TRAPS`), ``case``, ``quantity``,
    ``value``, ``sorted_fraction`` (trap 4) and ``batch_size`` (trap 5), NaN
    elsewhere. Accuracies are fractions 0..1; changes are absolute, in the
    tensor's units (logits for probe outputs).
    """
    return run_traps(config).table


def value(table: pd.DataFrame, trap: str, case: str, quantity: str, **sweep) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds of one quantity; raises ``KeyError`` if no row matches."""
    sel = (table["trap"] == trap) & (table["case"] == case) & (table["quantity"] == quantity)
    for k, v in sweep.items():
        sel &= np.isclose(table[k], v)
    vals = table.loc[sel, "value"]
    if vals.empty:
        raise KeyError(f"no rows for trap={trap!r}, case={case!r}, quantity={quantity!r}, {sweep}")
    return mean_ci(vals)


def curve(table: pd.DataFrame, trap: str, quantity: str, x: str) -> pd.DataFrame:
    """Mean and 95% t-interval over seeds of ``quantity`` at each value of sweep column ``x``."""
    sub = table[(table["trap"] == trap) & (table["quantity"] == quantity)]
    recs = []
    for xv, g in sub.groupby(x):
        m, lo, hi = mean_ci(g["value"])
        recs.append({x: xv, "mean": m, "ci_low": lo, "ci_high": hi, "n_seeds": len(g)})
    return pd.DataFrame(recs)


# ---------------------------------------------------------------------------
# Figures and the closing table
# ---------------------------------------------------------------------------


def plot_sorted_batches(table: pd.DataFrame):
    """Accuracy against the share of each batch drawn from one class (trap 4); returns the figure.

    Lines: eval mode (running statistics), train mode (batch statistics), and
    eval mode after the train-mode pass; each the mean over seeds with a 95%
    Student-t band. The top axis gives each loader's label dependence (0 random,
    1 class-sorted); filled markers are the loaders the audit's lint flagged.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = [("eval_accuracy", "eval mode (running statistics)", "C0", "o"),
              ("train_mode_accuracy", "train mode (batch statistics)", "C3", "s"),
              ("eval_accuracy_after_pass", "eval mode, after the train-mode pass", "C2", "^")]
    for q, label, color, marker in series:
        c = curve(table, "sorted_batches", q, "sorted_fraction")
        ax.plot(c["sorted_fraction"], c["mean"], marker=marker, ms=4, color=color, label=label)
        ax.fill_between(c["sorted_fraction"], c["ci_low"], c["ci_high"], color=color, alpha=0.2)
    flagged = curve(table, "sorted_batches", "sorted_lint", "sorted_fraction")
    dep = curve(table, "sorted_batches", "label_dependence", "sorted_fraction")
    tm = curve(table, "sorted_batches", "train_mode_accuracy", "sorted_fraction")
    hit = flagged["mean"] > 0.5
    ax.scatter(tm["sorted_fraction"][hit], tm["mean"][hit], s=70, facecolors="none", edgecolors="k", zorder=5,
               label="loader flagged by the lint")
    ax.set_xlabel("share of each batch drawn from one class (0 = shuffled, 1 = class-sorted)")
    ax.set_ylabel("accuracy on task A")
    ax.set_ylim(0, 1.02)
    top = ax.secondary_xaxis("top")
    top.set_xticks(dep["sorted_fraction"].tolist())
    top.set_xticklabels([f"{v:.2f}".replace("-0.00", "0.00") for v in dep["mean"]])
    top.set_xlabel("label dependence of the batches (audit)")
    ax.legend(fontsize=8, loc="lower left")
    return fig


def plot_batch_size(table: pd.DataFrame, min_batch: int = audit.MIN_BATCH, n_classes: int = 10):
    """Train-mode accuracy against the per-device batch size (trap 5); returns the figure.

    Mean over seeds with a 95% Student-t band; the eval-mode accuracy and
    chance as reference lines; the shaded region is where the audit's
    ``small_batch`` / ``single_sample_batch`` lints fire (below ``min_batch``).
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    c = curve(table, "tiny_batch", "train_mode_accuracy", "batch_size")
    ev = curve(table, "tiny_batch", "eval_accuracy", "batch_size")
    ax.axvspan(0.8, min_batch, color="0.9", zorder=0, label=f"lint fires (batch < {min_batch})")
    ax.plot(c["batch_size"], c["mean"], "s-", ms=4, color="C3", label="train mode (batch statistics)")
    ax.fill_between(c["batch_size"], c["ci_low"], c["ci_high"], color="C3", alpha=0.2)
    ax.axhline(float(ev["mean"].mean()), color="C0", ls="--", label="eval mode (running statistics)")
    ax.axhline(1 / n_classes, color="0.4", ls=":", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xticks(c["batch_size"].tolist())
    ax.set_xticklabels([str(int(b)) for b in c["batch_size"]])
    ax.set_xlim(0.8, c["batch_size"].max() * 1.25)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("per-device batch size")
    ax.set_ylabel("accuracy on task A")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def checklist(table: pd.DataFrame, min_batch: int = audit.MIN_BATCH) -> pd.DataFrame:
    """The closing table: per trap, what the audit reported in this run (means over seeds) and the fix."""
    def v(trap, case, q, **sweep):
        return value(table, trap, case, q, **sweep)[0]

    fr = sorted(table["sorted_fraction"].dropna().unique())
    bs = sorted(table["batch_size"].dropna().unique())
    flagged = [p for p in fr if v("sorted_batches", "fraction", "sorted_lint", sorted_fraction=p) > 0.5]
    rows = [
        ("1. model.train() every epoch undoes backbone.eval()",
         f"frozen_bn_in_train_mode on every backbone BN; BN in train mode for "
         f"{v('train_call', 'eval_once', 'bn_train_fraction'):.0%} of calls; running stats moved up to "
         f"{v('train_call', 'eval_once', 'max_buffer_change'):.2f}, num_batches_tracked +"
         f"{v('train_call', 'eval_once', 'num_batches_tracked_change'):.0f}, weights 0; probe logits moved up to "
         f"{v('train_call', 'eval_once', 'max_probe_change'):.2f}",
         "pin_eval(backbone) or freeze_batchnorm(backbone): every buffer and probe logit changed by "
         f"{v('train_call', 'pinned', 'max_probe_change'):.0f}"),
        ("2. no_grad teacher / validation left in train mode",
         f"train_mode_under_no_grad on every BN; {v('no_grad', 'train_mode', 'num_batches_tracked_change'):.0f} "
         f"batches moved running stats up to {v('no_grad', 'train_mode', 'max_buffer_change'):.2f}; the same "
         f"images' logits moved up to {v('no_grad', 'train_mode', 'max_logit_change_by_mates'):.2f} with other "
         "batch mates",
         "eval() before any forward pass without a loss: 0 buffer change, logits bit-identical whatever the "
         "batch mates"),
        ("3. whole model in eval: dropout off, forward changes",
         "forward_changes_with_mode (AuxOutputs in train, Tensor in eval); dropout_off_in_training on head.0; "
         f"auxiliary head moved {v('whole_eval', 'whole_model', 'aux_max_param_change'):.0f} (in the loss in "
         f"{v('whole_eval', 'whole_model', 'aux_loss_fraction'):.0%} of steps)",
         "pin only the frozen part (pin_eval(backbone) or pin_norm_eval): dropout on in "
         f"{v('whole_eval', 'backbone_only', 'dropout_train_fraction'):.0%} of calls, auxiliary loss in "
         f"{v('whole_eval', 'backbone_only', 'aux_loss_fraction'):.0%} of steps"),
        ("4. label-sorted batches",
         f"label_sorted_batches from a one-class share of {min(flagged):.2f} up (label dependence "
         f"{v('sorted_batches', 'fraction', 'label_dependence', sorted_fraction=min(flagged)):.2f}); train-mode "
         f"accuracy {v('sorted_batches', 'fraction', 'train_mode_accuracy', sorted_fraction=fr[0]):.2f} shuffled, "
         f"{v('sorted_batches', 'fraction', 'train_mode_accuracy', sorted_fraction=fr[-1]):.2f} sorted; eval mode "
         f"{v('sorted_batches', 'fraction', 'eval_accuracy', sorted_fraction=fr[-1]):.2f}"
         if flagged else "no loader flagged",
         "shuffle the loader (or sample batches at random from every class)"),
        ("5. batches of 1 and 2",
         f"single_value_per_channel / single_sample_batch at 1, small_batch below {min_batch}; train-mode "
         f"accuracy {v('tiny_batch', 'batch_size', 'train_mode_accuracy', batch_size=bs[0]):.2f} at batch "
         f"{bs[0]:.0f}, eval mode {v('tiny_batch', 'batch_size', 'eval_accuracy', batch_size=bs[0]):.2f}; "
         "last_batch_single for 17 samples at batch size 16",
         "drop_last=True; keep BN in eval (pinned or FrozenBatchNorm) when the per-device batch is small"),
    ]
    return pd.DataFrame(rows, columns=["trap", "what the audit reported (this run)", "fix"])
