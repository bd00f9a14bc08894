"""Running-statistics tools: population statistics (precise BN), AdaBN re-estimation, comparisons.

:func:`update_bn_stats` follows fvcore's ``update_bn_stats``
(``fvcore/nn/precise_bn.py``, after Wu & Johnson, 2021, "Rethinking 'Batch' in
BatchNorm"): instead of an exponential moving average with ``momentum``, it
averages the batch statistics of many forward passes with equal weight
(PyTorch's ``momentum=None`` cumulative average) and writes the result into the
model. With ``n`` batches the estimate's noise falls like ``1/n`` in variance,
where the moving average's stays at about ``momentum / (2 - momentum)`` of one
batch's. Run on batches of a new domain it is AdaBN (Li et al., 2016).

Which variance is stored: torch's BatchNorm writes each batch's *unbiased*
(Bessel-corrected, divisor ``n - 1`` over the ``n`` values per channel) variance
into ``running_var`` and normalises with the *biased* one in train mode. The
estimators here keep torch's convention: ``running_var`` is the equal-weight mean
of the per-batch unbiased variances (fvcore's and ``torch.optim.swa_utils.
update_bn``'s result too). It differs from the pooled variance of all values by
the spread of the batch means between batches (that term is missing) and by the
``n / (n - 1)`` factor (that one is added).

Every function that takes ``batches`` accepts what users hold: an iterable of
input tensors, or a ``DataLoader`` yielding tensors, ``(x, y)`` tuples/lists or
dicts; ``input_fn`` (default :func:`batch_input`) turns one batch into the
model's input, as fvcore's ``update_bn_stats`` users pass a preprocessing hook.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .freeze import batchnorm_layers, unpin
from .norms import has_running_stats, is_batch_norm

#: Dict keys :func:`batch_input` looks for, in order, when a batch is a dict.
INPUT_KEYS = ("input", "inputs", "x", "image", "images", "img", "pixel_values", "data")


def batch_input(batch: Any) -> Any:
    """The model input inside one batch of a loader: the tensor itself, the first element of a tuple or list
    (``(x, y)`` pairs), or the first of :data:`INPUT_KEYS` present in a dict.

    Raises ``TypeError`` for a dict with none of those keys (naming its keys) or any other type: pass
    ``input_fn=`` to say where the input is.
    """
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch:
        return batch[0]
    if isinstance(batch, dict):
        for k in INPUT_KEYS:
            if k in batch:
                return batch[k]
        raise TypeError(f"a batch is a dict with keys {list(batch)}, none of {list(INPUT_KEYS)}; pass "
                        "input_fn=lambda batch: batch[<your key>]")
    raise TypeError(f"cannot find the model input in a batch of type {type(batch).__name__}; pass input_fn= "
                    "(a function from one batch to the model's input)")


def _inputs(batches, input_fn: Callable | None, num_iters: int | None, fn: str):
    if input_fn is None:
        input_fn = batch_input
    if not callable(input_fn):
        raise TypeError(f"{fn}: input_fn must be callable (one batch -> model input), got {type(input_fn).__name__}")
    if num_iters is not None and (not isinstance(num_iters, int) or isinstance(num_iters, bool) or num_iters < 1):
        raise ValueError(f"{fn}: num_iters must be a positive integer or None (every batch), got {num_iters!r}")
    if isinstance(batches, torch.Tensor):
        raise TypeError(f"{fn}: batches must be an iterable of batches (a list of tensors or a DataLoader), got one "
                        "tensor; wrap it: [x]")
    it = iter(batches)
    if num_iters is not None:
        it = itertools.islice(it, num_iters)
    for b in it:
        yield input_fn(b)


_BN_FIELDS = ("momentum", "track_running_stats")


@torch.no_grad()
def update_bn_stats(model: nn.Module, batches: Iterable, num_iters: int | None = None,
                    input_fn: Callable | None = None) -> dict[str, int]:
    """Re-estimate the population statistics of every BatchNorm of ``model`` on ``batches`` and write them in place.

    fvcore's ``update_bn_stats`` contract (precise BN; AdaBN when ``batches``
    come from a new domain):

    * touches only layers that follow torch's BatchNorm rule and hold
      ``running_mean``/``running_var`` buffers (BatchNorm1d/2d/3d,
      SyncBatchNorm, lazy variants once initialised, ``_NormBase`` subclasses),
      whatever their ``track_running_stats`` flag says; InstanceNorm and
      FrozenBatchNorm are left alone;
    * every such layer normalises with batch statistics during the estimate
      (train mode, pinned layers included: their flag is set directly), and
      **every other module is in eval mode**, so Dropout is off and the
      estimate is what the layer sees at inference (with dropout on, a layer
      behind ``Dropout(p)`` would see a variance inflated by about ``1/(1-p)``);
    * each layer's result is the equal-weight mean over its calls of the batch
      mean and the batch's unbiased variance (module docstring), computed by
      torch's own ``momentum=None`` kernel path; ``num_batches_tracked`` ends as
      the number of calls it averages;
    * ``momentum``, ``track_running_stats``, every module's train/eval flag and
      pins are restored; parameters are not touched; runs under
      ``torch.no_grad()`` with the global RNG forked.

    A layer the forward passes never reached keeps its statistics. A layer
    called several times per batch (shared) averages over all its calls.

    ``model``: any ``nn.Module``; it is called as ``model(input_fn(batch))``.
    ``batches``: an iterable of batches (tensors, ``(x, y)`` tuples, dicts,
    e.g. a ``DataLoader``). ``num_iters``: how many batches to use (None: all);
    raises ``ValueError`` if ``batches`` yields fewer (fvcore asserts the same).
    ``input_fn``: one batch -> the model's input (default :func:`batch_input`).

    Returns ``{layer_name: calls}`` for every estimated layer (0: not reached).
    Raises ``ValueError`` if ``model`` has no such layer, ``batches`` is empty
    or too short, or ``num_iters`` is not a positive integer; on any error every
    statistic, flag and momentum is restored before it propagates.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"update_bn_stats: model must be an nn.Module, got {type(model).__name__}")
    bns = {n: m for n, m in model.named_modules() if is_batch_norm(m) and has_running_stats(m)}
    if not bns:
        raise ValueError("update_bn_stats: model has no BatchNorm layer with running_mean/running_var buffers")
    flags = [(m, m.training) for m in model.modules()]
    saved = {}
    for n, m in bns.items():
        nbt = getattr(m, "num_batches_tracked", None)
        saved[n] = dict(momentum=m.momentum, track=m.track_running_stats, mean=m.running_mean.clone(),
                        var=m.running_var.clone(), nbt=None if nbt is None else nbt.clone(), had_nbt=nbt is not None)
    n_batches = 0
    try:
        for m in model.modules():
            m.training = False
        for m in bns.values():
            m.training = True
            m.track_running_stats = True
            if getattr(m, "num_batches_tracked", None) is None:
                m.num_batches_tracked = torch.tensor(0, dtype=torch.long, device=m.running_mean.device)
            m.reset_running_stats()
            m.momentum = None
        with torch.random.fork_rng(devices=[]):
            for x in _inputs(batches, input_fn, num_iters, "update_bn_stats"):
                model(x)
                n_batches += 1
        if n_batches == 0:
            raise ValueError("update_bn_stats: batches is empty")
        if num_iters is not None and n_batches < num_iters:
            raise ValueError(f"update_bn_stats: num_iters={num_iters} but batches yielded only {n_batches}")
        calls = {n: int(m.num_batches_tracked) for n, m in bns.items()}
    except BaseException:
        for n, m in bns.items():
            m.running_mean.copy_(saved[n]["mean"])
            m.running_var.copy_(saved[n]["var"])
            if saved[n]["had_nbt"]:
                m.num_batches_tracked.copy_(saved[n]["nbt"])
        raise
    finally:
        for n, m in bns.items():
            m.momentum, m.track_running_stats = saved[n]["momentum"], saved[n]["track"]
            if not saved[n]["had_nbt"]:
                m.num_batches_tracked = None
        for m, flag in flags:
            m.training = flag
    for n, m in bns.items():
        if calls[n] == 0:  # not reached: keep what it had
            m.running_mean.copy_(saved[n]["mean"])
            m.running_var.copy_(saved[n]["var"])
            if saved[n]["had_nbt"]:
                m.num_batches_tracked.copy_(saved[n]["nbt"])
    return calls


