"""Lints of a data loader: a last batch of one sample, batches smaller than ``min_batch``, batches whose
composition follows the label (:func:`lint_loader`, :func:`batch_label_dependence`)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import torch

from .._checks import check_bool, check_callable, check_int, check_iterable, check_number, describe
from .codes import MIN_BATCH, Lint, _check_positive_int, _emit, _lint


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
    return _label_dependence("batch_label_dependence", labels_per_batch)


def _label_dependence(fn: str, labels_per_batch: Sequence) -> dict[str, float]:
    """:func:`batch_label_dependence`, its refusals naming ``fn`` (the function the user called)."""
    check_iterable(fn, "labels_per_batch", labels_per_batch,
                   "one epoch's labels, one 1-D integer sequence per batch (a list of tensors or a 2-D tensor)"
                   ) if not isinstance(labels_per_batch, torch.Tensor) else None
    if hasattr(labels_per_batch, "ndim") and labels_per_batch.ndim != 2:
        raise ValueError(f"{fn}: labels_per_batch must hold one sequence of labels per batch (a list of 1-D label "
                         "tensors, or a 2-D (batches, batch_size) tensor), got an array with shape "
                         f"{tuple(labels_per_batch.shape)}")
    ys = []
    for y in labels_per_batch:
        try:
            t = torch.as_tensor(y)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{fn}: labels_per_batch must hold one 1-D integer sequence of labels per batch, got an "
                            f"item {describe(y)}") from None
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{fn}: labels_per_batch must hold 1-D integer class labels per batch (not one-hot, not "
                             f"floats), got a batch of dtype {t.dtype} and shape {tuple(t.shape)}")
        ys.append(t.long())
    ys = [y for y in ys if y.numel()]
    if not ys:
        raise ValueError(f"{fn}: labels_per_batch must hold at least one non-empty batch of labels, got "
                         f"{describe(labels_per_batch)} with none")
    all_y = torch.cat(ys)
    if int(all_y.min()) < 0:
        raise ValueError(f"{fn}: labels_per_batch must hold non-negative integer labels, got a label "
                         f"{int(all_y.min())}")
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




def _loader_labels(loader, label_fn: Callable | None, where: str = "lint_loader") -> list:
    def default(batch):
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            return batch[1]
        if isinstance(batch, dict):
            for k in ("label", "labels", "y", "target", "targets"):
                if k in batch:
                    return batch[k]
        raise TypeError(f"{where}: label_fn is needed: cannot find labels in a batch of the DataLoader (need (x, y) "
                        "pairs or a dict with 'label'/'labels'/'y'/'target'/'targets'), got a batch "
                        f"{describe(batch)}; pass label_fn= (one batch -> its labels)")
    fn = label_fn or default
    return [torch.as_tensor(fn(b)).reshape(-1) for b in loader]


def lint_loader(dataset_len: Any, batch_size: int | None = None, drop_last: bool = False,
                labels_per_batch: Sequence | None = None, min_batch: int = MIN_BATCH,
                max_dependence: float = 0.05, warn: bool = True, *, scan_labels: bool = False,
                label_fn: Callable | None = None) -> list[Lint]:
    """Lints for a data loader's batches, before any BatchNorm sees them; layer name ``"loader"``.

    Pass a ``torch.utils.data.DataLoader`` as the first argument (its dataset
    length, ``batch_size`` and ``drop_last`` are read from it; with
    ``scan_labels=True`` one epoch is iterated to collect its labels, taken by
    ``label_fn(batch)``, default the second element of a tuple or the
    ``label``/``labels``/``y``/``target`` entry of a dict), or the numbers
    themselves: ``dataset_len`` (None: unknown) and ``batch_size`` (per device)
    with ``drop_last``.

    Gives ``last_batch_single`` when ``dataset_len % batch_size == 1`` (a
    train-mode BatchNorm1d on ``(N, C)`` input then raises at the end of every
    epoch) and ``small_last_batch`` (information) for a remainder below
    ``min_batch``. ``labels_per_batch`` (one epoch's labels, one sequence per
    batch) gives ``label_sorted_batches`` when :func:`batch_label_dependence`
    exceeds ``max_dependence`` with ``p_value < 1e-3``. Returns the lints and
    warns the ``warning`` ones. Raises ``ValueError`` naming the argument for a
    non-positive ``batch_size``/``min_batch``/``dataset_len``, a missing
    ``batch_size``, or ``max_dependence`` outside [0, 1]; ``TypeError`` naming
    an argument of the wrong type (a first argument that is neither a
    DataLoader nor a length, such as a list of batches or a model).
    """
    fn = "lint_loader"
    check_bool(fn, "drop_last", drop_last)
    check_bool(fn, "warn", warn)
    check_bool(fn, "scan_labels", scan_labels)
    check_callable(fn, "label_fn", label_fn, "a function from one batch to its labels")
    check_number(fn, "max_dependence", max_dependence, minimum=0.0, maximum=1.0)
    check_int(fn, "batch_size", batch_size, allow_none=True)
    _check_positive_int("min_batch", min_batch, fn)
    if not isinstance(dataset_len, (torch.utils.data.DataLoader, numbers.Integral, type(None))) or isinstance(
            dataset_len, bool):
        raise TypeError(f"{fn}: dataset_len (the first argument) must be a torch DataLoader, or the dataset's length "
                        f"(a positive integer; None: unknown) with batch_size=, got {describe(dataset_len)}"
                        + ("; for a list of batches, wrap the data in a DataLoader" if isinstance(
                            dataset_len, (list, tuple)) else ""))
    if isinstance(dataset_len, torch.utils.data.DataLoader):
        loader = dataset_len
        bs = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
        batch_size = bs if batch_size is None else batch_size
        drop_last = loader.drop_last or bool(getattr(loader.batch_sampler, "drop_last", False))
        try:
            dataset_len = len(loader.dataset)
        except TypeError:
            dataset_len = None
        if scan_labels and labels_per_batch is None:
            labels_per_batch = _loader_labels(loader, label_fn)
    elif scan_labels:
        raise ValueError(f"{fn}: scan_labels=True needs a DataLoader as the first argument (dataset_len), got "
                         f"{describe(dataset_len)}")
    if batch_size is None:
        given = ("a DataLoader without a batch_size (a batch_sampler of varying batches?)"
                 if isinstance(dataset_len, torch.utils.data.DataLoader) else f"dataset_len={dataset_len!r}")
        raise ValueError(f"{fn}: batch_size is required with {given}: pass batch_size= (a positive integer, per "
                         "device), or a DataLoader with a batch_size as the first argument")
    _check_positive_int("batch_size", batch_size, fn)
    if dataset_len is not None:
        _check_positive_int("dataset_len", dataset_len, fn)
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
        dep = _label_dependence(fn, labels_per_batch)
        if dep["dependence"] > max_dependence and dep["p_value"] < 1e-3:
            lints.append(_lint("label_sorted_batches", "loader",
                               f"batch composition depends on the label (dependence {dep['dependence']:.2f} on a 0 "
                               f"(random) to 1 (class-sorted) scale, chi2 = {dep['chi2']:.0f} on {dep['df']:.0f} df): "
                               "the batch mean carries the label; shuffle the loader"))
    _emit(lints, warn)
    return lints
