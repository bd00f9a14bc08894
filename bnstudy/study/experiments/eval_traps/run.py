"""Chapter 2, what is trained: the everyday calls that undo a freeze, each run inside a
:class:`bnstudy.audit.FreezeAudit` (or checked by a :mod:`bnstudy.audit` lint) on a small conv network trained on
task A (stage 1 of the engine, cached), then fixed. One run per (seed, trap, case) (:class:`TrapRun`):

1. ``train_call``: ``model.train()`` every epoch undoes the backbone's ``eval()``; fixed by ``pin_eval``
   (``train_call_tuned``: the drifting head at each rate of ``t1_lrs``).
2. ``no_grad``: a teacher in train mode under ``torch.no_grad()`` still overwrites its running statistics.
3. ``whole_eval``: the whole model in eval mode turns dropout off and changes what ``forward`` returns; fixed by
   pinning only the backbone (``whole_eval_tuned``: both at every rate of ``t3_lrs``; ``dropout_mechanism``: the
   fix at other dropout rates, on raw or standardized features).
4. ``sorted_batches``: batches whose composition follows the label.
5. ``tiny_batch``: train-mode BatchNorm against the per-device batch size (``batch_training``: training further at
   small batches, on batch statistics or pinned).
6. ``sorted_training``: a network trained on class-sorted batches against one trained on shuffled batches.

"Train mode" in prose means a module's train/eval flag (``module_mode``), never chapter 1's freeze mode.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections import OrderedDict, namedtuple
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .... import audit

from ...config import Execution, SourceConfig, check_choice, check_float, check_int, check_seeds, \
    from_profile
from ...design import REQUIRED, ChapterConfig, Parameters, Rule
from ...engine import accuracy, ensure_sources, load_source, logits_of, make_optimizer, seeded, source_version, \
    train_step
from ....freeze import pin_eval
from ...models import Classifier, ConvBackbone, make_head
from ...modes import TransferModel
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, derive_seed, eval_set, generator, make_task

NAMESPACE = "ch02_eval_traps"
#: Parameters that only change the analysis: none (a page given ``rows`` is given every parameter as that run had it).
ANALYSIS_PARAMETERS = ()
#: Parameters added after the release's rows were computed, with the value those rows had (docs/chapter-code.md).
READ_DEFAULTS: dict = {}
#: The tables :func:`run_tables` saves beside ``02_eval_traps.csv`` (``02_eval_traps_<suffix>.csv``).
SIBLING_TABLES = ("threads", "audits", "single_layer")
#: The first seed's printed audits ``(trap, case, lint codes printed above the audit)``.
PRINTED_AUDITS = (("train_call", "eval_once", ()), ("no_grad", "teacher_train", ()),
                  ("whole_eval", "whole_model", ("forward_changes_with_mode", "dropout_present")))
PROFILES = {"quick": dict(seeds=3, thread_seeds=1, t3_std_lrs=(0.01, 0.02, 0.05)),
            "full": dict(seeds=10, thread_seeds=2, t3_std_lrs=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2))}
TRAPS = ("train_call", "no_grad", "whole_eval", "sorted_batches", "tiny_batch", "sorted_training",
         "whole_eval_tuned", "train_call_tuned", "batch_training", "dropout_mechanism")
#: Trap 3's setups in the learning-rate sweep, and trap 1's drifting head at tuned rates.
TUNED_SETUPS = ("whole_model", "backbone_only")
DRIFT_SETUP = "drifting"
#: Trap 5's training arm: BatchNorm on batch statistics or pinned, then statistics re-estimated on
#: ``REESTIMATE_BATCHES`` batches with the weights fixed (seed 002's remedy).
BATCH_TRAINING_MODES = ("batch_stats", "pinned")
REESTIMATE_BATCHES = 16
#: The fixed cases (traps 4 and 5 have one case per swept value).
CASES = {"train_call": ("eval_once", "pinned"), "no_grad": ("teacher_train", "teacher_eval"),
         "whole_eval": ("whole_model", "backbone_only", "backbone_only_dropout_off"),
         "sorted_training": ("shuffled", "class_sorted")}
STAGE1_LR = 3e-3
AUX_WEIGHT = 0.4  # the auxiliary head's loss weight (trap 3)
P_DROP = 0.3  # the main head's dropout rate in trap 3's model (AuxHeadNet's default)
#: Trap 3's dropout mechanism: the fix's main head on ``raw`` or standardized (``std``) features.
FEATURE_KINDS = ("raw", "std")
CPU = torch.device("cpu")  # the traps' networks are tiny; the audits and probes live on the CPU


_positive = lambda name: Rule(name, "one or more rates > 0", lambda c: bool(getattr(c, name)) and min(getattr(c, name)) > 0)  # noqa: E731
_at_least = lambda name, k: Rule(name, f"an integer >= {k}", lambda c: getattr(c, name) >= k)  # noqa: E731


class Config(ChapterConfig):
    """Chapter 2's parameters. ``seeds``: an int ``n`` (seeds 0..n-1) or a list; ``n_classes`` to
    ``stage1_batch_size``: stage 1; ``n_eval``: held-out samples per task (also the audit's probe); ``brightness``,
    ``contrast``: task B's shift. Traps 1 and 3 train heads for ``steps`` of ``batch_size`` at ``lr``, calling
    ``model.train()`` every ``epoch_steps``; trap 2 runs ``teacher_batches``; the rate sweeps train ``t3_steps`` at
    each rate of ``t3_lrs``, ``t1_lrs`` and ``t3_std_lrs``, the fix at dropout ``t3_dropout_ps`` (with
    :data:`P_DROP`); traps 4 and 5 sweep ``sorted_fractions``, ``batch_sizes`` and ``t5_train_batch_sizes`` (for
    ``t5_train_steps``); ``min_batch``: the ``small_batch`` lint's threshold; ``thread_seeds``: the first seeds
    :func:`thread_check` reruns. Raises ``ValueError`` naming the parameter."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1, 2), n_classes=10, noise=1.0, widths=(8, 16), momentum=0.1,
                      stage1_steps=200, stage1_batch_size=32, n_eval=512, brightness=4.0, contrast=5.0, steps=60,
                      batch_size=32, epoch_steps=10, lr=0.05, teacher_batches=3,
                      t3_lrs=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05), t3_steps=600,
                      t1_lrs=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), t5_train_batch_sizes=(2, 4, 8, 16, 32),
                      t5_train_steps=100, sorted_fractions=(0.0, 0.25, 0.5, 0.75, 1.0),
                      batch_sizes=(1, 2, 4, 8, 16, 32, 64), min_batch=audit.MIN_BATCH, t3_dropout_ps=(0.1, 0.3, 0.5),
                      t3_std_lrs=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2), thread_seeds=2)

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds}
    RULES = (
        _at_least("n_classes", 2),
        Rule("noise", ">= 0", lambda c: c.noise >= 0),
        Rule("widths", "one or more integers >= 1", lambda c: bool(c.widths) and min(c.widths) >= 1),
        Rule("momentum", "in (0, 1]", lambda c: 0 < c.momentum <= 1),
        *(_at_least(n, 1) for n in ("stage1_steps", "steps", "epoch_steps", "teacher_batches", "min_batch",
                                    "t3_steps", "t5_train_steps")),
        _at_least("stage1_batch_size", 2), _at_least("batch_size", 2),
        Rule("n_eval", "an integer >= 2 * batch_size", lambda c: c.n_eval >= 2 * c.batch_size),
        Rule("contrast", "> 0", lambda c: c.contrast > 0),
        Rule("lr", "> 0", lambda c: c.lr > 0),
        _positive("t3_lrs"), _positive("t1_lrs"), _positive("t3_std_lrs"),
        Rule("sorted_fractions", "one or more shares in [0, 1]",
             lambda c: bool(c.sorted_fractions) and 0 <= min(c.sorted_fractions) <= max(c.sorted_fractions) <= 1),
        Rule("batch_sizes", "one or more integers >= 1", lambda c: bool(c.batch_sizes) and min(c.batch_sizes) >= 1),
        Rule("t5_train_batch_sizes", "one or more integers >= 2",
             lambda c: bool(c.t5_train_batch_sizes) and min(c.t5_train_batch_sizes) >= 2),
        Rule("t3_dropout_ps", f"two or more rates in (0, 0.9], the model's own {P_DROP:g} among them (trap 3's runs "
                              f"are reused for it)", lambda c: len(c.t3_dropout_ps) >= 2 and P_DROP in c.t3_dropout_ps
             and 0 < min(c.t3_dropout_ps) and max(c.t3_dropout_ps) <= 0.9),
        Rule("thread_seeds", "an integer from 0 to the number of seeds",
             lambda c: 0 <= c.thread_seeds <= len(c.seeds)),
    )

    def _fields(self, *drop) -> dict:
        own = ("seed", "trap", "case", "sorted_fraction", "device_batch_size") + drop
        return {f: getattr(self, f) for f in TrapRun.PARAMETERS if f not in own}

    def run_configs(self) -> list["TrapRun"]:
        """One :class:`TrapRun` per (seed, trap, case), seeds outermost, traps in :data:`TRAPS` order; of trap 3's
        dropout mechanism only the standardized fix's rate sweep."""
        shared, base = self._fields(), self._fields("lr", "steps")
        t3 = dict(steps=self.t3_steps, **base)
        cases = {
            **{trap: [dict(case=c, **shared) for c in cs] for trap, cs in CASES.items()},
            "sorted_batches": [dict(case=f"fraction_{p:g}", sorted_fraction=p, **shared) for p in self.sorted_fractions],
            "tiny_batch": [dict(case=f"batch_{b}", device_batch_size=b, **shared) for b in self.batch_sizes],
            "whole_eval_tuned": [dict(case=f"{setup}_lr{lr:g}", lr=lr, **t3) for setup in TUNED_SETUPS
                                 for lr in self.t3_lrs],
            "train_call_tuned": [dict(case=f"{DRIFT_SETUP}_lr{lr:g}", lr=lr, **t3) for lr in self.t1_lrs],
            "batch_training": [dict(case=f"{mode}_b{b}", device_batch_size=b, lr=STAGE1_LR, steps=self.t5_train_steps,
                                    **base) for b in self.t5_train_batch_sizes for mode in BATCH_TRAINING_MODES],
            "dropout_mechanism": [dict(case=dropout_case("std", P_DROP, lr), lr=lr, **t3) for lr in self.t3_std_lrs],
        }
        return [TrapRun(seed=s, trap=trap, **kw) for s in self.seeds for trap in TRAPS for kw in cases[trap]]

    def dropout_configs(self, lr_raw: float, lr_std: float) -> list["TrapRun"]:
        """Trap 3's dropout mechanism at the rates chosen on validation: per seed the raw fix at ``lr_raw`` at every
        p of ``t3_dropout_ps`` but :data:`P_DROP` (that run is ``whole_eval_tuned``'s) and the standardized fix at
        ``lr_std`` at those p and with dropout off (p = 0)."""
        others = [p for p in self.t3_dropout_ps if p != P_DROP]
        return [TrapRun(seed=s, trap="dropout_mechanism", case=dropout_case(kind, p, lr), lr=lr, steps=self.t3_steps,
                        **self._fields("lr", "steps"))
                for s in self.seeds for kind, lr, ps in (("raw", lr_raw, others), ("std", lr_std, others + [0.0]))
                for p in ps]

    def thread_configs(self, rates: dict) -> list["TrapRun"]:
        """The runs whose accuracies traps 1 and 3 cite, for the first ``thread_seeds`` seeds (``rates``:
        :func:`chosen_rates`)."""
        keep = {("train_call", "eval_once"), ("train_call", "pinned"), ("whole_eval", "whole_model"),
                ("whole_eval", "backbone_only"), ("train_call_tuned", f"{DRIFT_SETUP}_lr{rates[DRIFT_SETUP]:g}"),
                ("whole_eval_tuned", f"whole_model_lr{rates['whole_model']:g}"),
                ("whole_eval_tuned", f"backbone_only_lr{rates['backbone_only']:g}")}
        seeds = set(self.seeds[:self.thread_seeds])
        return [c for c in self.run_configs() if c.seed in seeds and (c.trap, c.case) in keep]