@torch.no_grad()
def precise_bn_statistics(model: nn.Module, batches: Iterable, num_iters: int | None = None,
                          input_fn: Callable | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Population mean and variance at every BatchNorm layer of ``model``, on ``batches``, without touching ``model``.

    :func:`update_bn_stats` on a deep copy (same estimator: dropout off, equal
    weight per batch, ``running_var`` the mean of the per-batch *unbiased*
    variances). Arguments as there.

    Returns ``{layer_name: (running_mean (C,), running_var (C,))}`` for every
    layer the forward passes reached. Raises as :func:`update_bn_stats`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"precise_bn_statistics: model must be an nn.Module, got {type(model).__name__}")
    if not any(is_batch_norm(m) and has_running_stats(m) for m in model.modules()):
        raise ValueError("precise_bn_statistics: model has no BatchNorm layer with running_mean/running_var buffers")
    work = copy.deepcopy(model)
    calls = update_bn_stats(work, batches, num_iters, input_fn)
    mods = dict(work.named_modules())
    return {n: (mods[n].running_mean.clone(), mods[n].running_var.clone()) for n, c in calls.items() if c > 0}


# --- Statistics mismatch: how far stored running statistics are from new data's -------------------------------

#: Distances :func:`statistics_mismatch` can report, per channel.
MISMATCH_MEASURES = ("kl", "mean_shift", "log_var_ratio", "wasserstein")  # the last two: issue 10
#: Which forward pass produces the activations that are compared with the stored statistics.
MISMATCH_PASSES = ("eval", "train")


