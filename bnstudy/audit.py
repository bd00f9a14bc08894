"""The freeze audit: what moved, what the model computes now, and which mode each layer ran in.

"Frozen" has to mean more than ``requires_grad=False``. A BatchNorm layer in
train mode overwrites its buffers on every forward pass (``running_mean``,
``running_var``, ``num_batches_tracked``), with or without gradients, and
``model.train()`` at the top of a training loop puts it there. This module
checks a freeze the three ways that catch every failure of that kind:

1. **Every tensor, by name.** :func:`snapshot` copies every parameter and every
   buffer; :func:`diff` reports the largest absolute change of each, with its
   module and kind (``param``/``buffer``).
2. **Outputs on a fixed probe batch.** :func:`probe_outputs` runs the model
   in eval mode (flags restored afterwards) on the same inputs before and after;
   any nonzero change means the freeze leaked.
3. **Each layer's mode at the moment the loss is computed.** Forward hooks
   record, for every normalisation and dropout layer, its train/eval flag,
   whether it normalised with batch, running or per-sample statistics, whether
   it wrote its running statistics, whether gradients were on, and the batch
   size it saw.

:class:`FreezeAudit` does all three around a block of code (a step, an epoch, a
whole stage) and offers a DataFrame report, a text summary and
:meth:`FreezeAudit.assert_frozen`. **Lints** (:class:`Lint`, raised as
:class:`BNLintWarning`) flag known traps by layer name: see :data:`LINT_CODES`.
It works on any ``nn.Module`` and covers BatchNorm1d/2d/3d, SyncBatchNorm and
other ``_BatchNorm`` subclasses, InstanceNorm, FrozenBatchNorm (this package's,
torchvision's, detectron2's), and lists stateless norms (LayerNorm, GroupNorm,
RMSNorm, LocalResponseNorm) as ``per-sample``.
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .freeze import batch_stats_report, is_frozen_batchnorm, is_pinned, statistics_source, updates_running_stats

#: Per-device batch size below which a train-mode BatchNorm gets a ``small_batch`` lint.
#: Why 16: a batch mean of N i.i.d. values misses the population mean by
#: ``sigma / sqrt(N)`` (one standard error), so every sample in the batch is
#: shifted by that much after normalisation; at N = 16 the shift is a quarter
#: of a standard deviation, at N = 4 half of one, and at N = 2 every normalised
#: value is exactly +-1 (up to eps). Chapter 2 measures the train/eval gap this
#: causes as a function of N.
MIN_BATCH = 16

#: Every lint code, with what it flags.
LINT_CODES = {
    "frozen_bn_in_train_mode": "a BatchNorm whose affine is frozen (requires_grad=False) will be in train mode after "
                               "model.train(): it normalises with batch statistics and overwrites its running "
                               "statistics on every forward pass",
    "train_mode_under_no_grad": "a train-mode BatchNorm ran under torch.no_grad(): no gradient, but its running "
                                "statistics were overwritten (a teacher or validation pass left in train mode)",
    "single_value_per_channel": "a train-mode BatchNorm saw one value per channel: PyTorch raises ValueError",
    "single_sample_batch": "a train-mode BatchNorm saw a batch of one sample: it normalises with that sample's own "
                           "statistics (BN2d/3d: over its pixels), and BatchNorm1d on (N, C) input raises",
    "small_batch": f"a train-mode BatchNorm saw a per-device batch below min_batch (default {MIN_BATCH}): its batch "
                   "statistics are noisy estimates and every output depends on the batch mates",
    "batch_dependent_in_eval": "a BatchNorm with track_running_stats=False uses batch statistics even in eval mode: "
                               "its outputs depend on the batch mates at inference, and a batch of one raises",
    "momentum_zero": "momentum=0.0: running_mean/running_var never update (only num_batches_tracked counts); "
                     "momentum=None would be the cumulative average",
    "momentum_cumulative": "momentum=None: running statistics are the cumulative (equal-weight) average of every "
                           "batch since reset_running_stats(), not an exponential moving average (information)",
    "dropout_off_in_training": "a dropout layer next to trainable parameters was in eval mode during a forward pass "
                               "with gradients on: dropout is off while training (model.eval() on the whole model)",
    "forward_changes_with_mode": "the model's forward returns a different structure in train and eval mode (e.g. "
                                 "auxiliary logits or a loss dictionary only in train mode)",
    "dropout_present": "dropout layers that model.eval() switches off (information)",
    "last_batch_single": "len(dataset) % batch_size == 1 without drop_last: the last batch of every epoch has one "
                         "sample",
    "small_last_batch": "without drop_last the last batch of every epoch is smaller than min_batch (information)",
    "label_sorted_batches": "batch composition depends on the label (not a random draw): the batch mean carries the "
                            "label, and train-mode outputs differ from eval-mode outputs",
}
SEVERITIES = ("warning", "info")
_INFO_CODES = {"momentum_cumulative", "dropout_present", "small_last_batch"}


class BNLintWarning(UserWarning):
    """Warning category of every lint from this module; filter it with ``warnings.simplefilter``."""


@dataclass(frozen=True)
class Lint:
    """One finding: ``code`` (a key of :data:`LINT_CODES`), ``layer`` (qualified module name,
    ``""`` for the model itself, ``"loader"`` for data-loader lints), ``message`` and ``severity``
    (``"warning"`` or ``"info"``)."""

    code: str
    layer: str
    message: str
    severity: str = "warning"

    def __str__(self) -> str:
        return f"[{self.code}] {_label(self.layer)}: {self.message}"


def _label(name: str) -> str:
    return name if name else "(model)"


def _lint(code: str, layer: str, message: str) -> Lint:
    return Lint(code, layer, message, "info" if code in _INFO_CODES else "warning")


def _emit(lints: Iterable[Lint], warn: bool, stacklevel: int = 3) -> None:
    if warn:
        for lint in lints:
            if lint.severity == "warning":
                warnings.warn(str(lint), BNLintWarning, stacklevel=stacklevel)


def lints_frame(lints: Sequence[Lint]) -> pd.DataFrame:
    """``lints`` as a DataFrame with columns ``code``, ``layer``, ``severity``, ``message``."""
    return pd.DataFrame([dict(code=x.code, layer=x.layer, severity=x.severity, message=x.message) for x in lints],
                        columns=["code", "layer", "severity", "message"])


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------
# 1. Snapshots and diffs of every parameter and buffer
# ---------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Copies of a model's tensors at one moment.

    ``tensors`` maps each qualified name (``"backbone.blocks.0.norm.running_mean"``)
    to a detached copy; ``kinds`` maps it to ``"param"`` or ``"buffer"``;
    ``modules`` to the qualified name of the module that owns it (``""`` for the
    model itself). A tensor shared by several modules appears once, under its
    first name in ``named_modules()`` order.
    """

    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str]
    modules: dict[str, str]

    def __len__(self) -> int:
        return len(self.tensors)