class TrapRun(Parameters):
    """One (seed, trap, case): the run cache's key and the first columns of its row (``sorted_fraction``: trap 4
    only, ``device_batch_size``: trap 5 only)."""

    PARAMETERS = dict(seed=REQUIRED, trap=REQUIRED, case=REQUIRED, sorted_fraction=None, device_batch_size=None,
                      n_classes=10, noise=1.0, widths=(8, 16), momentum=0.1, stage1_steps=200, stage1_batch_size=32,
                      n_eval=512, brightness=4.0, contrast=5.0, steps=60, batch_size=32, epoch_steps=10, lr=0.05,
                      teacher_batches=3, min_batch=audit.MIN_BATCH)

    def __post_init__(self):
        check_choice("trap", self.trap, TRAPS)

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, widths=self.widths,
                            norm="batch", momentum=self.momentum, stage1_steps=self.stage1_steps,
                            stage1_lr=STAGE1_LR, stage1_batch_size=self.stage1_batch_size, n_eval=self.n_eval)


def dropout_case(kind: str, p: float, lr: float) -> str:
    """The case name of a ``dropout_mechanism`` run: ``<kind>_p<p>_lr<lr>`` (``kind`` in :data:`FEATURE_KINDS`)."""
    check_choice("kind", kind, FEATURE_KINDS)
    return f"{kind}_p{p:g}_lr{lr:g}"