@torch.no_grad()
def bn_input_statistics(model: nn.Module, batches: Iterable, network_mode: str = "eval",
                        input_fn: Callable | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per-channel mean and variance of what each BatchNorm layer receives over ``batches``.

    A forward pre-hook on every BN layer of a deep copy of ``model`` (``model``
    is not touched) accumulates, in float64, the sum and sum of squares of the
    layer's input over every dimension but the channel (dim 1: ``(N, C)``,
    ``(N, C, L)`` and ``(N, C, H, W)`` inputs all work). The variance is the
    population (biased) variance of all values pooled over the batches.

    ``network_mode="eval"`` runs the copy in eval mode: every BN layer normalises
    with its stored ``running_mean``/``running_var``, so a deeper layer sees
    activations shaped by the stored statistics of the layers before it. This is
    what a frozen, deployed network computes on the new data. ``"train"`` runs it
    in train mode, every layer normalising with its batch's statistics: the
    activations the running statistics drift towards in a train-mode freeze, and
    what AdaBN (Li et al., 2016) re-estimates.

    Returns ``{layer_name: (mean (C,), var (C,))}`` (float64, on the inputs' device)
    for every BN layer with ``track_running_stats=True`` that the forward pass
    reached. ``batches`` and ``input_fn`` as in :func:`update_bn_stats`.
    Raises ``ValueError`` for an unknown ``network_mode``, a model with
    no such BN layer, or empty ``batches``.
    """
    if network_mode not in MISMATCH_PASSES:
        raise ValueError(f"network_mode={network_mode!r} is not allowed; choose one of {list(MISMATCH_PASSES)}")
    work = unpin(copy.deepcopy(model))
    bns = {n: m for n, m in batchnorm_layers(work).items() if has_running_stats(m)}
    if not bns:
        raise ValueError("bn_input_statistics: model has no BatchNorm layer with running statistics")
    sums: dict[str, list] = {}

    def hook_for(name):
        def hook(_module, inputs):
            x = inputs[0].detach().double().transpose(0, 1).reshape(inputs[0].shape[1], -1)  # (C, values)
            acc = sums.setdefault(name, [0, 0.0, 0.0])
            acc[0] += x.shape[1]
            acc[1] = acc[1] + x.sum(1)
            acc[2] = acc[2] + (x * x).sum(1)
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in bns.items()]
    work.train(network_mode == "train")
    n_batches = 0
    try:
        for x in _inputs(batches, input_fn, None, "bn_input_statistics"):
            work(x)
            n_batches += 1
    finally:
        for h in handles:
            h.remove()
    if n_batches == 0:
        raise ValueError("bn_input_statistics: batches is empty")
    out = {}
    for name in bns:
        if name in sums:
            n, s, ss = sums[name]
            mean = s / n
            out[name] = (mean, (ss / n - mean * mean).clamp_min(0.0))
    return out


def gaussian_kl(mean_p: torch.Tensor, var_p: torch.Tensor, mean_q: torch.Tensor, var_q: torch.Tensor) -> torch.Tensor:
    """``KL(N(mean_p, var_p) || N(mean_q, var_q))`` element-wise, in nats.

    ``0.5 * (var_p / var_q + (mean_p - mean_q)**2 / var_q - 1 + log(var_q / var_p))``.
    Zero exactly when both means and variances agree; for equal variances it is
    half the squared mean difference in units of the standard deviation.
    Variances must be positive (add a layer's ``eps`` first).
    """
    return 0.5 * (var_p / var_q + (mean_p - mean_q) ** 2 / var_q - 1.0 + torch.log(var_q / var_p))


def statistics_mismatch(model: nn.Module, batches: Iterable, measure: str = "kl",
                        network_mode: str = "eval", per_channel: bool = False,
                        input_fn: Callable | None = None) -> dict:
    """How far each BN layer's stored running statistics are from new data's, without any training.

    For every BatchNorm layer, compares the stored ``running_mean``/``running_var``
    (the source population statistics) with the mean and variance of the layer's
    input on ``batches`` of the new data (:func:`bn_input_statistics`, in the
    forward pass ``network_mode``; the default ``"eval"`` measures what the
    frozen, deployed network sees). Both variances get the layer's ``eps`` added,
    as the layer itself does when it divides, which also keeps channels that are
    constant finite. Per channel:

    * ``"kl"`` (default): ``KL(N(new) || N(stored))`` in nats
      (:func:`gaussian_kl`), the expected extra negative log-likelihood of the new
      activations under the Gaussian the layer has stored. It sees both a moved
      mean (a brightness shift) and a changed spread (a contrast shift), and for a
      pure mean shift it is ``mean_shift ** 2 / 2``.
    * ``"mean_shift"``: ``|mean_new - running_mean| / sqrt(running_var + eps)``,
      the standardised mean shift. Blind to a change of variance.
    * ``"log_var_ratio"``: ``|log(var_new / running_var)|`` (both with ``eps``). Blind to a moved mean.
    * ``"wasserstein"``: the 2-Wasserstein distance between the two Gaussians in units of the stored
      standard deviation, ``sqrt((mean_new - running_mean)**2 + (sd_new - sd_run)**2) / sd_run``.

    It is the early diagnostic practitioners recommend before fine-tuning or
    deploying a BN network on new data: do its running statistics still
    describe that data? The per-channel Gaussian summary is the one BatchNorm
    itself keeps (Ioffe & Szegedy, 2015); AdaBN (Li et al., 2016) is the remedy
    when they do not.

    ``model``: any module with BN layers (single-replica: for a packed
    :class:`bnstudy.models.ConvBackbone` the channels of all replicas would be
    averaged together unless ``per_channel=True``). ``batches``: an iterable of
    valid inputs of ``model``, e.g. a few ``(B, 3, H, W)`` batches of the new
    data, or a DataLoader of ``(x, y)`` pairs or dicts (``input_fn`` picks the
    input, default :func:`batch_input`); no labels are needed.

    Returns ``{layer_name: value}``: the mean over channels (a float), or with
    ``per_channel=True`` the per-channel values (a float64 tensor ``(C,)``).
    A single number for a whole network is the mean over layers, which is what
    the book's chapter 3 uses.

    Raises ``ValueError`` for an unknown ``measure`` or ``network_mode``, a model
    with no BN layer that tracks running statistics, or empty ``batches``.
    """
    _check_measure(measure)
    return mismatch_from_statistics(model, bn_input_statistics(model, batches, network_mode, input_fn), measure,
                                    per_channel)


def _check_measure(measure: str) -> None:
    if measure not in MISMATCH_MEASURES:
        raise ValueError(f"measure={measure!r} is not allowed; choose one of {list(MISMATCH_MEASURES)}")


def mismatch_from_statistics(model: nn.Module, statistics: dict, measure: str = "kl", per_channel: bool = False) -> dict:
    """:func:`statistics_mismatch` from precomputed :func:`bn_input_statistics` of ``model``.

    Lets one forward pass serve several measures. ``statistics``:
    ``{layer_name: (mean (C,), var (C,))}`` for BN layers of ``model``. Returns and
    raises as :func:`statistics_mismatch`; also raises ``ValueError`` for a layer
    name that is not a BN layer of ``model`` or a shape that does not match it.
    """
    _check_measure(measure)
    layers = batchnorm_layers(model)
    out = {}
    for name, (mean_new, var_new) in statistics.items():
        if name not in layers or layers[name].running_mean is None:
            raise ValueError(f"statistics names {name!r}, which is not a BN layer of model with running statistics")
        m = layers[name]
        if mean_new.shape != m.running_mean.shape or var_new.shape != m.running_var.shape:
            raise ValueError(f"statistics for {name!r} have shape {tuple(mean_new.shape)}, "
                             f"the layer has {tuple(m.running_mean.shape)} channels")
        mean_new, var_new = mean_new.double(), var_new.double()
        mean_s = m.running_mean.detach().double().to(mean_new.device)
        var_s = m.running_var.detach().double().to(mean_new.device) + m.eps
        if measure == "kl":
            d = gaussian_kl(mean_new, var_new + m.eps, mean_s, var_s)
        elif measure == "mean_shift":
            d = (mean_new - mean_s).abs() / var_s.sqrt()
        else:  # issue 10's candidates (mismatch_candidate)
            d = mismatch_candidate(measure, mean_new, var_new + m.eps, mean_s, var_s)
        out[name] = d.cpu() if per_channel else float(d.mean())
    return out


# --- One call: do two models' (or a model's and some data's) norm statistics agree? -----------------------------

_COMPARE_COLUMNS = ["layer", "type", "max_mean_shift", "max_log_var_ratio", "kl", "agrees", "num_batches_tracked",
                    "other_num_batches_tracked"]


def _stats_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if is_batch_norm(m) and has_running_stats(m)}


def _match_names(a: dict, b: dict) -> dict[str, str]:
    """Layer names of ``a`` -> names in ``b``; tolerates one wrapper prefix (``module.``) on either side, as
    ``torch.optim.swa_utils.AveragedModel``, DataParallel and DistributedDataParallel add."""
    for pre_a, pre_b in (("", ""), ("", "module."), ("module.", "")):
        out = {}
        for n in a:
            if pre_a and not n.startswith(pre_a):
                continue
            cand = pre_b + n[len(pre_a):]
            if cand in b:
                out[n] = cand
        if out:
            return out
    return {}


def compare_statistics(model: nn.Module, other: Any, tol: float = 0.1, num_iters: int | None = None,
                       input_fn: Callable | None = None):
    """Do ``model``'s BatchNorm running statistics agree with ``other``'s? One row per layer, naming those that do not.

    ``other`` is either another model (an EMA or SWA copy, a teacher, the same
    network before fine-tuning: layers are matched by qualified name, with or
    without a ``module.`` wrapper prefix) or some batches of data (an iterable
    or DataLoader, read with ``input_fn`` as in :func:`update_bn_stats`): then
    the reference is what the statistics *should* be for ``model``'s current
    weights on that data, the precise-BN estimate (:func:`precise_bn_statistics`,
    ``num_iters`` batches). This catches an EMA copy that averages parameters but
    never copies buffers (its statistics follow old weights), a checkpoint whose
    statistics were not loaded, or statistics from another domain.

    Per layer, with ``m``/``v`` the model's and ``m'``/``v'`` the reference's
    statistics and ``eps`` the layer's: ``max_mean_shift`` = max over channels of
    ``|m - m'| / sqrt(v' + eps)`` (standard deviations of the reference),
    ``max_log_var_ratio`` = max over channels of ``|log((v + eps) / (v' + eps))|``
    (natural log; 0.1 is about a 10% ratio), ``kl`` = mean over channels of
    ``KL(N(m', v' + eps) || N(m, v + eps))`` in nats, and ``agrees`` = both maxima
    at most ``tol``. Data estimates carry sampling noise of order
    ``1/sqrt(values per channel)``: use a few batches and keep ``tol`` above it.

    Returns a pandas DataFrame with columns ``layer``, ``type``,
    ``max_mean_shift``, ``max_log_var_ratio``, ``kl``, ``agrees``,
    ``num_batches_tracked``, ``other_num_batches_tracked`` (None for data), in
    the model's order; ``df[~df.agrees].layer`` names the disagreeing layers.
    Raises ``ValueError`` for a negative ``tol``, a model without BatchNorm
    statistics, models that share no layer name, or layers of different shape.
    """
    import pandas as pd

    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"compare_statistics: tol must be a number >= 0, got {tol!r}")
    mine = _stats_layers(model)
    if not mine:
        raise ValueError("compare_statistics: model has no BatchNorm layer with running statistics")
    if isinstance(other, nn.Module):
        theirs = _stats_layers(other)
        names = _match_names(mine, theirs)
        if not names:
            raise ValueError(f"compare_statistics: model and other share no BatchNorm layer name (model: "
                             f"{list(mine)[:4]}, other: {list(theirs)[:4]})")
        ref = {n: (theirs[o].running_mean, theirs[o].running_var,
                   getattr(theirs[o], "num_batches_tracked", None)) for n, o in names.items()}
    else:
        est = precise_bn_statistics(model, other, num_iters, input_fn)
        ref = {n: (mean, var, None) for n, (mean, var) in est.items()}
    rows = []
    for n, m in mine.items():
        if n not in ref:
            continue
        rm, rv, rnbt = ref[n]
        if rm.shape != m.running_mean.shape:
            raise ValueError(f"compare_statistics: layer {n!r} has {tuple(m.running_mean.shape)} channels in model "
                             f"but {tuple(rm.shape)} in other")
        mean, var = m.running_mean.detach().double().cpu(), m.running_var.detach().double().cpu() + m.eps
        rmean, rvar = rm.detach().double().cpu(), rv.detach().double().cpu() + m.eps
        shift = float(((mean - rmean).abs() / rvar.sqrt()).max())
        ratio = float((var / rvar).log().abs().max())
        nbt = getattr(m, "num_batches_tracked", None)
        rows.append(dict(layer=n, type=type(m).__name__, max_mean_shift=shift, max_log_var_ratio=ratio,
                         kl=float(gaussian_kl(rmean, rvar, mean, var).mean()),
                         agrees=bool(shift <= tol and ratio <= tol),
                         num_batches_tracked=None if nbt is None else int(nbt),
                         other_num_batches_tracked=None if rnbt is None else int(rnbt)))
    return pd.DataFrame(rows, columns=_COMPARE_COLUMNS)


# --- chapter 3 (issue 10): more cheap candidates for the mismatch measure ------------------------------------------

def mismatch_candidate(measure: str, mean_new: torch.Tensor, var_new: torch.Tensor, mean_run: torch.Tensor,
                       var_run: torch.Tensor) -> torch.Tensor:
    """Per-channel value of a candidate measure ``"log_var_ratio"`` or ``"wasserstein"`` (see
    :func:`statistics_mismatch`) from new and stored means and variances ``(C,)`` (variances with ``eps`` added).

    Both are zero exactly when mean and variance agree. Raises ``ValueError`` for another ``measure``.
    """
    if measure == "log_var_ratio":
        return torch.log(var_new / var_run).abs()
    if measure == "wasserstein":
        return torch.sqrt((mean_new - mean_run) ** 2 + (var_new.sqrt() - var_run.sqrt()) ** 2) / var_run.sqrt()
    raise ValueError(f"measure={measure!r} is not a mismatch_candidate; choose 'log_var_ratio' or 'wasserstein'")

# --- chapter 5 (issue 13): BatchNorm replaced by a per-sample norm ------------------------------------------------

#: Norm kinds :func:`replace_norm` can put in a BatchNorm's place.
REPLACE_KINDS = ("group", "layer")


def _replacement(bn: nn.Module, name: str, kind: str, num_groups: int | None) -> nn.Module:
    c = bn.num_features
    if nn.parameter.is_lazy(bn.running_mean if bn.running_mean is not None else bn.weight):
        raise ValueError(f"replace_norm: BatchNorm {name!r} is lazy and uninitialised; run one forward pass first")
    if kind == "layer":
        g = 1
    else:
        g = math.gcd(8, c) if num_groups is None else num_groups
    if c % g:
        raise ValueError(f"replace_norm: num_groups={g} does not divide the {c} channels of {name!r}")
    ref = bn.weight if bn.affine else bn.running_mean
    new = nn.GroupNorm(g, c, eps=bn.eps, affine=bn.affine)
    if ref is not None:
        new = new.to(device=ref.device, dtype=ref.dtype)
    if bn.affine:
        with torch.no_grad():
            new.weight.copy_(bn.weight)
            new.bias.copy_(bn.bias)
        new.weight.requires_grad_(bn.weight.requires_grad)
        new.bias.requires_grad_(bn.bias.requires_grad)
    new.train(bn.training)
    return new


def replace_norm(model: nn.Module, kind: str, num_groups: int | None = None) -> nn.Module:
    """Replace every BatchNorm in ``model`` by a per-sample norm; returns the converted module.

    ``kind="group"``: GroupNorm (Wu & He, 2018) with ``num_groups`` groups (default
    ``gcd(8, C)``, what :func:`bnstudy.models.make_norm2d` builds, so a converted
    backbone has the architecture of one pretrained with ``norm="group"``).
    ``kind="layer"``: GroupNorm with one group, i.e. LayerNorm over every dimension but
    the batch (``(C, H, W)`` for BatchNorm2d inputs, ``(C,)`` for BatchNorm1d on ``(N, C)``,
    ``(C, L)`` on ``(N, C, L)``); torch's ``nn.LayerNorm`` is not used because it normalises
    the *last* dimensions and has no per-channel affine for ``(N, C, L)`` inputs.

    What is carried: the per-channel affine ``weight``/``bias`` (copied, same device,
    dtype and ``requires_grad``), ``eps``, ``affine`` and the train/eval flag. What is
    dropped: ``running_mean``/``running_var``/``num_batches_tracked`` and ``momentum``
    (a per-sample norm has no population statistics). Nothing else is touched: every
    other module is the same object with the same parameters and buffers. Output shapes
    are unchanged (input ``(N, C, *)`` -> ``(N, C, *)``); the function computed is not
    (each sample is now normalised by its own statistics), so a converted network
    must be fine-tuned.

    Works like :func:`bnstudy.freeze.freeze_batchnorm`: recursive and in place; if
    ``model`` itself is a BatchNorm the returned object is its replacement, so use the
    return value. Covers BatchNorm1d/2d/3d, SyncBatchNorm and other ``_BatchNorm``
    subclasses; a layer reached twice becomes one shared replacement. FrozenBatchNorm
    and InstanceNorm are left alone.

    Raises ``ValueError`` for an unknown ``kind``, a ``num_groups`` that does not divide a
    layer's channels (naming the layer), ``num_groups`` given with ``kind="layer"``, or an
    uninitialised lazy layer.
    """
    from .freeze import _convert
    if kind not in REPLACE_KINDS:
        raise ValueError(f"kind={kind!r} is not allowed; choose one of {list(REPLACE_KINDS)}")
    if num_groups is not None:
        if kind == "layer":
            raise ValueError("num_groups is only for kind='group' (kind='layer' is one group)")
        if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1:
            raise ValueError(f"num_groups must be a positive integer or None, got {num_groups!r}")
    return _convert(model, "", {}, lambda m, name: _replacement(m, name, kind, num_groups)
                    if isinstance(m, nn.modules.batchnorm._BatchNorm) else None)