def snapshot(model: nn.Module, device: str | torch.device | None = "cpu") -> Snapshot:
    """Copy every parameter and buffer of ``model`` (``num_batches_tracked`` included).

    ``device``: where the copies live (``"cpu"`` by default, so a snapshot of
    a GPU model costs host memory, not device memory; ``None`` keeps each on its
    own device). Uninitialised lazy tensors and ``None`` buffers (e.g.
    BatchNorm with ``track_running_stats=False``) are skipped. Raises
    ``ValueError`` if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    tensors, kinds, owners, seen = {}, {}, {}, set()
    for mod_name, m in model.named_modules():
        for kind, store in (("param", m._parameters), ("buffer", m._buffers)):
            for local, t in store.items():
                if t is None or id(t) in seen or nn.parameter.is_lazy(t):
                    continue
                seen.add(id(t))
                name = f"{mod_name}.{local}" if mod_name else local
                copy_ = t.detach()
                copy_ = copy_.to(device, copy=True) if device is not None else copy_.clone()
                tensors[name], kinds[name], owners[name] = copy_, kind, mod_name
    return Snapshot(tensors, kinds, owners)


def _max_abs_change(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |b - a| (0 when equal; NaN in both places counts as equal; inf for NaN against a number)."""
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool:
        return float((a != b).any())
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point() or b.is_floating_point():
        a64, b64 = a.double(), b.double()
        both_nan = a64.isnan() & b64.isnan()
        d = (b64 - a64).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
        return float(d.max())
    return float((b.long() - a.long()).abs().max())


_DIFF_COLUMNS = ["tensor", "module", "name", "kind", "shape", "max_abs_change", "changed", "status", "before", "after"]


def diff(before: Snapshot, after: Snapshot) -> pd.DataFrame:
    """One row per tensor: how much it moved between two snapshots.

    Columns: ``tensor`` (qualified name), ``module``, ``name`` (local name),
    ``kind`` (``param``/``buffer``), ``shape``, ``max_abs_change`` (largest
    absolute element-wise change, in the tensor's own units; exact, computed in
    float64), ``changed`` (bool), ``status`` (``unchanged``, ``changed``,
    ``added``, ``removed``, ``reshaped``), and ``before``/``after`` for 0-d
    tensors such as ``num_batches_tracked`` (``None`` otherwise). Rows follow
    the model's order. Raises ``ValueError`` if an argument is not a
    :class:`Snapshot`.
    """
    for pname, s in (("before", before), ("after", after)):
        if not isinstance(s, Snapshot):
            raise ValueError(f"{pname} must be a Snapshot (from bnstudy.audit.snapshot), got {type(s).__name__}")
    rows = []
    names = list(before.tensors) + [n for n in after.tensors if n not in before.tensors]
    for n in names:
        a, b = before.tensors.get(n), after.tensors.get(n)
        src = before if a is not None else after
        ref = a if a is not None else b
        row = dict(tensor=n, module=src.modules[n], name=n.rsplit(".", 1)[-1], kind=src.kinds[n],
                   shape=tuple(ref.shape), before=None, after=None)
        if a is None or b is None:
            row.update(max_abs_change=math.nan, changed=True, status="added" if a is None else "removed")
        elif a.shape != b.shape:
            row.update(max_abs_change=math.nan, changed=True, status="reshaped")
        else:
            d = _max_abs_change(a, b.to(a.device))
            row.update(max_abs_change=d, changed=d != 0, status="changed" if d != 0 else "unchanged")
            if a.dim() == 0:
                row.update(before=a.item(), after=b.item())
        rows.append(row)
    df = pd.DataFrame(rows, columns=_DIFF_COLUMNS)
    for col in ("before", "after"):  # keep ints as ints and None as None (not float NaN)
        df[col] = pd.Series([r[col] for r in rows], index=df.index, dtype=object)
    return df