def parse_dropout_case(case: str) -> tuple[str, float, float]:
    """``(kind, p, lr)`` of a :func:`dropout_case` name; ``ValueError`` naming the case otherwise."""
    m = re.fullmatch(r"([a-z]+)_p([0-9.eE+-]+)_lr([0-9.eE+-]+)", case)
    if m is None or m.group(1) not in FEATURE_KINDS:
        raise ValueError(f"case must look like '<kind>_p<p>_lr<lr>' with kind in {list(FEATURE_KINDS)}, got {case!r}")
    return m.group(1), float(m.group(2)), float(m.group(3))


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``seeds=None``: the profile's)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the models and helpers the traps share ----------------------------------------------------------------------

AuxOutputs = namedtuple("AuxOutputs", "logits aux_logits")


class AuxHeadNet(nn.Module):
    """A backbone, a main head behind dropout and an auxiliary head: ``forward(x)`` returns ``AuxOutputs(logits,
    aux_logits)`` (each ``(B, K)``) in train mode and ``logits`` alone in eval mode, as torchvision's Inception v3."""

    def __init__(self, backbone: nn.Module, n_features: int, n_classes: int, p_drop: float = P_DROP):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(p_drop), nn.Linear(n_features, n_classes))
        self.aux = nn.Linear(n_features, n_classes)

    def forward(self, x: torch.Tensor):
        f = self.backbone(x)
        logits = self.head(f)
        return AuxOutputs(logits, self.aux(f)) if self.training else logits


def aux_loss(out, y: torch.Tensor, aux_weight: float = AUX_WEIGHT) -> torch.Tensor:
    """Cross-entropy of the main logits, plus ``aux_weight`` times the auxiliary one when ``out`` has it (the usual
    loss; with the model in eval mode the auxiliary term silently disappears)."""
    if isinstance(out, AuxOutputs):
        return F.cross_entropy(out.logits, y) + aux_weight * F.cross_entropy(out.aux_logits, y)
    return F.cross_entropy(out, y)


def sorted_fraction_labels(n_batches: int, batch_size: int, n_classes: int, sorted_fraction: float,
                           gen: torch.Generator) -> list[torch.Tensor]:
    """Labels of ``n_batches`` batches where ``round(sorted_fraction * batch_size)`` samples share one class (cycling
    through the classes in a new random order every ``n_classes`` batches), the rest uniform, each batch shuffled: 0
    is a shuffled loader, 1 a class-sorted one. Raises ``ValueError`` for a fraction outside [0, 1] or a size < 1."""
    check_float("sorted_fraction", sorted_fraction, 0.0, 1.0)
    for name, v in (("n_batches", n_batches), ("batch_size", batch_size), ("n_classes", n_classes)):
        check_int(name, v, 1)
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


class _Ctx:
    """Everything one seed's traps share: the cached source and both tasks' fixed held-out sets."""

    def __init__(self, c: TrapRun, source: dict):
        self.c, self.source = c, source
        self.task_a = make_task(c.seed, "A", c.n_classes, c.noise)
        self.task_b = make_task(c.seed, "B", c.n_classes, c.noise, c.brightness, c.contrast)
        self.eval_a = eval_set(self.task_a, c.n_eval, c.seed, "A")
        self.eval_b = eval_set(self.task_b, c.n_eval, c.seed, "B")

    def backbone(self) -> ConvBackbone:
        bb = ConvBackbone(3, self.c.widths, "batch", self.c.momentum)
        bb.load_state_dict(self.source["backbone"])
        return bb

    def head_a(self) -> nn.Module:
        head = make_head("linear", self.c.widths[-1], self.c.n_classes)
        head.load_state_dict(self.source["head_a"])
        return head

    def classifier(self) -> Classifier:
        return Classifier(self.backbone(), self.head_a())

    def seeded(self, tag: str, build):
        return seeded((self.c.seed, "ch02", tag), build)

    def stream_b(self, tag: str) -> BatchStream:
        return BatchStream(self.task_b, self.c.batch_size, generator(self.c.seed, "ch02", "stream", tag))

    def train(self, model: nn.Module, forward, params, tag: str, loss_fn=F.cross_entropy) -> None:
        """The engine's loop (:func:`bnstudy.study.engine.train_step`): ``model.train()`` every epoch, SGD on ``params``."""
        opt = make_optimizer("sgd", params, self.c.lr)
        stream = self.stream_b(tag)
        for step in range(1, self.c.steps + 1):
            x, y = stream.next()
            train_step(model, forward, opt, step, x, y, self.c.epoch_steps, CPU, loss_fn=loss_fn)


def _acc(forward, x: torch.Tensor, y: torch.Tensor) -> float:
    return accuracy(logits_of(forward, x, CPU), y)


@contextlib.contextmanager
def _all_eval(model: nn.Module):
    """Every module of ``model`` in eval mode inside the block (flags restored afterwards, pins untouched)."""
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False
    try:
        yield
    finally:
        for m, flag in saved:
            m.training = flag


def _eval_accuracy(model: nn.Module, forward, x, y) -> float:
    with _all_eval(model):
        return _acc(forward, x, y)


def _buffer_stats(a: audit.FreezeAudit, module_prefix: str) -> dict:
    rep = a.report()
    inside = rep["module"].map(lambda m: not module_prefix or m == module_prefix or m.startswith(module_prefix + "."))
    stats = rep[inside & rep["name"].isin(["running_mean", "running_var"])]
    nbt = rep[inside & (rep["name"] == "num_batches_tracked")]
    params = rep[inside & (rep["kind"] == "param")]
    return dict(max_buffer_change=float(stats["max_abs_change"].max()),
                num_batches_tracked_change=float(nbt["max_abs_change"].max()),
                max_param_change=float(params["max_abs_change"].max()))


def _bn_state(model: nn.Module) -> dict:
    """Copies of every BatchNorm's ``(running_mean, running_var)``, by module name."""
    return {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None}


def _bn_drift(before: dict, model: nn.Module) -> dict:
    """How far each BatchNorm's running statistics moved from ``before`` (:func:`_bn_state`): the largest
    ``|mean_after - mean_before| / sqrt(var_before + eps)`` and the largest ``|ln(var_after / var_before)|``."""
    mods = dict(model.named_modules())
    shift, ratio = [], []
    for name, (mu0, var0) in before.items():
        m = mods[name]
        # rsqrt, not / sqrt: torch's float32 sqrt differs in the last bits between CPUs (bnstudy.study.numerics)
        shift.append(float(((m.running_mean - mu0).abs() * (var0 + m.eps).rsqrt()).max()))
        ratio.append(float((m.running_var.clamp_min(1e-12) / var0.clamp_min(1e-12)).log().abs().max()))
    return dict(max_mean_shift_sd=max(shift), max_abs_log_var_ratio=max(ratio))


def _bn_train_fraction(a: audit.FreezeAudit) -> float:
    modes = a.modes()
    bn = modes[(modes["kind"] == "batchnorm") & (modes["calls"] > 0)]
    return float(bn["train_calls"].sum() / bn["calls"].sum()) if len(bn) else float("nan")


def _n_warnings(lints) -> int:
    return sum(x.severity == "warning" for x in lints)


# --- the five traps: each case returns (quantities, audit or None, lints) --------------------------------------

def _train_call(ctx: _Ctx, case: str):
    """Trap 1: ``backbone.eval()`` once, then ``model.train()`` every epoch, against :func:`pin_eval`."""
    c, (xa, ya) = ctx.c, ctx.eval_a
    head_b = ctx.seeded("head_b", lambda: make_head("linear", c.widths[-1], c.n_classes))
    model = TransferModel(ctx.backbone(), ctx.head_a(), head_b)
    model.backbone.requires_grad_(False)
    model.head_a.requires_grad_(False)
    if case == "eval_once":
        model.backbone.eval()  # the freeze as usually written
    else:
        pin_eval(model.backbone)
    before = _eval_accuracy(model, model.forward_a, xa, ya)
    stats_before = _bn_state(model.backbone)
    losses = []

    def loss_fn(o, y):  # records the head's cross-entropy (nats) at every step
        loss = F.cross_entropy(o, y)
        losses.append(float(loss.detach()))
        return loss

    with audit.FreezeAudit(model, probe=xa, forward=model.forward_a, warn=False) as a:
        ctx.train(model, model.forward_b, model.head_b.parameters(), "train_call", loss_fn)
    q = _buffer_stats(a, "backbone")
    q.update(head_loss_first=float(np.mean(losses[:c.epoch_steps])),
             head_loss_last=float(np.mean(losses[-c.epoch_steps:])))
    q.update(_bn_drift(stats_before, model.backbone))
    q.update(task_a_before=before, task_a_after=_eval_accuracy(model, model.forward_a, xa, ya),
             task_b=_eval_accuracy(model, model.forward_b, *ctx.eval_b),
             max_probe_change=float(a.outputs()["max_abs_change"].max()),
             bn_train_fraction=_bn_train_fraction(a), n_lint_warnings=_n_warnings(a.lints),
             frozen_bn_lint=float(any(x.code == "frozen_bn_in_train_mode" for x in a.lints)))
    return q, a, a.lints