# ---------------------------------------------------------------------------
# 2. Outputs on a fixed probe batch
# ---------------------------------------------------------------------------


def _flatten(out: Any, path: str = "") -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {path: out}
    if isinstance(out, dict):
        res = {}
        for k, v in out.items():
            res.update(_flatten(v, f"{path}[{k!r}]"))
        return res
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        res = {}
        for k in out._fields:
            res.update(_flatten(getattr(out, k), f"{path}.{k}"))
        return res
    if isinstance(out, (tuple, list)):
        res = {}
        for i, v in enumerate(out):
            res.update(_flatten(v, f"{path}[{i}]"))
        return res
    return {}


def output_signature(out: Any) -> str:
    """The structure of a forward's return value without sizes: ``Tensor``, ``dict(logits, aux)``,
    ``AuxOutputs(logits, aux_logits)``, ``tuple(Tensor, Tensor)``..."""
    if isinstance(out, torch.Tensor):
        return "Tensor"
    if isinstance(out, dict):
        return "dict(" + ", ".join(map(str, out)) + ")"
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return f"{type(out).__name__}(" + ", ".join(out._fields) + ")"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__}(" + ", ".join(output_signature(v) for v in out) + ")"
    return type(out).__name__


def _set_all_eval(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False  # direct assignment: bypasses pinned/overridden train() methods
    return saved


def _restore(saved: list[tuple[nn.Module, bool]]) -> None:
    for m, flag in saved:
        m.training = flag


@torch.no_grad()
def probe_outputs(model: nn.Module, probe: Any, forward: Callable | None = None) -> dict[str, torch.Tensor]:
    """The model's outputs on ``probe`` in eval mode, as CPU copies keyed by output path.

    ``forward`` (default ``model``) is called as ``forward(probe)`` (or
    ``forward(*probe)`` when ``probe`` is a tuple) under ``torch.no_grad()``,
    with every module of ``model`` temporarily in eval mode and the global RNG
    state forked, so the probe neither writes running statistics nor shifts a
    training run's random stream; every train/eval flag is restored exactly.
    Paths: ``""`` for a tensor output, ``"['logits']"``, ``"[0]"``, ``".aux_logits"``
    for dicts, sequences and named tuples. Non-tensor leaves are ignored.
    """
    fn = model if forward is None else forward
    saved = _set_all_eval(model)
    try:
        with torch.random.fork_rng(devices=[]):
            out = fn(*probe) if isinstance(probe, tuple) else fn(probe)
    finally:
        _restore(saved)
    return {k: v.detach().to("cpu", copy=True) for k, v in _flatten(out).items()}


def compare_outputs(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> pd.DataFrame:
    """One row per output path: ``output``, ``shape``, ``max_abs_change`` (output units, e.g. logits),
    ``changed``, ``status`` (``unchanged``/``changed``/``added``/``removed``/``reshaped``)."""
    rows = []
    for k in list(before) + [k for k in after if k not in before]:
        a, b = before.get(k), after.get(k)
        ref = a if a is not None else b
        if a is None or b is None:
            rows.append(dict(output=k, shape=tuple(ref.shape), max_abs_change=math.nan, changed=True,
                             status="added" if a is None else "removed"))
        elif a.shape != b.shape:
            rows.append(dict(output=k, shape=tuple(ref.shape), max_abs_change=math.nan, changed=True,
                             status="reshaped"))
        else:
            d = _max_abs_change(a, b)
            rows.append(dict(output=k, shape=tuple(a.shape), max_abs_change=d, changed=d != 0,
                             status="changed" if d != 0 else "unchanged"))
    return pd.DataFrame(rows, columns=["output", "shape", "max_abs_change", "changed", "status"])


# ---------------------------------------------------------------------------
# Lints: static (model, loader, forward) and live (from the audit's hooks)
# ---------------------------------------------------------------------------


def lint_model(model: nn.Module, batch_size: int | None = None, min_batch: int = MIN_BATCH,
               warn: bool = True) -> list[Lint]:
    """Static lints for every BatchNorm of ``model``; returns them and warns the ``warning`` ones.

    Checks each ``_BatchNorm`` layer for ``track_running_stats=False``
    (``batch_dependent_in_eval``), ``momentum=0.0`` (``momentum_zero``),
    ``momentum=None`` (``momentum_cumulative``, information), and, judging
    the mode each layer will be in after the ``model.train()`` every training
    loop calls (measured by :func:`bnstudy.freeze.batch_stats_report`, flags
    restored), a frozen affine in train mode (``frozen_bn_in_train_mode``). With
    ``batch_size`` (the per-device batch), train-mode layers get
    ``single_sample_batch`` at 1 and ``small_batch`` below ``min_batch``.
    Raises ``ValueError`` for a ``batch_size`` or ``min_batch`` that is not a
    positive integer.
    """
    if batch_size is not None:
        _check_positive_int("batch_size", batch_size)
    _check_positive_int("min_batch", min_batch)
    report = batch_stats_report(model).set_index("layer") if any(
        isinstance(m, _BatchNorm) for m in model.modules()) else None
    lints = []
    for name, m in model.named_modules():
        if not isinstance(m, _BatchNorm):
            continue
        kind = type(m).__name__
        if not m.track_running_stats:
            lints.append(_lint("batch_dependent_in_eval", name,
                               f"{kind} has track_running_stats=False: it normalises with batch statistics in eval "
                               "mode too, so a sample's output depends on its batch mates at inference and a batch "
                               "of one value per channel raises"))
        elif m.momentum == 0.0:
            lints.append(_lint("momentum_zero", name,
                               f"{kind} has momentum=0.0: running_mean/running_var never update in train mode (only "
                               "num_batches_tracked counts); use momentum=None for a cumulative average"))
        elif m.momentum is None:
            lints.append(_lint("momentum_cumulative", name,
                               f"{kind} has momentum=None: running statistics are the equal-weight average of the "
                               f"{int(m.num_batches_tracked)} batches since reset_running_stats(); the next batch gets "
                               f"weight 1/{int(m.num_batches_tracked) + 1}"))
        row = report.loc[name]
        frozen_affine = m.affine and not any(p.requires_grad for p in m.parameters(recurse=False))
        if frozen_affine and row["updates_running_stats_after_train"]:
            lints.append(_lint("frozen_bn_in_train_mode", name,
                               f"{kind}'s weight and bias have requires_grad=False, but after model.train() it is "
                               "in train mode: it normalises with batch statistics and overwrites running_mean/"
                               "running_var on every forward pass (pin it: bnstudy.freeze.pin_eval or "
                               "pin_norm_eval, or convert it: freeze_batchnorm)"))
        if batch_size is not None and row["batch_stats_after_train"]:
            lints.extend(_batch_lints(name, m, batch_size, None, min_batch))
    _emit(lints, warn)
    return lints


def _batch_lints(name: str, m: nn.Module, batch: int, values_per_channel: int | None, min_batch: int) -> list[Lint]:
    kind = type(m).__name__
    if values_per_channel == 1:
        return [_lint("single_value_per_channel", name,
                      f"{kind} normalises with batch statistics and saw 1 value per channel (batch of {batch}): "
                      "PyTorch raises ValueError ('Expected more than 1 value per channel when training')")]
    if batch == 1:
        how = ("raises on (N, C) input and, on (N, C, L) input, " if isinstance(m, nn.BatchNorm1d) else "")
        return [_lint("single_sample_batch", name,
                      f"{kind} normalises with batch statistics at a batch of 1: it {how}normalises each channel "
                      "with one sample's own statistics (its output no longer depends on the running statistics "
                      "and is a different function from eval mode)")]
    if batch < min_batch:
        return [_lint("small_batch", name,
                      f"{kind} normalises with batch statistics at a per-device batch of {batch} < {min_batch}: "
                      f"the batch mean misses the population mean by about 1/sqrt({batch}) = "
                      f"{1 / math.sqrt(batch):.2f} standard deviations, shifting every output"
                      + (" (at a batch of 2 every normalised value is +-1)" if batch == 2 else ""))]
    return []


def batch_label_dependence(labels_per_batch: Sequence) -> dict[str, float]:
    """How much a loader's batch composition depends on the label: 0 for random batches, 1 for class-sorted.

    ``labels_per_batch``: one epoch's labels, one 1-D integer sequence (tensor,
    array or list) per batch. Builds the batch x class contingency table and its
    Pearson chi-square statistic, then rescales it between its expectation
    under random batching (``(B-1)(K-1) N/(N-1)``, exact for a random
    permutation of the same labels into batches of the same sizes) and its
    maximum (``N (min(B, K) - 1)``, reached when every batch holds one class
    and B >= K)::

        dependence = (chi2 - E0) / (chi2_max - E0)

    Returns ``dependence``, ``chi2``, ``df`` and ``p_value`` (chi-square
    survival function by the Wilson-Hilferty approximation, fine for the
    decision "is this a random draw?"). With one batch or one class the
    dependence is undefined and reported as NaN. Raises ``ValueError`` for an
    empty input or a label below 0.
    """
    if hasattr(labels_per_batch, "ndim") and labels_per_batch.ndim != 2:
        raise ValueError("labels_per_batch must hold one sequence of labels per batch (a list of 1-D label "
                         "tensors, or a 2-D (batches, batch_size) tensor), got an array with shape "
                         f"{tuple(labels_per_batch.shape)}")
    ys = []
    for y in labels_per_batch:
        t = torch.as_tensor(y)
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError("labels_per_batch must hold 1-D integer class labels per batch (not one-hot, not "
                             f"floats), got a batch of dtype {t.dtype} and shape {tuple(t.shape)}")
        ys.append(t.long())
    ys = [y for y in ys if y.numel()]
    if not ys:
        raise ValueError("labels_per_batch must hold at least one non-empty batch of labels")
    all_y = torch.cat(ys)
    if int(all_y.min()) < 0:
        raise ValueError("labels_per_batch must hold non-negative integer labels")
    classes = torch.unique(all_y)
    n, b, k = all_y.numel(), len(ys), classes.numel()
    if b < 2 or k < 2 or n < 2:
        return dict(dependence=math.nan, chi2=math.nan, df=0.0, p_value=math.nan)
    index = torch.searchsorted(classes, all_y)
    batch_of = torch.repeat_interleave(torch.arange(b), torch.tensor([y.numel() for y in ys]))
    table = torch.zeros(b, k, dtype=torch.float64)
    table.index_put_((batch_of, index), torch.ones(n, dtype=torch.float64), accumulate=True)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / n
    chi2 = float(((table - expected) ** 2 / expected).sum())
    df = (b - 1) * (k - 1)
    e0 = df * n / (n - 1)
    chi2_max = n * (min(b, k) - 1)
    dep = (chi2 - e0) / (chi2_max - e0) if chi2_max > e0 else math.nan
    # Wilson-Hilferty: (chi2/df)^(1/3) is close to normal with mean 1 - 2/(9 df) and variance 2/(9 df).
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return dict(dependence=dep, chi2=chi2, df=float(df), p_value=0.5 * math.erfc(z / math.sqrt(2)))


def lint_loader(dataset_len: int | None, batch_size: int, drop_last: bool = False,
                labels_per_batch: Sequence | None = None, min_batch: int = MIN_BATCH,
                max_dependence: float = 0.05, warn: bool = True) -> list[Lint]:
    """Lints for a data loader's batches, before any BatchNorm sees them; layer name ``"loader"``.

    ``dataset_len`` and ``batch_size`` (per device) with ``drop_last`` give
    ``last_batch_single`` when ``dataset_len % batch_size == 1`` (a train-mode
    BatchNorm1d on ``(N, C)`` input then raises at the end of every epoch) and
    ``small_last_batch`` (information) for a remainder below ``min_batch``.
    ``labels_per_batch`` (one epoch's labels, one sequence per batch) gives
    ``label_sorted_batches`` when :func:`batch_label_dependence` exceeds
    ``max_dependence`` with ``p_value < 1e-3``. Returns the lints and warns
    the ``warning`` ones. Raises ``ValueError`` for a non-positive
    ``batch_size``/``min_batch``/``dataset_len`` or ``max_dependence`` outside
    [0, 1].
    """
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("min_batch", min_batch)
    if dataset_len is not None:
        _check_positive_int("dataset_len", dataset_len)
    if not 0.0 <= max_dependence <= 1.0:
        raise ValueError(f"max_dependence must be in [0, 1], got {max_dependence!r}")
    lints = []
    if dataset_len is not None and not drop_last:
        rem = dataset_len % batch_size
        if rem == 1:
            lints.append(_lint("last_batch_single", "loader",
                               f"len(dataset) = {dataset_len} and batch_size = {batch_size} leave a last batch of 1 "
                               "sample every epoch: a train-mode BatchNorm1d on (N, C) input raises ValueError, and "
                               "BatchNorm2d normalises that image with its own statistics; pass drop_last=True"))
        elif 1 < rem < min_batch:
            lints.append(_lint("small_last_batch", "loader",
                               f"the last batch of every epoch has {rem} samples (< {min_batch}); consider "
                               "drop_last=True"))
    if labels_per_batch is not None:
        dep = batch_label_dependence(labels_per_batch)
        if dep["dependence"] > max_dependence and dep["p_value"] < 1e-3:
            lints.append(_lint("label_sorted_batches", "loader",
                               f"batch composition depends on the label (dependence {dep['dependence']:.2f} on a 0 "
                               f"(random) to 1 (class-sorted) scale, chi2 = {dep['chi2']:.0f} on {dep['df']:.0f} df): "
                               "the batch mean carries the label; shuffle the loader"))
    _emit(lints, warn)
    return lints


def _is_dropout(m: nn.Module) -> bool:
    return isinstance(m, (nn.modules.dropout._DropoutNd,))


def lint_forward_modes(model: nn.Module, example: Any, forward: Callable[[nn.Module, Any], Any] | None = None,
                       warn: bool = True) -> list[Lint]:
    """Run a deep copy of ``model`` once after ``.train()`` and once after ``.eval()`` and compare.

    Lints ``forward_changes_with_mode`` when the return value's structure
    (:func:`output_signature`) differs between the modes (torchvision's
    Inception v3 returns auxiliary logits only in train mode; its detection
    models return a loss dict in train mode), and ``dropout_present``
    (information) naming the dropout layers that ``model.eval()`` turns off.
    ``forward(copy, example)`` overrides the call (default ``copy(example)``).
    ``model`` itself is untouched: the copy's buffers absorb any update, and the
    global RNG state is forked. Costs one copy of the model and two forward
    passes under ``torch.no_grad()``.
    """
    work = copy.deepcopy(model)
    call = forward if forward is not None else (lambda m, x: m(x))
    sigs = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for mode in (True, False):
            work.train(mode)
            sigs[mode] = output_signature(call(work, example))
    lints = []
    if sigs[True] != sigs[False]:
        lints.append(_lint("forward_changes_with_mode", "",
                           f"{type(model).__name__}.forward returns {sigs[True]} after model.train() but "
                           f"{sigs[False]} after model.eval(): a loop that puts the whole model in eval mode "
                           "trains on a different output (a missing term raises, or is silently dropped)"))
    drops = [n for n, m in model.named_modules() if _is_dropout(m) and not is_pinned(m)]
    if drops:
        lints.append(_lint("dropout_present", drops[0] if len(drops) == 1 else "",
                           f"model.eval() turns off dropout in {', '.join(map(_label, drops))}"))
    _emit(lints, warn)
    return lints


# ---------------------------------------------------------------------------
# 3. The audit: snapshots + probe + per-layer modes recorded by forward hooks
# ---------------------------------------------------------------------------


def _layer_kind(m: nn.Module, is_root: bool) -> str | None:
    if isinstance(m, _BatchNorm):
        return "batchnorm"
    if is_frozen_batchnorm(m):
        return "frozen_batchnorm"
    if isinstance(m, nn.modules.instancenorm._InstanceNorm):
        return "instancenorm"
    if statistics_source(m) is not None:
        return "stateless_norm"
    if _is_dropout(m):
        return "dropout"
    return "model" if is_root else None


@dataclass
class _LayerRecord:
    name: str
    module: nn.Module
    kind: str
    calls: int = 0
    train_calls: int = 0
    grad_calls: int = 0
    stats: Counter = field(default_factory=Counter)
    updated_running_stats: bool = False
    min_batch: int | None = None
    min_values_per_channel: int | None = None


class FreezeAudit:
    """Audit a block of code that should leave (part of) a model frozen.

    Use as a context manager around a step, an epoch or a whole stage::

        with FreezeAudit(model, probe=x_old, forward=model.forward_a) as audit:
            ...  # the training loop
        print(audit)                      # text summary
        audit.report()                    # DataFrame: every tensor's max |change|
        audit.modes()                     # DataFrame: each norm/dropout layer's mode during the block
        audit.assert_frozen("backbone")   # AssertionError naming what moved

    On entry it snapshots every parameter and buffer (:func:`snapshot`),
    records ``forward(probe)`` in eval mode (:func:`probe_outputs`; skipped when
    ``probe`` is None), runs :func:`lint_model`, and registers forward hooks on
    every normalisation layer, every dropout layer and the model itself. The
    hooks record, per call, the layer's train/eval flag, its statistics source
    (``batch``/``running``/``per-sample``), whether it wrote its running
    statistics, whether gradients were on, and the batch size (dim 0) and
    values per channel it saw, and raise live lints (``train_mode_under_no_grad``,
    ``single_value_per_channel``, ``single_sample_batch``, ``small_batch``,
    ``dropout_off_in_training``), each at most once per layer, *before* the
    layer runs (so a lint names the layer even when PyTorch then raises). On
    exit (also on an exception, which is not suppressed) it removes the hooks,
    snapshots again and re-runs the probe.

    ``min_batch``: the ``small_batch`` threshold (see :data:`MIN_BATCH`).
    ``warn``: emit the lints as :class:`BNLintWarning` (they are always kept in
    ``.lints``). ``snapshot_device``: where the snapshots live.
    Raises ``ValueError`` if ``model`` is not an ``nn.Module`` or ``min_batch``
    is not a positive integer.
    """

    def __init__(self, model: nn.Module, probe: Any = None, forward: Callable | None = None, *,
                 min_batch: int = MIN_BATCH, warn: bool = True,
                 snapshot_device: str | torch.device | None = "cpu"):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        _check_positive_int("min_batch", min_batch)
        self.model, self.probe, self.forward = model, probe, forward
        self.min_batch, self.warn, self.snapshot_device = min_batch, warn, snapshot_device
        self.lints: list[Lint] = []
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.outputs_before: dict[str, torch.Tensor] | None = None
        self.outputs_after: dict[str, torch.Tensor] | None = None
        self.output_signatures: Counter = Counter()
        self._records: dict[int, _LayerRecord] = {}
        self._handles: list = []
        self._seen_lints: set = set()
        self._parents: dict = {}

    # -- context manager ----------------------------------------------------
    def __enter__(self) -> "FreezeAudit":
        self.before = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self.outputs_before = probe_outputs(self.model, self.probe, self.forward)
        for lint in lint_model(self.model, min_batch=self.min_batch, warn=False):
            self._add_lint(lint, emit=True)
        for name, m in self.model.named_modules():
            kind = _layer_kind(m, m is self.model)
            if kind is None or id(m) in self._records:
                continue
            self._records[id(m)] = _LayerRecord(name, m, kind)
            self._handles.append(m.register_forward_pre_hook(self._pre_hook))
        self._parents = {id(c): m for m in self.model.modules() for c in m.children()}
        self._handles.append(self.model.register_forward_hook(self._root_hook))
        return self

    def __exit__(self, *exc) -> bool:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.after = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self.outputs_after = probe_outputs(self.model, self.probe, self.forward)
        return False

    # -- hooks ----------------------------------------------------------------
    def _pre_hook(self, module: nn.Module, args) -> None:
        rec = self._records[id(module)]
        training, grad = module.training, torch.is_grad_enabled()
        rec.calls += 1
        rec.train_calls += training
        rec.grad_calls += grad
        source = statistics_source(module)
        if source is not None:
            rec.stats[source] += 1
        writes = updates_running_stats(module)
        rec.updated_running_stats |= writes
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is not None and x.dim() >= 1:
            n = int(x.shape[0])
            rec.min_batch = n if rec.min_batch is None else min(rec.min_batch, n)
            if x.dim() >= 2 and x.shape[1] > 0:
                vpc = x.numel() // int(x.shape[1])
                rec.min_values_per_channel = vpc if rec.min_values_per_channel is None else min(
                    rec.min_values_per_channel, vpc)
        if rec.kind == "batchnorm":
            if writes and not grad:
                self._add_lint(_lint("train_mode_under_no_grad", rec.name,
                                     f"{type(module).__name__} ran in train mode under torch.no_grad(): no gradient, "
                                     "but it normalised with batch statistics and overwrote running_mean/running_var "
                                     "(a teacher or validation pass left in train mode?)"), emit=True)
            if source == "batch" and x is not None and x.dim() >= 2:
                for lint in _batch_lints(rec.name, module, int(x.shape[0]), x.numel() // int(x.shape[1]),
                                         self.min_batch):
                    self._add_lint(lint, emit=True)
        elif rec.kind == "dropout" and grad and not training and self._feeds_trainable(module):
            self._add_lint(_lint("dropout_off_in_training", rec.name,
                                 f"{type(module).__name__} was in eval mode during a forward pass with gradients on: "
                                 "dropout is off while training (model.eval() on the whole model?)"), emit=True)

    def _feeds_trainable(self, dropout: nn.Module) -> bool:
        # Dropout switched off inside a frozen block is the point of the freeze; next to trainable
        # parameters (its parent holds some) it means the layers being trained lost their dropout.
        if ("dropout_off_in_training", self._records[id(dropout)].name) in self._seen_lints:
            return False
        parent = self._parents.get(id(dropout), self.model)
        return any(p.requires_grad for p in parent.parameters())

    def _root_hook(self, module: nn.Module, args, output) -> None:
        self.output_signatures[f"{output_signature(output)} ({'train' if module.training else 'eval'} mode)"] += 1

    def _add_lint(self, lint: Lint, emit: bool = False) -> None:
        key = (lint.code, lint.layer)
        if key in self._seen_lints:
            return
        self._seen_lints.add(key)
        self.lints.append(lint)
        _emit([lint], self.warn and emit, stacklevel=5)

    # -- results --------------------------------------------------------------
    def _require_done(self) -> None:
        if self.after is None:
            raise RuntimeError("the audit has no result yet: use it as `with FreezeAudit(model) as audit: ...`")

    def report(self) -> pd.DataFrame:
        """Every parameter and buffer with its largest absolute change (see :func:`diff`)."""
        self._require_done()
        return diff(self.before, self.after)

    def outputs(self) -> pd.DataFrame:
        """The probe's outputs before against after (see :func:`compare_outputs`); empty without a probe."""
        self._require_done()
        if self.outputs_before is None:
            return compare_outputs({}, {})
        return compare_outputs(self.outputs_before, self.outputs_after)

    def modes(self) -> pd.DataFrame:
        """One row per normalisation layer, dropout layer and the model itself, as seen during the block.

        Columns: ``module``, ``type``, ``kind`` (``batchnorm``,
        ``frozen_batchnorm``, ``instancenorm``, ``stateless_norm``, ``dropout``,
        ``model``), ``calls``, ``train_calls``, ``eval_calls``, ``grad_calls``
        (calls with gradients on), ``mode`` (``train``/``eval``/``mixed``/``not
        called``), ``stats`` (statistics sources used, e.g. ``batch``),
        ``updated_running_stats``, ``min_batch`` (smallest dim 0 seen),
        ``min_values_per_channel`` and ``pinned``.
        """
        rows = []
        for rec in self._records.values():
            mode = ("not called" if rec.calls == 0 else "train" if rec.train_calls == rec.calls
                    else "eval" if rec.train_calls == 0 else "mixed")
            rows.append(dict(module=rec.name, type=type(rec.module).__name__, kind=rec.kind, calls=rec.calls,
                             train_calls=rec.train_calls, eval_calls=rec.calls - rec.train_calls,
                             grad_calls=rec.grad_calls, mode=mode, stats=",".join(sorted(rec.stats)),
                             updated_running_stats=rec.updated_running_stats, min_batch=rec.min_batch,
                             min_values_per_channel=rec.min_values_per_channel, pinned=is_pinned(rec.module)))
        return pd.DataFrame(rows, columns=["module", "type", "kind", "calls", "train_calls", "eval_calls",
                                           "grad_calls", "mode", "stats", "updated_running_stats", "min_batch",
                                           "min_values_per_channel", "pinned"])

    def lints_frame(self) -> pd.DataFrame:
        """The audit's lints as a DataFrame (see :func:`lints_frame`)."""
        return lints_frame(self.lints)

    def moved(self, modules: str | Iterable[str] | None = None, tol: float = 0.0) -> pd.DataFrame:
        """The rows of :meth:`report` under ``modules`` whose ``max_abs_change`` exceeds ``tol`` (or that
        appeared, vanished or changed shape). ``modules``: a qualified module name or several (``""`` or
        None: the whole model); raises ``ValueError`` naming an unknown module or a negative ``tol``."""
        self._require_done()
        if not tol >= 0:
            raise ValueError(f"tol must be >= 0, got {tol!r}")
        rep = self.report()
        prefixes = self._prefixes(modules)
        inside = rep["module"].map(lambda m: prefixes is None or any(
            p == "" or m == p or m.startswith(p + ".") for p in prefixes))
        moved = rep["changed"] & (rep["max_abs_change"].isna() | (rep["max_abs_change"] > tol))
        return rep[inside & moved].reset_index(drop=True)

    def _prefixes(self, modules) -> list[str] | None:
        if modules is None:
            return None
        prefixes = [modules] if isinstance(modules, str) else list(modules)
        known = {n for n, _ in self.model.named_modules()}
        for p in prefixes:
            if p not in known:
                raise ValueError(f"modules={p!r} is not a module of the model; choose qualified names such as "
                                 f"{sorted(known - {''})[:5]}")
        return prefixes

    def assert_frozen(self, modules: str | Iterable[str] | None = None, outputs: bool = True,
                      tol: float = 0.0) -> None:
        """Raise ``AssertionError`` naming every tensor under ``modules`` that moved by more than ``tol``.

        ``modules``: qualified module names (None: the whole model). With
        ``outputs=True`` and a probe, a probe output that moved by more than
        ``tol`` is named too. ``tol=0.0`` (the default) demands exact equality,
        which is what a freeze guarantees. Returns None when nothing moved.
        """
        moved = self.moved(modules, tol)
        problems = [f"{r.kind} {r.tensor!r} (max |change| {_fmt_change(r)})" for r in moved.itertuples()]
        if outputs and self.outputs_before is not None:
            out = self.outputs()
            out = out[out["changed"] & (out["max_abs_change"].isna() | (out["max_abs_change"] > tol))]
            problems += [f"probe output {r.output or '(tensor)'!r} (max |change| {r.max_abs_change:.4g})" for r in out.itertuples()]
        if problems:
            where = "the model" if modules is None else f"{modules!r}"
            raise AssertionError(f"{where} is not frozen; moved: " + "; ".join(problems))

    def summary(self) -> str:
        """A plain-text report: what moved, the probe's change, each layer's mode, the lints."""
        self._require_done()
        rep = self.report()
        moved = rep[rep["changed"]]
        lines = [f"FreezeAudit of {type(self.model).__name__}: {len(rep)} tensors "
                 f"({(rep['kind'] == 'param').sum()} parameters, {(rep['kind'] == 'buffer').sum()} buffers)"]
        if moved.empty:
            lines.append("  moved: nothing (every parameter and buffer is bit-identical)")
        else:
            lines.append(f"  moved: {len(moved)} tensors "
                         f"({(moved['kind'] == 'param').sum()} parameters, {(moved['kind'] == 'buffer').sum()} buffers)")
            for r in moved.itertuples():
                lines.append(f"    {r.kind:<6} {r.tensor:<40} max |change| {_fmt_change(r)}")
        if self.outputs_before is not None:
            out = self.outputs()
            worst = out["max_abs_change"].max() if len(out) else 0.0
            lines.append(f"  probe outputs: max |change| {worst:.4g}"
                         + (" (bit-identical)" if not out["changed"].any() else ""))
        modes = self.modes()
        shown = modes[modes["kind"] != "model"]
        if len(shown):
            lines.append("  layers during the block:")
            for r in shown.itertuples():
                detail = f"{r.mode:<10} {r.calls:>4} calls"
                if r.stats:
                    detail += f", {r.stats} stats"
                if r.updated_running_stats:
                    detail += ", WROTE running stats"
                if r.grad_calls < r.calls:
                    detail += f", {r.calls - r.grad_calls} without grad"
                if r.min_batch is not None and not pd.isna(r.min_batch):
                    detail += f", min batch {int(r.min_batch)}"
                if r.pinned:
                    detail += ", pinned"
                lines.append(f"    {r.module:<28} {r.type:<16} {detail}")
        if self.output_signatures:
            lines.append("  forward returned: " + "; ".join(f"{s} x{c}" for s, c in self.output_signatures.items()))
        shown_lints = [x for x in self.lints if x.severity == "warning"]
        lines.append(f"  lints: {len(shown_lints) or 'none'}")
        lines += [f"    {x}" for x in shown_lints]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary() if self.after is not None else f"FreezeAudit({type(self.model).__name__}, not run)"


def _fmt_change(r) -> str:
    if r.before is not None and r.after is not None:
        return f"{r.max_abs_change:.4g} ({r.before} -> {r.after})"
    if isinstance(r.max_abs_change, float) and math.isnan(r.max_abs_change):
        return r.status
    return f"{r.max_abs_change:.4g}"