def _batch_mate_logits(model: nn.Module, x_own: torch.Tensor, mates: torch.Tensor, half: int) -> torch.Tensor:
    """Logits of ``x_own`` in chunks of ``half``, each chunk batched with ``half`` rows of ``mates``."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(x_own) - half + 1, half):
            j = (i // half * half) % (len(mates) - half + 1)
            outs.append(model(torch.cat([x_own[i:i + half], mates[j:j + half]]))[:half])
    return torch.cat(outs)


def _no_grad(ctx: _Ctx, case: str):
    """Trap 2: a teacher left in train mode under ``no_grad`` drifts; its outputs depend on the batch mates."""
    c, (xa, ya), xb = ctx.c, ctx.eval_a, ctx.eval_b[0]
    train_flag = case == "teacher_train"
    half = c.batch_size // 2
    n = (len(xa) // 2) // half * half  # own samples; the other half of the set provides task-A batch mates
    teacher = ctx.classifier().train(train_flag)
    before = _eval_accuracy(teacher, teacher, xa, ya)
    stream = ctx.stream_b("teacher")
    stats_before = _bn_state(teacher)
    with audit.FreezeAudit(teacher, probe=xa, warn=False) as a, torch.no_grad():
        for _ in range(c.teacher_batches):
            teacher(stream.next()[0])  # soft targets for task B, or a validation pass
    q = _buffer_stats(a, "")
    q.update(_bn_drift(stats_before, teacher))
    q.update(task_a_before=before, task_a_after=_eval_accuracy(teacher, teacher, xa, ya),
             max_probe_change=float(a.outputs()["max_abs_change"].max()), n_lint_warnings=_n_warnings(a.lints),
             no_grad_lint=float(any(x.code == "train_mode_under_no_grad" for x in a.lints)))
    fresh = ctx.classifier().train(train_flag)  # the same task-A samples, batched with task-A or task-B mates
    with_a = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xa[n:], half)
    with_b = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xb, half)
    q.update(accuracy_with_a_mates=accuracy(with_a, ya[:n]), accuracy_with_b_mates=accuracy(with_b, ya[:n]),
             max_logit_change_by_mates=float((with_a - with_b).abs().max()))
    return q, a, a.lints


def _whole_eval(ctx: _Ctx, case: str):
    """Trap 3: the whole model pinned in eval mode (dropout off, no auxiliary logits) against the backbone only."""
    c, (xb, yb) = ctx.c, ctx.eval_b
    model = ctx.seeded("aux_net", lambda: AuxHeadNet(ctx.backbone(), c.widths[-1], c.n_classes))
    model.backbone.requires_grad_(False)
    forward_lints = audit.lint_forward_modes(model, xb[:c.batch_size], warn=False)
    pin_eval(model if case == "whole_model" else model.backbone)
    if case == "backbone_only_dropout_off":
        pin_eval(model.head[0])  # the fix, with the head's dropout off: isolates dropout's share of the difference
    aux_terms, main_losses = [], []

    def loss_fn(o, y):
        aux_terms.append(isinstance(o, AuxOutputs))
        main_losses.append(float(F.cross_entropy(o.logits if isinstance(o, AuxOutputs) else o, y).detach()))
        return aux_loss(o, y)

    # dropout draws from torch's global generator: seed it per seed so the trap is reproducible on its own
    with audit.FreezeAudit(model, warn=False) as a, torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(c.seed, "ch02", "dropout"))
        ctx.train(model, model, list(model.head.parameters()) + list(model.aux.parameters()), "whole_eval", loss_fn)
    rep, modes = a.report(), a.modes()
    drop = modes[modes["kind"] == "dropout"]
    q = dict(head_max_param_change=float(rep[rep["module"].str.startswith("head")]["max_abs_change"].max()),
             aux_max_param_change=float(rep[rep["module"] == "aux"]["max_abs_change"].max()),
             backbone_max_buffer_change=_buffer_stats(a, "backbone")["max_buffer_change"],
             dropout_train_fraction=float(drop["train_calls"].sum() / drop["calls"].sum()),
             aux_loss_fraction=float(np.mean(aux_terms)),
             main_loss_first=float(np.mean(main_losses[:c.epoch_steps])),
             main_loss_last=float(np.mean(main_losses[-c.epoch_steps:])),
             eval_dropout_off=_dropout_off_at_eval(model, xb),
             task_b_main=_eval_accuracy(model, model, xb, yb),
             task_b_aux=_eval_accuracy(model, lambda x: model.aux(model.backbone(x)), xb, yb),
             forward_mode_lint=float(any(x.code == "forward_changes_with_mode" for x in forward_lints)),
             dropout_lint=float(any(x.code == "dropout_off_in_training" for x in a.lints)),
             n_lint_warnings=_n_warnings(a.lints))
    return q, a, forward_lints + a.lints


def _dropout_off_at_eval(model: AuxHeadNet, x: torch.Tensor) -> float:
    """1.0 if the logits :func:`_eval_accuracy` scores equal, bit for bit, the head without its dropout layer."""
    with _all_eval(model), torch.no_grad():
        scored, plain = model(x), model.head[1](model.backbone(x))
    return float(torch.equal(scored, plain))


class _Standardize(nn.Module):
    """``f -> (f - mean) / sd`` per feature with fixed statistics (chapter 1's ``_feature_standardizer``)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.fn(f)


def _dropout_mechanism(ctx: _Ctx, case: str):
    """Trap 3's fix at head dropout p (``case``: :func:`dropout_case`; p = 0: dropout pinned off), on raw features or
    standardized per feature on task-B images drawn apart; otherwise :func:`_whole_eval_tuned`."""
    kind, p, _ = parse_dropout_case(case)
    return _whole_eval_tuned(ctx, "backbone_only", p_drop=p if p > 0 else P_DROP, dropout_off=p == 0,
                             standardize=kind == "std", extra=dict(kind=kind, p_drop=p))


def _whole_eval_tuned(ctx: _Ctx, case: str, p_drop: float = P_DROP, dropout_off: bool = False,
                      standardize: bool = False, extra: dict | None = None):
    """Trap 3's heads trained without the audit at the run's ``lr`` for ``steps`` steps; same head initialization,
    batches and dropout draws as :func:`_whole_eval`. ``case``: ``<setup>_lr<lr>`` (``drifting``: only the head's
    dropout pinned, the backbone's statistics drift to task B). Records both heads' accuracy on task B's test and
    validation sets, the main head's at half the budget, and its training loss over the first and last epoch."""
    c, (xb, yb) = ctx.c, ctx.eval_b
    setup = case.rsplit("_lr", 1)[0]
    check_choice("setup", setup, TUNED_SETUPS + (DRIFT_SETUP,))
    xv, yv = eval_set(ctx.task_b, c.n_eval, c.seed, "B-validation")
    model = ctx.seeded("aux_net", lambda: AuxHeadNet(ctx.backbone(), c.widths[-1], c.n_classes, p_drop))
    if standardize:  # after the seeded build, so the heads' initialization is the raw runs'
        from ..freeze_modes.run import _feature_standardizer
        xs = eval_set(ctx.task_b, c.n_eval, c.seed, "B-standardize")[0]
        model.backbone.eval()
        model.backbone = nn.Sequential(model.backbone, _Standardize(
            _feature_standardizer(model.backbone, xs, c.batch_size, CPU, torch.contiguous_format)))
    model.backbone.requires_grad_(False)
    if dropout_off:
        pin_eval(model.head[0])
    if setup == DRIFT_SETUP:  # trap 1 at tuned rates: the backbone's BatchNorm follows model.train(); no dropout
        pin_eval(model.head[0])
    else:
        pin_eval(model if setup == "whole_model" else model.backbone)
    opt = make_optimizer("sgd", list(model.head.parameters()) + list(model.aux.parameters()), c.lr)
    stream, losses, half = ctx.stream_b("whole_eval"), [], {}

    def loss_fn(o, y):
        losses.append(float(F.cross_entropy(o.logits if isinstance(o, AuxOutputs) else o, y).detach()))
        return aux_loss(o, y)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(c.seed, "ch02", "dropout"))
        for step in range(1, c.steps + 1):
            x, y = stream.next()
            train_step(model, model, opt, step, x, y, c.epoch_steps, CPU, loss_fn=loss_fn)
            if step == c.steps // 2:
                half = dict(task_b_main_half=_eval_accuracy(model, model, xb, yb),
                            val_main_half=_eval_accuracy(model, model, xv, yv))
    aux = lambda x: model.aux(model.backbone(x))
    q = dict(setup=setup, task_b_main=_eval_accuracy(model, model, xb, yb),
             val_main=_eval_accuracy(model, model, xv, yv),
             task_b_aux=_eval_accuracy(model, aux, xb, yb), val_aux=_eval_accuracy(model, aux, xv, yv),
             main_loss_first=float(np.mean(losses[:c.epoch_steps])),
             main_loss_last=float(np.mean(losses[-c.epoch_steps:])),
             eval_dropout_off=_dropout_off_at_eval(model, xb), **half, **(extra or {}))
    return q, None, []


def _sorted_batches(ctx: _Ctx, case: str):
    """Trap 4: the trained model on batches where a share of each batch has one class: accuracy in eval and in train
    mode, held-out eval accuracy after that pass, the label dependence and whether ``lint_loader`` flags it."""
    c, (xa, ya), p = ctx.c, ctx.eval_a, ctx.c.sorted_fraction
    g = generator(c.seed, "ch02", "sorted", p)
    labels = sorted_fraction_labels(max(c.n_eval // c.batch_size, 2), c.batch_size, c.n_classes, p, g)
    xs = [ctx.task_a.sample(y, g) for y in labels]
    model = ctx.classifier().eval()
    module_eval = _acc(model, torch.cat(xs), torch.cat(labels))
    model.train()
    with torch.no_grad():
        module_train = accuracy(torch.cat([model(x) for x in xs]), torch.cat(labels))
    lints = audit.lint_loader(None, c.batch_size, labels_per_batch=labels, warn=False)
    q = dict(module_eval_accuracy=module_eval, module_train_accuracy=module_train,
             module_eval_accuracy_after_pass=_eval_accuracy(model, model, xa, ya),
             label_dependence=audit.batch_label_dependence(labels)["dependence"],
             sorted_lint=float(any(x.code == "label_sorted_batches" for x in lints)))
    return q, None, lints


def _tiny_batch(ctx: _Ctx, case: str):
    """Trap 5: accuracy of the trained model with BatchNorm in train mode at a per-device batch size."""
    c, (xa, ya), b = ctx.c, ctx.eval_a, ctx.c.device_batch_size
    model = ctx.classifier().eval()
    module_eval = _acc(model, xa, ya)
    model.train()
    n = len(xa) // b * b
    with torch.no_grad():
        logits = torch.cat([model(xa[i:i + b]) for i in range(0, n, b)])
    lints = audit.lint_model(model, batch_size=b, min_batch=c.min_batch, warn=False)
    counts = []  # values per channel each BatchNorm2d averages over: m x H x W (seed article 002's effective count)
    hooks = [m.register_forward_pre_hook(lambda mod, inp: counts.append(inp[0].numel() // inp[0].shape[1]))
             for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        model(xa[:b])
    for h in hooks:
        h.remove()
    q = dict(module_train_accuracy=accuracy(logits, ya[:n]), module_eval_accuracy=module_eval,
             min_values_per_channel=float(min(counts)),
             small_batch_lint=float(bool({x.code for x in lints} & {"small_batch", "single_sample_batch"})))
    return q, None, lints


def _sorted_training(ctx: _Ctx, case: str):
    """Trap 6: stage 1's recipe from scratch on ``case`` batches (shuffled or class-sorted): the loop's accuracy meter
    over the last ``n_classes`` steps, held-out accuracy in eval mode and in train mode on shuffled batches."""
    c, (xa, ya) = ctx.c, ctx.eval_a
    model = ctx.seeded("sorted_training_init", lambda: Classifier(
        ConvBackbone(3, c.widths, "batch", c.momentum), make_head("linear", c.widths[-1], c.n_classes)))
    stream = BatchStream(ctx.task_a, c.stage1_batch_size, generator(c.seed, "ch02", "sorted_training", case), case)
    opt = torch.optim.Adam(model.parameters(), lr=STAGE1_LR, fused=True)  # fused: engine.make_optimizer says why
    model.train()
    hits, seen = 0, 0
    for step in range(c.stage1_steps):
        x, y = stream.next()
        out = model(x)
        if step >= c.stage1_steps - c.n_classes:
            hits, seen = hits + int((out.argmax(-1) == y).sum()), seen + len(y)
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    held_eval = _eval_accuracy(model, model, xa, ya)
    b, n = c.stage1_batch_size, len(xa) // c.stage1_batch_size * c.stage1_batch_size
    model.train()
    with torch.no_grad():
        held_train = accuracy(torch.cat([model(xa[i:i + b]) for i in range(0, n, b)]), ya[:n])
    return dict(train_meter_accuracy=hits / seen, heldout_eval_accuracy=held_eval,
                heldout_batch_stats_accuracy=held_train), None, []


def _batch_training(ctx: _Ctx, case: str):
    """Trap 5's training arm: the source network trained further (every weight, stage 1's optimizer) at
    ``device_batch_size``, BatchNorm on batch statistics or pinned (``case``: ``<mode>_b<m>``). Records held-out
    accuracy as trained and after re-estimating the statistics, and the training loss over the last epoch."""
    from ....running_stats import update_bn_stats

    c, (xa, ya), m = ctx.c, ctx.eval_a, ctx.c.device_batch_size
    mode = case.rsplit("_b", 1)[0]
    check_choice("mode", mode, BATCH_TRAINING_MODES)
    model = ctx.classifier()
    if mode == "pinned":
        pin_eval(model.backbone)  # flags only: every weight stays trainable
    stream = BatchStream(ctx.task_a, m, generator(c.seed, "ch02", "batch_training", m))
    opt = torch.optim.Adam(model.parameters(), lr=c.lr, fused=True)  # fused: engine.make_optimizer says why
    model.train()
    losses = []
    for _ in range(c.steps):
        x, y = stream.next()
        loss = F.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    held = _eval_accuracy(model, model, xa, ya)
    g = generator(c.seed, "ch02", "batch_training", "reestimate")
    batches = [ctx.task_a.sample(torch.randint(c.n_classes, (c.stage1_batch_size,), generator=g), g)
               for _ in range(REESTIMATE_BATCHES)]
    update_bn_stats(model, batches, modules=model)  # every BatchNorm, pinned or not (no warning: asked for)
    return dict(heldout_eval_accuracy=held, heldout_reestimated_accuracy=_eval_accuracy(model, model, xa, ya),
                train_loss_last=float(np.mean(losses[-c.epoch_steps:])), mode=mode), None, []


TRAP_FUNCTIONS = dict(train_call=_train_call, no_grad=_no_grad, whole_eval=_whole_eval,
                      sorted_batches=_sorted_batches, tiny_batch=_tiny_batch, sorted_training=_sorted_training,
                      whole_eval_tuned=_whole_eval_tuned, train_call_tuned=_whole_eval_tuned,
                      batch_training=_batch_training, dropout_mechanism=_dropout_mechanism)


def run_case(c: TrapRun, source: dict):
    """One (seed, trap, case): its row, its audit (traps 1-3; else ``None``) and its lints."""
    q, a, lints = TRAP_FUNCTIONS[c.trap](_Ctx(c, source), c.case)
    row = c.asdict()
    row["widths"] = "-".join(map(str, c.widths))
    row["module_mode"] = {"teacher_train": "train", "teacher_eval": "eval"}.get(c.case, "")
    row["source_task_a_accuracy"] = source["task_a_accuracy"]
    row.update({k: (v if isinstance(v, str) else float(v)) for k, v in q.items()})
    return row, a, lints


def _trap_group(configs: list[TrapRun], cache_root: str, version: str) -> list[dict]:
    sources = {}
    rows = []
    for c in configs:
        if c.source not in sources:
            sources[c.source] = load_source(c.source, cache_root, version)
        rows.append(run_case(c, sources[c.source])[0])
    return rows


def _groups(configs: list[TrapRun]) -> list[list[int]]:
    """One group per (seed, trap); the sweeps, the longest, one group per run so that workers share them."""
    groups: dict = {}
    for i, c in enumerate(configs):
        key = (c.seed, c.trap) + ((c.case,) if c.trap in ("whole_eval_tuned", "train_call_tuned", "batch_training",
                                                          "dropout_mechanism") else ())
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _cache(execution: Execution | None):
    ex = execution or Execution()
    return ex, str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())


def run(config: Config, execution: Execution | None = None, version: str | None = None) -> pd.DataFrame:
    """Chapter 2's results: one row per (seed, trap, case), in :meth:`Config.run_configs` order, then trap 3's
    dropout mechanism at the rates the first pass chose (:func:`chosen_rates`). Columns: the :class:`TrapRun`
    fields, ``module_mode``, the source's held-out accuracy, then each trap's quantities (NaN where a trap has none):
    accuracies as fractions 0..1, changes absolute in the tensor's units. Stage 1 and every case are cached."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs an eval_traps.Config (see make_config), got {type(config).__name__}")
    ex, root = _cache(execution)
    sv = version or source_version()  # stage 1's code version: the runs read the backbones with it
    sweep = lambda configs, desc: run_sweep(configs, _trap_group, namespace=NAMESPACE, cache_dir=root, execution=ex,
                                            groups=_groups(configs), group_kwargs={"cache_root": root, "version": sv},
                                            version=version, desc=desc)
    configs = config.run_configs()
    ensure_sources([c.source for c in configs], ex, sv)
    first = sweep(configs, "chapter 2 traps")
    rates = chosen_rates(first)
    second = sweep(config.dropout_configs(rates["backbone_only"], rates["std"]), "chapter 2 dropout mechanism")
    return pd.concat([first, second], ignore_index=True)


def chosen_rates(df: pd.DataFrame) -> dict:
    """The rates with the main head's best mean validation accuracy over seeds (ties: the smaller): ``whole_model``,
    ``backbone_only``, ``drifting`` and ``std`` (NaN without its rows). Raises ``KeyError`` when a sweep is missing."""
    def best(rows, what):
        if rows.empty:
            raise KeyError(f"no rows of {what}")
        return float(rows.groupby("lr")["val_main"].mean().idxmax())
    tu, dr = df[df["trap"] == "whole_eval_tuned"], df[df["trap"] == "train_call_tuned"]
    out = {setup: best(tu[tu["setup"] == setup], f"setup={setup!r} in trap='whole_eval_tuned'")
           for setup in TUNED_SETUPS}
    out[DRIFT_SETUP] = best(dr, "trap='train_call_tuned'")
    dm = df[df["trap"] == "dropout_mechanism"] if "trap" in df else df.iloc[:0]
    if not dm.empty:
        k = dm["case"].map(parse_dropout_case)
        dm = dm[(k.str[0] == "std") & (k.str[1] == P_DROP)]
    out["std"] = best(dm, "the standardized fix's rate sweep (trap='dropout_mechanism')") if len(dm) else float("nan")
    return out


def thread_check(config: Config, df: pd.DataFrame, execution: Execution | None = None) -> pd.DataFrame:
    """The runs traps 1 and 3 cite (:meth:`Config.thread_configs`) again at the other torch thread count, in their
    own cache folder ``<cache>/threads<n>``, beside ``df``'s: columns ``seed, quantity, threads, accuracy``."""
    ex, root = _cache(execution)
    cols = ["seed", "quantity", "threads", "accuracy"]
    if config.thread_seeds == 0:
        return pd.DataFrame(columns=cols)
    other = 2 if ex.threads == 1 else 1
    configs = config.thread_configs(chosen_rates(df))
    oroot = str(Path(root) / f"threads{other}")
    e, version = ex.replace(threads=other, cache_dir=oroot), source_version()
    ensure_sources([c.source for c in configs], e, version)
    rerun = run_sweep(configs, _trap_group, namespace=NAMESPACE, cache_dir=oroot, execution=e,
                      groups=_groups(configs), group_kwargs={"cache_root": oroot, "version": version},
                      desc=f"chapter 2 thread check ({other} threads)")
    keys = {(c.trap, c.case) for c in configs}
    cited = np.array([(t, c) in keys for t, c in zip(df["trap"], df["case"])], dtype=bool)
    main = df[cited & df["seed"].isin(config.seeds[:config.thread_seeds]).to_numpy()]
    frames = []
    for th, d in ((ex.threads, main), (other, rerun)):
        for q, (trap, case_of, col) in THREAD_QUANTITIES.items():
            sub = d[(d["trap"] == trap) & d["case"].map(case_of)]
            frames.append(pd.DataFrame(dict(seed=sub["seed"].astype(int).values, quantity=q, threads=th,
                                            accuracy=sub[col].astype(float).values)))
    return pd.concat(frames, ignore_index=True)[cols]


#: The accuracies the thread check compares: name -> (trap, which case, column); tuned: the chosen rate's.
THREAD_QUANTITIES = {
    "t1_eval_once": ("train_call", lambda cs: cs == "eval_once", "task_b"),
    "t1_pinned": ("train_call", lambda cs: cs == "pinned", "task_b"),
    "t1_tuned_drifting": ("train_call_tuned", lambda cs: True, "task_b_main"),
    "t3_whole": ("whole_eval", lambda cs: cs == "whole_model", "task_b_main"),
    "t3_fix": ("whole_eval", lambda cs: cs == "backbone_only", "task_b_main"),
    "t3_tuned_whole": ("whole_eval_tuned", lambda cs: cs.startswith("whole_model_lr"), "task_b_main"),
    "t3_tuned_fix": ("whole_eval_tuned", lambda cs: cs.startswith("backbone_only_lr"), "task_b_main"),
}


def first_seed_audit(config: Config, trap: str, case: str, execution: Execution | None = None):
    """``(audit, lints)`` of one case of the first seed, run again from the cached source (trained if missing); the
    audit is ``None`` for traps without one. Raises ``ValueError`` naming the trap's cases for an unknown case."""
    ex, root = _cache(execution)
    first = [r for r in config.run_configs() if r.seed == config.seeds[0] and r.trap == trap]
    c = next((r for r in first if r.case == case), None)
    if c is None:
        raise ValueError(f"no case {case!r} in trap {trap!r}; cases: {[r.case for r in first]}")
    version = source_version()
    ensure_sources([c.source], ex, version)
    _, a, lints = run_case(c, load_source(c.source, root, version))
    return a, lints


def audit_table(config: Config, execution: Execution | None = None, cases=PRINTED_AUDITS) -> pd.DataFrame:
    """The printouts the page shows, one row (``seed, trap, case, printout``) per ``(trap, case, lint_codes)`` of
    ``cases``: the lints whose code is in ``lint_codes``, then the audit (:func:`first_seed_audit`)."""
    from ...sweep import torch_threads

    def text(trap, case, codes):
        a, lints = first_seed_audit(config, trap, case, execution)
        shown = [str(x) for x in lints if x.code in codes]
        return "\n".join(shown + ([""] if shown else []) + [str(a)])

    # the printed heads train here, not in a sweep: at the execution's thread count, as every run does
    with torch_threads((execution or Execution()).threads):
        rows = [dict(seed=int(config.seeds[0]), trap=trap, case=case, printout=text(trap, case, codes))
                for trap, case, codes in cases]
    return pd.DataFrame(rows, columns=["seed", "trap", "case", "printout"])


def printout(table: pd.DataFrame, trap: str, case: str) -> str:
    """The printout of ``(trap, case)`` in :func:`audit_table`'s ``table``; ``KeyError`` naming the cases it has."""
    hit = table[(table["trap"] == trap) & (table["case"] == case)]
    if len(hit) != 1:
        raise KeyError(f"no single printout of trap={trap!r}, case={case!r}; the table has "
                       f"{list(zip(table['trap'], table['case']))}")
    return str(hit["printout"].iloc[0])


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """``(run(config), {name: table})`` for :data:`SIBLING_TABLES`: all a page needs, so that it trains nothing."""
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs an eval_traps.Config (see make_config), got {type(config).__name__}")
    df = run(config, execution)
    return df, dict(threads=thread_check(config, df, execution), audits=audit_table(config, execution),
                    single_layer=single_layer_table(config.seeds[0]))


def rows_table(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`run`'s table as it returns it, also read back from its CSV (where an empty ``module_mode`` is NaN)."""
    return df.assign(module_mode=df["module_mode"].fillna("")) if "module_mode" in df else df


def trap_table(df: pd.DataFrame, trap: str) -> pd.DataFrame:
    """The rows of ``trap`` with only the columns that trap fills (a figure's tidy table)."""
    sub = df[df["trap"] == trap]
    return sub.dropna(axis=1, how="all").reset_index(drop=True)


# --- the one-layer facts ----------------------------------------------------------------------------------------

#: The one-layer facts that are texts (the others are numbers).
SINGLE_LAYER_TEXTS = ("t5_error", "t5_lint1", "t5_loader")


def single_layer_cases(seed: int = 0) -> dict:
    """The one-layer facts traps 4 and 5 quote, on fresh layers seeded from ``seed``: PyTorch's error for a
    train-mode BatchNorm1d on a ``(1, C)`` batch and the audit's first lint there; the largest |per-channel mean| of a
    train-mode BatchNorm2d's output on one image; the largest ||y| - 1| of a BatchNorm1d on two samples; the lint
    code for 17 samples at batch 16; BatchNorm1d(1)'s running mean after one epoch at batch 10 over 10 classes x 100
    values from N(k, 0.5), class-sorted or shuffled, and the data mean."""
    g = torch.Generator().manual_seed(derive_seed(seed, "ch02", "single"))
    # layers initialized from their own seeds, not torch's global generator (seeded differently in every process)
    bn1 = seeded((seed, "ch02", "single", "bn1"),
                 lambda: nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=nn.BatchNorm1d(4))).train())
    error = ""
    with audit.FreezeAudit(bn1, warn=False) as a:
        try:
            bn1(torch.randn(1, 4, generator=g))
        except ValueError as e:
            error = f"ValueError: {e}"
    bn2 = seeded((seed, "ch02", "single", "bn2"),
                 lambda: nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), norm=nn.BatchNorm2d(4))).train())
    y2 = bn2(torch.randn(1, 3, 8, 8, generator=g) * 3 + 1)
    y = nn.BatchNorm1d(4, affine=False).train()(torch.randn(2, 4, generator=g) * 5 + 3)
    ys = torch.arange(10).repeat_interleave(100)
    x = (ys.float() + 0.5 * torch.randn(1000, generator=g)).unsqueeze(1)
    rm = {}
    for name, order in (("sorted", torch.arange(1000)), ("shuffled", torch.randperm(1000, generator=g))):
        bn = nn.BatchNorm1d(1).train()
        for i in range(0, 1000, 10):
            bn(x[order[i:i + 10]])
        rm[name] = float(bn.running_mean)
    return dict(t5_error=error, t5_lint1=str(a.lints[0]).split(" normalises")[0] if a.lints else "",
                t5_bn2d_mean=float(y2.detach().mean((0, 2, 3)).abs().max()),
                t5_dev2=float((y.detach().abs() - 1).abs().max()),
                t5_loader=str(audit.lint_loader(17, 16, warn=False)[0]).split(":")[0],
                t4_sorted_rm=rm["sorted"], t4_shuffled_rm=rm["shuffled"], t4_data_mean=float(x.mean()))


def single_layer_table(seed: int = 0) -> pd.DataFrame:
    """:func:`single_layer_cases` of ``seed`` as a one-row table to save: ``seed`` and one column per fact."""
    return pd.DataFrame([dict(seed=int(seed), **single_layer_cases(seed))])


def single_layer_from_table(table: pd.DataFrame) -> dict:
    """:func:`single_layer_cases`' facts from :func:`single_layer_table`'s table, also as read back from its CSV.
    Raises ``ValueError`` unless the table has exactly one row."""
    if len(table) != 1:
        raise ValueError(f"single_layer_from_table needs single_layer_table's one row, got {len(table)} rows")
    r = table.iloc[0].drop("seed")
    return {k: ("" if pd.isna(v) else str(v)) if k in SINGLE_LAYER_TEXTS else float(v) for k, v in r.items()}
