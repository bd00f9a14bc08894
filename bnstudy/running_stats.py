"""Running-statistics tools: population statistics (precise BN), AdaBN re-estimation, comparisons.

:func:`update_bn_stats` re-estimates BatchNorm's population statistics the way
precise BN does (Wu & Johnson, 2021, "Rethinking 'Batch' in BatchNorm", section
3; fvcore's ``fvcore/nn/precise_bn.py`` implements it): instead of an
exponential moving average with ``momentum``, it pools the statistics of many
forward passes and writes the result into the model (fvcore's contract). With
``n`` batches the estimate's noise falls like ``1/n`` in variance, where the
moving average's stays at about ``momentum / (2 - momentum)`` of one batch's. Run
on batches of a new domain it is AdaBN (Li et al., 2016).

What is pooled, per channel: every value the layer normalised, each with the
same weight. A batch contributes ``N x spatial`` values (``N`` for ``(N, C)``
input, ``N x L`` for ``(N, C, L)``, ``N x H x W`` for images), so an unequal
last batch of a DataLoader weighs what it holds. The mean is the mean of all
those values; ``running_var`` is their **unbiased** variance (divisor ``M - 1``
over all ``M`` values, torch's convention for ``running_var``), *including*
the spread of the batch means between batches: the statistics of the
concatenated data, which is what Wu & Johnson's population statistics
``E[mu_B]`` and ``E[mu_B^2 + sigma_B^2] - E[mu_B]^2`` are for equal batches.
fvcore (and ``torch.optim.swa_utils.update_bn``) instead give every batch equal
weight and average the per-batch unbiased variances; that is the same estimate
only when every batch has the same size *and* the between-batch spread is
negligible, and with a small last batch it is biased towards that batch (a
900-row and a 10-row batch weigh the same). Chunks are combined exactly in
float64 (Chan et al.'s pairwise update of count, mean and sum of squares), so
the result equals the statistics of the concatenated data up to float rounding.

Every function that takes ``batches`` accepts what users hold: an iterable of
input tensors, or a ``DataLoader`` yielding tensors, ``(x, y)`` tuples/lists or
dicts; ``input_fn`` (default :func:`batch_input`) turns one batch into the
model's input, as fvcore's ``update_bn_stats`` users pass a preprocessing hook,
and ``forward(model, batch)`` replaces the call altogether for a model whose
forward takes several inputs or keywords (``lambda m, b: m(**b)``).
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ._checks import (check_bool, check_callable, check_choice, check_int, check_iterable, check_materialized,
                      check_module, check_number, describe, module_names, user_stacklevel)
from .freeze import _refuse_hooks, batchnorm_layers, is_pinned, _refuse_script_module, unpin
from .norms import (refuse_adapted, compiled_original, computes_standard_eval, has_running_stats, is_batch_norm, keeps_running_stats,
                    mark_precise_estimate)

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
        raise TypeError(f"batch_input: batch is a dict with keys {list(batch)}, none of {list(INPUT_KEYS)}; pass "
                        "input_fn=lambda batch: batch[<your key>]")
    raise TypeError(f"batch_input: cannot find the model input in a batch of type {type(batch).__name__} (batch must "
                    "be a tensor, an (x, y) tuple or list, or a dict); pass input_fn= (a function from one batch to "
                    "the model's input)")


_BATCHES = "an iterable of batches (a list of tensors, (x, y) pairs or dicts, or a DataLoader)"


def _inputs(batches, input_fn: Callable | None, num_iters: int | None, fn: str, forward: Callable | None = None):
    """Check the arguments now (not at the first ``next``) and return a generator of model inputs (of the batches
    themselves when ``forward`` is given: :func:`_run` hands each to it)."""
    check_callable(fn, "input_fn", input_fn, "a function from one batch to the model's input")
    check_callable(fn, "forward", forward, "a function forward(model, batch) that runs the model on one batch")
    if forward is not None and input_fn is not None:
        raise ValueError(f"{fn}: give input_fn (one batch -> the model's input, called as model(input)) or forward "
                         "(forward(model, batch) runs the model itself), not both")
    check_int(fn, "num_iters", num_iters, allow_none=True, what="a positive integer or None (every batch)")
    check_iterable(fn, "batches", batches, _BATCHES)
    if forward is not None:
        it = iter(batches)
        return it if num_iters is None else itertools.islice(it, num_iters)
    return _input_stream(batches, input_fn, num_iters, fn)


def _input_stream(batches, input_fn, num_iters, fn):
    it = iter(batches)
    if num_iters is not None:
        it = itertools.islice(it, num_iters)
    for b in it:
        if input_fn is not None:
            yield input_fn(b)
            continue
        try:
            x = batch_input(b)
        except TypeError as e:
            raise TypeError(f"{fn}: batches must be {_BATCHES}; it yielded a batch it cannot read "
                            f"({describe(b)}): {e}") from None
        yield x


def _as_called(fn: str, inner: str, e: Exception) -> Exception:
    """A refusal of ``inner`` (a public function that ``fn`` calls), re-worded as ``fn``'s: the same exception type,
    ``"inner: "`` at the start of its message replaced by ``"fn: "`` (a failure of the model's forward, which
    :func:`_run` words as ``inner``'s, too). Any other exception is returned as it is."""
    msg = str(e)
    if isinstance(e, (TypeError, ValueError, RuntimeError)) and msg.startswith(f"{inner}: "):
        return type(e)(f"{fn}: {msg[len(inner) + 2:]}")
    return e


def _run(model: nn.Module, item, forward: Callable | None, fn: str = "", index: int = 0):
    """One forward pass: ``forward(model, batch)`` when given, else ``model(input)``.

    A ``TypeError`` or ``RuntimeError`` raised inside it (a forward that takes several inputs, a float batch for a
    double model, a wrong shape) is raised again, of the same type, saying which function and batch it came from and
    how the batch was read, chained to torch's own error. torch's refusal of one value per channel (a
    ``ValueError``) is left as it is: the callers skip that batch."""
    try:
        return model(item) if forward is None else forward(model, item)
    except (TypeError, RuntimeError) as e:
        how = (f"forward(model, batch) on batch {index}" if forward is not None else
               f"model(x) on batch {index}, x = {describe(item)} (read from the batch: a tensor, the first element of "
               f"an (x, y) tuple or list, or a dict's {list(INPUT_KEYS)}; pass input_fn= for another input, or "
               f"forward=lambda model, batch: ... for a model that takes several)")
        try:
            new = type(e)(f"{fn}: the model's forward failed at {how}: {e}")
        except Exception:  # an exception type that cannot be rebuilt from a message: torch's own, unchanged
            raise e from None
        raise new from e


def _rows(item) -> int | None:
    """The number of samples in a model input (the first dimension of its first tensor), or None."""
    if isinstance(item, torch.Tensor):
        return int(item.shape[0]) if item.dim() else None
    values = item.values() if isinstance(item, dict) else item if isinstance(item, (tuple, list)) else ()
    for v in values:
        r = _rows(v)
        if r is not None:
            return r
    return None


_ONE_VALUE = "Expected more than 1 value per channel when training"


class _PooledMoments:
    """Per-channel count, mean and sum of squared deviations of every value a norm layer receives, pooled
    exactly over calls in float64 (Chan, Golub & LeVeque's pairwise update)."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0, None, None

    def __call__(self, module: nn.Module, args) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.numel() == 0:
            return
        v = x.detach().double().transpose(0, 1).reshape(x.shape[1], -1)  # (C, values per channel)
        nb = v.shape[1]
        mean_b = v.mean(1)
        m2_b = ((v - mean_b[:, None]) ** 2).sum(1)
        if self.count == 0:
            self.count, self.mean, self.m2 = nb, mean_b, m2_b
            return
        total = self.count + nb
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (nb / total)
        self.m2 = self.m2 + m2_b + delta * delta * (self.count * nb / total)
        self.count = total

    def unbiased_var(self) -> torch.Tensor:
        return self.m2 / max(self.count - 1, 1)


def _estimated_layers(model: nn.Module, modules, fn: str) -> dict[str, nn.Module]:
    bns = {n: m for n, m in model.named_modules() if is_batch_norm(m) and has_running_stats(m)}
    if not bns:
        others = [n or "(model)" for n, m in model.named_modules() if keeps_running_stats(m)]
        why = (f"; its layers {others[:4]} keep running statistics but are InstanceNorm, a per-sample norm that "
               "precise BN does not estimate" if others else "")
        raise ValueError(f"{fn}: model has no BatchNorm layer with running_mean/running_var buffers{why}")
    if modules is None:
        return bns
    prefixes = module_names(fn, "modules", model, modules)
    chosen = {n: m for n, m in bns.items()
              if any(p == "" or n == p or n.startswith(p + ".") for p in prefixes)}
    if not chosen:
        raise ValueError(f"{fn}: modules={prefixes} hold no BatchNorm layer with running statistics; the model's "
                         f"are {list(bns)[:6]}")
    return chosen


def _refuse_nonfinite(estimates: dict, moments: dict, bns: dict) -> None:
    """Raise ValueError naming every layer whose estimate is NaN/inf (in float64, or once cast to its buffer's
    dtype), before anything is written."""
    bad = []
    for n, (mean, var) in estimates.items():
        for stat, t, t64 in (("running_mean", mean, moments[n].mean), ("running_var", var,
                                                                         moments[n].unbiased_var())):
            k = int((~torch.isfinite(t)).sum())
            if k:
                why = ("the inputs it received hold inf or NaN" if not bool(torch.isfinite(t64).all()) else
                       f"the estimate overflows {str(t.dtype).removeprefix('torch.')} (largest "
                       f"{torch.finfo(t.dtype).max:.6g}); keep norm buffers in float32")
                bad.append(f"{n or '(model)'} {stat}: {k} of {t.numel()} channels non-finite ({why})")
    if bad:
        raise ValueError("update_bn_stats: refusing to write non-finite running statistics (they would stay "
                         "NaN/inf for good); nothing was written and every statistic is restored: "
                         + "; ".join(bad) + ". Remove the batches with inf/NaN values (an fp16 overflow upstream) "
                         "or estimate in float32")


@torch.no_grad()
def update_bn_stats(model: nn.Module, batches: Iterable, num_iters: int | None = None,
                    input_fn: Callable | None = None, modules: str | nn.Module | Iterable | None = None, *,
                    forward: Callable | None = None) -> dict[str, int]:
    """Re-estimate the population statistics of the BatchNorm layers of ``model`` on ``batches`` and write them in place.

    fvcore's ``update_bn_stats`` contract (precise BN; AdaBN when ``batches``
    come from a new domain), with each value weighted equally (module docstring):

    * touches only layers that follow torch's BatchNorm rule and hold
      ``running_mean``/``running_var`` buffers (BatchNorm1d/2d/3d,
      SyncBatchNorm, lazy variants once initialised, ``_NormBase`` subclasses),
      whatever their ``track_running_stats`` flag says; InstanceNorm and
      FrozenBatchNorm are left alone; with ``modules`` only those inside the
      named modules;
    * every estimated layer normalises with batch statistics during the
      estimate (train mode, pinned layers included: their flag is set directly),
      and **every other module is in eval mode** (an unestimated BatchNorm
      normalises with its stored statistics), so Dropout is off (with dropout
      on, a layer behind ``Dropout(p)`` would see a variance inflated by about
      ``1/(1-p)``). As in fvcore's precise BN (Wu & Johnson 2021), the
      estimated layers run in train mode together, so a later layer's estimate
      is of its input under the earlier layers' *batch* statistics, not the
      population statistics they will use at inference; the two differ more
      at small batches (``compare_statistics`` after the estimate shows by how
      much; estimating the layers one at a time, first to last, with
      ``modules=`` gives each the input it sees at inference);
    * each layer's ``running_mean`` is the mean of every value it received
      over all its calls (each call weighted by its ``N x spatial`` values per
      channel, so an unequal last batch weighs what it holds) and
      ``running_var`` their unbiased variance (divisor ``values - 1``; between-
      batch spread included): the statistics of the concatenated inputs, to
      float rounding. ``num_batches_tracked`` ends as the number of calls;
    * ``momentum``, ``track_running_stats``, every module's train/eval flag and
      pins are restored; parameters are not touched; runs under
      ``torch.no_grad()`` with the global RNG forked.

    A layer the forward passes never reached keeps its statistics. A layer
    called several times per batch (shared) pools all its calls.

    Unusable batches are skipped with a ``RuntimeWarning`` naming each (its
    index counted from 0 and its size): a batch of one sample that a layer
    would receive as one value per channel (``(1, C)`` into a BatchNorm1d:
    torch's train-mode kernel raises "Expected more than 1 value per
    channel", the usual last batch of a DataLoader without ``drop_last``,
    which :func:`bnstudy.lint_loader` lints as ``last_batch_single``), and an
    empty batch. Such a batch contributes nothing to any layer (the layers it
    reached before the refusing one forget it) and is not counted in
    ``num_batches_tracked``; the estimate pools the other batches. A batch of
    one image into a BatchNorm2d holds ``H x W`` values per channel, which
    torch accepts: it is pooled like any other, each value weighted equally.
    When no batch is usable the call raises ``ValueError`` with every
    statistic restored.

    ``model``: any ``nn.Module``; it is called as ``model(input_fn(batch))``,
    or as ``forward(model, batch)`` when ``forward`` is given: the way to
    estimate a model whose forward takes several inputs or keywords
    (``forward=lambda m, b: m(b["ids"], b["mask"])``, ``lambda m, b: m(**b)``);
    give ``input_fn`` or ``forward``, not both (``ValueError``).
    ``batches``: an iterable of batches (tensors, ``(x, y)`` tuples, dicts,
    e.g. a ``DataLoader``). ``num_iters``: how many batches to use (None: all;
    skipped batches count, as they are read); raises ``ValueError`` if
    ``batches`` yields fewer (fvcore asserts the same).
    ``input_fn``: one batch -> the model's input (default :func:`batch_input`).
    ``modules``: which layers to re-estimate: qualified names or module objects
    of ``model`` (one or a list; the BatchNorm layers inside them), or None
    (every layer, fvcore's contract). With None, layers pinned by
    :func:`bnstudy.freeze.pin_eval` are re-estimated too and a ``UserWarning``
    names them (a pinned backbone's statistics are usually meant to stay); pass
    ``modules=["head"]`` to leave them, or ``modules=model`` to re-estimate
    everything without the warning.

    Returns ``{layer_name: calls}`` for every estimated layer (0: not reached).
    Raises ``TypeError`` naming the argument of a wrong type (``model`` not an
    ``nn.Module``, ``batches`` not an iterable of batches, ``num_iters`` not an
    integer, ``input_fn`` not callable, ``modules`` not names or modules);
    ``ValueError`` if ``model`` has no such layer (or ``modules`` hold none), holds tensors on the ``'meta'``
    device (no values to run: materialise it first; every estimator here refuses it the same way),
    ``modules`` is empty or names an unknown module, ``batches`` is empty or too
    short, or ``num_iters < 1``, or when an estimate is not finite: a batch
    holding ``inf``/``NaN`` (an fp16 overflow upstream) or a variance that
    overflows the buffer's dtype (float16 holds at most 65504) would be written
    for good, so nothing is written and the message names every such layer and
    statistic. On any error every statistic, flag and momentum is restored before
    it propagates. A TorchScript ``model`` raises ``TypeError`` (its
    ``track_running_stats``/``momentum`` are compiled constants and hooks do not
    run inside it: estimate on the Python model, then script it); a
    ``torch.compile`` wrapper is estimated through the module it wraps (eagerly,
    names as in that module).
    """
    check_module("update_bn_stats", "model", model)
    check_materialized("update_bn_stats", "model", model)
    refuse_adapted("update_bn_stats", "model", model)
    _refuse_script_module("update_bn_stats", "model", model)
    model = compiled_original(model)
    bns = _estimated_layers(model, modules, "update_bn_stats")
    inputs = _inputs(batches, input_fn, num_iters, "update_bn_stats", forward)
    flags = [(m, m.training) for m in model.modules()]
    saved = {}
    for n, m in bns.items():
        nbt = getattr(m, "num_batches_tracked", None)
        saved[n] = dict(momentum=m.momentum, track=m.track_running_stats, mean=m.running_mean.clone(),
                        var=m.running_var.clone(), nbt=None if nbt is None else nbt.clone(), had_nbt=nbt is not None)
    moments = {n: _PooledMoments() for n in bns}
    handles = [m.register_forward_pre_hook(moments[n]) for n, m in bns.items()]
    n_batches, skipped = 0, []
    try:
        for m in model.modules():
            m.training = False
        for m in bns.values():
            m.training = True
            m.track_running_stats = True
            if getattr(m, "num_batches_tracked", None) is None:
                m.num_batches_tracked = torch.tensor(0, dtype=torch.long, device=m.running_mean.device)
            m.reset_running_stats()
            m.momentum = None  # torch's own update is overwritten below; it keeps num_batches_tracked counting
        with torch.random.fork_rng(devices=[]):
            for x in inputs:
                n_batches += 1
                rows = _rows(x)
                if rows == 0:
                    skipped.append((n_batches - 1, 0, "it holds no sample"))
                    continue
                before = {n: (mo.count, mo.mean, mo.m2) for n, mo in moments.items()}
                counted = {n: m.num_batches_tracked.clone() for n, m in bns.items()}
                try:
                    _run(model, x, forward, "update_bn_stats", n_batches - 1)
                except ValueError as e:  # torch's train-mode BatchNorm refuses one value per channel
                    if _ONE_VALUE not in str(e):
                        raise
                    for n, mo in moments.items():  # the layers before the refusing one saw this batch: forget it
                        mo.count, mo.mean, mo.m2 = before[n]
                    for n, m in bns.items():
                        m.num_batches_tracked.copy_(counted[n])
                    skipped.append((n_batches - 1, rows, f"a BatchNorm would normalise one value per channel ({e})"))
        if n_batches == 0:
            raise ValueError("update_bn_stats: batches is empty")
        if num_iters is not None and n_batches < num_iters:
            raise ValueError(f"update_bn_stats: num_iters={num_iters} but batches yielded only {n_batches}")
        if len(skipped) == n_batches:
            raise ValueError(f"update_bn_stats: no batch could be used: {_skipped_words(skipped)}; nothing was "
                             "written and every statistic is restored")
        calls = {n: int(m.num_batches_tracked) for n, m in bns.items()}
        estimates = {n: (moments[n].mean.to(m.running_mean), moments[n].unbiased_var().to(m.running_var))
                     for n, m in bns.items() if moments[n].count}
        _refuse_nonfinite(estimates, moments, bns)
        for n, m in bns.items():
            if n in estimates:
                m.running_mean.copy_(estimates[n][0])
                m.running_var.copy_(estimates[n][1])
    except BaseException:
        for n, m in bns.items():
            m.running_mean.copy_(saved[n]["mean"])
            m.running_var.copy_(saved[n]["var"])
            if saved[n]["had_nbt"]:
                m.num_batches_tracked.copy_(saved[n]["nbt"])
        raise
    finally:
        for h in handles:
            h.remove()
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
        elif n in estimates:  # lint_model's stats_near_init reads num_batches_tracked; this says it counts batches
            mark_precise_estimate(m)
    if skipped:
        warnings.warn(f"update_bn_stats skipped {len(skipped)} of {n_batches} batches, which torch's BatchNorm cannot "
                      f"use in train mode: {_skipped_words(skipped)}. The estimate pools the other batches (each "
                      "value weighted equally, as always). A DataLoader's last batch of one sample is the usual cause "
                      "(bnstudy.lint_loader lints it as last_batch_single): pass drop_last=True", RuntimeWarning,
                      stacklevel=user_stacklevel())
    pinned = [n for n, m in bns.items() if calls[n] and is_pinned(m)]
    if modules is None and pinned:
        shown = ", ".join(n or "(model)" for n in pinned[:6]) + (f" and {len(pinned) - 6} more" if len(pinned) > 6
                                                                 else "")
        warnings.warn(f"update_bn_stats re-estimated {len(pinned)} BatchNorm layer{'s' if len(pinned) != 1 else ''} "
                      f"pinned in eval mode by pin_eval ({shown}): their stored statistics changed. To re-estimate "
                      "only some layers pass modules=['head'] (names or modules); modules=model re-estimates "
                      "every layer without this warning", UserWarning, stacklevel=user_stacklevel())
    return calls


@torch.no_grad()
def precise_bn_statistics(model: nn.Module, batches: Iterable, num_iters: int | None = None,
                          input_fn: Callable | None = None, modules: str | nn.Module | Iterable | None = None, *,
                          forward: Callable | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Population mean and variance at every BatchNorm layer of ``model``, on ``batches``, without touching ``model``.

    :func:`update_bn_stats` on a deep copy (same estimator: dropout off, every
    value weighted equally, ``running_var`` the unbiased variance of all values
    pooled). Arguments as there (``modules``: names of ``model``; no warning
    about pinned layers, as nothing of ``model`` changes).

    Returns ``{layer_name: (running_mean (C,), running_var (C,))}`` for every
    layer the forward passes reached. Skips unusable batches with a warning
    (one value per channel, empty) and raises as :func:`update_bn_stats`;
    ``forward`` as there.
    """
    check_module("precise_bn_statistics", "model", model)
    check_materialized("precise_bn_statistics", "model", model)
    refuse_adapted("precise_bn_statistics", "model", model)
    _refuse_script_module("precise_bn_statistics", "model", model)
    model = compiled_original(model)
    chosen = _estimated_layers(model, modules, "precise_bn_statistics")
    _inputs(batches, input_fn, num_iters, "precise_bn_statistics", forward)  # argument errors name this function
    work = copy.deepcopy(model)
    try:
        calls = update_bn_stats(work, batches, num_iters, input_fn, modules=[work.get_submodule(n) for n in chosen],
                                forward=forward)
    except (TypeError, ValueError, RuntimeError) as e:  # the refusals name the function the user called
        renamed = _as_called("precise_bn_statistics", "update_bn_stats", e)
        if renamed is e:
            raise
        raise renamed from e.__cause__
    mods = dict(work.named_modules())
    return {n: (mods[n].running_mean.clone(), mods[n].running_var.clone()) for n, c in calls.items() if c > 0}


def _skipped_words(skipped: list) -> str:
    """``"batch 7 (1 sample, counted from 0): a BatchNorm would ..."`` for each skipped batch (the first three,
    then a count)."""
    shown = "; ".join(f"batch {i} ({'?' if r is None else r} sample{'' if r == 1 else 's'}, counted from 0): {why}"
                      for i, r, why in skipped[:3])
    return shown + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")


# --- Statistics mismatch: how far stored running statistics are from new data's -------------------------------

#: Distances :func:`statistics_mismatch` can report, per channel.
MISMATCH_MEASURES = ("kl", "mean_shift", "log_var_ratio", "wasserstein")  # the last two: issue 10
#: Which forward pass produces the activations that are compared with the stored statistics.
MISMATCH_PASSES = ("eval", "train")


@torch.no_grad()
def bn_input_statistics(model: nn.Module, batches: Iterable, network_mode: str = "eval",
                        input_fn: Callable | None = None, *, forward: Callable | None = None
                        ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
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
    reached. ``batches``, ``input_fn`` and ``forward`` (``forward(model, batch)``
    runs a model with several inputs) as in :func:`update_bn_stats`; with
    ``network_mode="train"`` a batch torch's BatchNorm refuses (one value per
    channel: a last batch of one sample) is skipped with a ``RuntimeWarning``
    naming it, as there (``ValueError`` when no batch is usable).
    Raises ``ValueError`` for an unknown ``network_mode``, a model with
    no such BN layer, or empty ``batches``; ``TypeError`` for a TorchScript
    model (its hooks do not run inside TorchScript: measure the Python model).
    A ``torch.compile`` wrapper is measured through the module it wraps.
    """
    check_module("bn_input_statistics", "model", model)
    check_materialized("bn_input_statistics", "model", model)
    _refuse_script_module("bn_input_statistics", "model", model)
    model = compiled_original(model)
    check_choice("bn_input_statistics", "network_mode", network_mode, MISMATCH_PASSES)
    inputs = _inputs(batches, input_fn, None, "bn_input_statistics", forward)
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
    n_batches, skipped = 0, []
    try:
        for x in inputs:
            n_batches += 1
            before = {k: list(v) for k, v in sums.items()}
            try:
                _run(work, x, forward, "bn_input_statistics", n_batches - 1)
            except ValueError as e:  # network_mode="train": torch refuses one value per channel; forget the batch
                if _ONE_VALUE not in str(e):
                    raise
                sums.clear()
                sums.update(before)
                skipped.append((n_batches - 1, _rows(x), f"a BatchNorm in train mode would normalise one value per "
                                                         f"channel ({e})"))
    finally:
        for h in handles:
            h.remove()
    if n_batches == 0:
        raise ValueError("bn_input_statistics: batches is empty")
    if skipped:
        if len(skipped) == n_batches:
            raise ValueError(f"bn_input_statistics: no batch could be used: {_skipped_words(skipped)}")
        warnings.warn(f"bn_input_statistics skipped {len(skipped)} of {n_batches} batches in network_mode='train': "
                      f"{_skipped_words(skipped)}; pass a DataLoader with drop_last=True (lint_loader's "
                      "last_batch_single)", RuntimeWarning, stacklevel=user_stacklevel())
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
    Variances must be positive (add a layer's ``eps`` first). Raises ``TypeError`` naming an argument that
    is not a tensor.
    """
    for param, t in (("mean_p", mean_p), ("var_p", var_p), ("mean_q", mean_q), ("var_q", var_q)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gaussian_kl: {param} must be a tensor, got {describe(t)}")
    return 0.5 * (var_p / var_q + (mean_p - mean_q) ** 2 / var_q - 1.0 + torch.log(var_q / var_p))


def statistics_mismatch(model: nn.Module, batches: Iterable, measure: str = "kl",
                        network_mode: str = "eval", per_channel: bool = False,
                        input_fn: Callable | None = None, *, forward: Callable | None = None) -> dict:
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
    :class:`bnstudy.study.models.ConvBackbone` the channels of all replicas would be
    averaged together unless ``per_channel=True``). ``batches``: an iterable of
    valid inputs of ``model``, e.g. a few ``(B, 3, H, W)`` batches of the new
    data, or a DataLoader of ``(x, y)`` pairs or dicts (``input_fn`` picks the
    input, default :func:`batch_input`; or ``forward(model, batch)`` runs the
    model on one batch, for a forward with several inputs); no labels are needed.

    Returns ``{layer_name: value}``: the mean over channels (a float), or with
    ``per_channel=True`` the per-channel values (a float64 tensor ``(C,)``).
    A single number for a whole network is the mean over layers, which is what
    the book's chapter 3 uses.

    Raises ``ValueError`` for an unknown ``measure`` or ``network_mode``, a model
    with no BN layer that tracks running statistics, or empty ``batches``; ``TypeError`` naming an argument
    of the wrong type, or for a TorchScript model (as :func:`bn_input_statistics`).
    """
    check_module("statistics_mismatch", "model", model)
    check_materialized("statistics_mismatch", "model", model)
    _refuse_script_module("statistics_mismatch", "model", model)
    model = compiled_original(model)
    _check_measure("statistics_mismatch", measure)
    check_bool("statistics_mismatch", "per_channel", per_channel)
    try:
        statistics = bn_input_statistics(model, batches, network_mode, input_fn, forward=forward)
    except (TypeError, ValueError, RuntimeError) as e:  # the refusals name the function the user called
        renamed = _as_called("statistics_mismatch", "bn_input_statistics", e)
        if renamed is e:
            raise
        raise renamed from e.__cause__
    return mismatch_from_statistics(model, statistics, measure, per_channel)


def _check_measure(fn: str, measure: str) -> None:
    check_choice(fn, "measure", measure, MISMATCH_MEASURES)


def mismatch_from_statistics(model: nn.Module, statistics: dict, measure: str = "kl", per_channel: bool = False) -> dict:
    """:func:`statistics_mismatch` from precomputed :func:`bn_input_statistics` of ``model``.

    Lets one forward pass serve several measures. ``statistics``:
    ``{layer_name: (mean (C,), var (C,))}`` for BN layers of ``model``. Returns and
    raises as :func:`statistics_mismatch`; also raises ``ValueError`` for a layer
    name that is not a BN layer of ``model`` or a shape that does not match it.
    """
    check_module("mismatch_from_statistics", "model", model)
    check_materialized("mismatch_from_statistics", "model", model)
    _check_measure("mismatch_from_statistics", measure)
    check_bool("mismatch_from_statistics", "per_channel", per_channel)
    if not isinstance(statistics, dict) or not all(
            isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(t, torch.Tensor) for t in v)
            for v in statistics.values()):
        raise TypeError("mismatch_from_statistics: statistics must be a dict {layer_name: (mean (C,), var (C,))} of "
                        f"tensors, as bn_input_statistics returns, got {describe(statistics)}")
    layers = batchnorm_layers(model)
    out = {}
    for name, (mean_new, var_new) in statistics.items():
        if name not in layers or layers[name].running_mean is None:
            raise ValueError(f"mismatch_from_statistics: statistics names {name!r}, which is not a BN layer of model "
                             f"with running statistics; the model's are "
                             f"{[n for n, m in layers.items() if m.running_mean is not None][:6]}")
        m = layers[name]
        if mean_new.shape != m.running_mean.shape or var_new.shape != m.running_var.shape:
            raise ValueError(f"mismatch_from_statistics: statistics for {name!r} have shape {tuple(mean_new.shape)}, "
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
                       input_fn: Callable | None = None, *, forward: Callable | None = None):
    """Do ``model``'s BatchNorm running statistics agree with ``other``'s? One row per layer, naming those that do not.

    ``other`` is either another model (an EMA or SWA copy, a teacher, the same
    network before fine-tuning: layers are matched by qualified name, with or
    without a ``module.`` wrapper prefix) or some batches of data (an iterable
    or DataLoader, read with ``input_fn`` as in :func:`update_bn_stats`): then
    the reference is what the statistics *should* be for ``model``'s current
    weights on that data, the precise-BN estimate (:func:`precise_bn_statistics`,
    ``num_iters`` batches; ``forward(model, batch)`` runs a model with several
    inputs, as in :func:`update_bn_stats`). This catches an EMA copy that averages parameters but
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

    Non-finite statistics (a NaN or inf left by one overflowing batch): the
    layer's three measures are NaN and ``agrees`` is False, and the frame says
    why: ``df.attrs["nonfinite"]`` maps each such layer to a sentence (``"model
    running_var: 8 of 8 channels NaN"``), and a ``RuntimeWarning`` names them,
    so a layer is not just "disagreeing" when it holds NaN.

    Both models may be TorchScript modules or ``torch.compile`` wrappers (their
    buffers are read; a compiled wrapper through the module it wraps); data as
    ``other`` needs a Python ``model`` (the estimate runs hooks). Raises
    ``ValueError`` for a negative ``tol``, a model without BatchNorm
    statistics, models that share no layer name, or layers of different shape; ``ImportError`` (saying to
    install it) without pandas, since the result is a table.
    """
    from ._checks import require_pandas
    pd = require_pandas()

    check_module("compare_statistics", "model", model)
    check_materialized("compare_statistics", "model", model)
    model = compiled_original(model)
    if isinstance(other, nn.Module):
        other = compiled_original(other)
    check_number("compare_statistics", "tol", tol, minimum=0)
    check_int("compare_statistics", "num_iters", num_iters, allow_none=True,
              what="a positive integer or None (every batch)")
    check_callable("compare_statistics", "input_fn", input_fn, "a function from one batch to the model's input")
    check_callable("compare_statistics", "forward", forward, "a function forward(model, batch) that runs the model "
                   "on one batch")
    if not isinstance(other, nn.Module):
        check_iterable("compare_statistics", "other", other, "another model (nn.Module) or " + _BATCHES)
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
        try:
            est = precise_bn_statistics(model, other, num_iters, input_fn, forward=forward)
        except (TypeError, ValueError, RuntimeError) as e:  # say which argument the batches came from
            msg = str(e).removeprefix("precise_bn_statistics: ")
            raise type(e)(f"compare_statistics: other was read as data (batches): {msg}") from e
        ref = {n: (mean, var, None) for n, (mean, var) in est.items()}
    rows, nonfinite = [], {}
    for n, m in mine.items():
        if n not in ref:
            continue
        rm, rv, rnbt = ref[n]
        if rm.shape != m.running_mean.shape:
            raise ValueError(f"compare_statistics: layer {n!r} has {tuple(m.running_mean.shape)} channels in model "
                             f"but {tuple(rm.shape)} in other")
        mean, var = m.running_mean.detach().double().cpu(), m.running_var.detach().double().cpu() + m.eps
        rmean, rvar = rm.detach().double().cpu(), rv.detach().double().cpu() + m.eps
        bad = [f"{side} {stat}: {_nonfinite_words(t)}" for side, stat, t in (
            ("model", "running_mean", mean), ("model", "running_var", var),
            ("other" if isinstance(other, nn.Module) else "data estimate", "running_mean", rmean),
            ("other" if isinstance(other, nn.Module) else "data estimate", "running_var", rvar))
            if not bool(torch.isfinite(t).all())]
        if bad:
            nonfinite[n] = "; ".join(bad)
            shift = ratio = kl = math.nan
        else:
            shift = float(((mean - rmean).abs() / rvar.sqrt()).max())
            ratio = float((var / rvar).log().abs().max())
            kl = float(gaussian_kl(rmean, rvar, mean, var).mean())
        nbt = getattr(m, "num_batches_tracked", None)
        rows.append(dict(layer=n, type=m.original_name if hasattr(m, "original_name") else type(m).__name__,
                         max_mean_shift=shift, max_log_var_ratio=ratio, kl=kl,
                         agrees=bool(shift <= tol and ratio <= tol),
                         num_batches_tracked=None if nbt is None else int(nbt),
                         other_num_batches_tracked=None if rnbt is None else int(rnbt)))
    df = pd.DataFrame(rows, columns=_COMPARE_COLUMNS)
    if nonfinite:
        df.attrs["nonfinite"] = nonfinite
        warnings.warn("compare_statistics: non-finite running statistics (NaN/inf), so these layers cannot agree: "
                      + "; ".join(f"{k or '(model)'}: {v}" for k, v in nonfinite.items()), RuntimeWarning,
                      stacklevel=user_stacklevel())
    return df


def _nonfinite_words(t: torch.Tensor) -> str:
    """``"3 of 8 channels NaN, 1 inf"``: how many values of ``t`` are NaN and how many infinite."""
    nan, inf = int(t.isnan().sum()), int(t.isinf().sum())
    parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} inf"] if inf else [])
    return f"{nan + inf} of {t.numel()} channels non-finite (" + ", ".join(parts) + ")"


# --- chapter 3 (issue 10): more cheap candidates for the mismatch measure ------------------------------------------

def mismatch_candidate(measure: str, mean_new: torch.Tensor, var_new: torch.Tensor, mean_run: torch.Tensor,
                       var_run: torch.Tensor) -> torch.Tensor:
    """Per-channel value of a candidate measure ``"log_var_ratio"`` or ``"wasserstein"`` (see
    :func:`statistics_mismatch`) from new and stored means and variances ``(C,)`` (variances with ``eps`` added).

    Both are zero exactly when mean and variance agree. Raises ``ValueError`` for another ``measure``,
    ``TypeError`` naming an argument that is not a tensor.
    """
    for param, t in (("mean_new", mean_new), ("var_new", var_new), ("mean_run", mean_run), ("var_run", var_run)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mismatch_candidate: {param} must be a tensor, got {describe(t)}")
    if measure == "log_var_ratio":
        return torch.log(var_new / var_run).abs()
    if measure == "wasserstein":
        return torch.sqrt((mean_new - mean_run) ** 2 + (var_new.sqrt() - var_run.sqrt()) ** 2) / var_run.sqrt()
    raise ValueError(f"mismatch_candidate: measure={describe(measure)} is not a mismatch_candidate; choose "
                     "'log_var_ratio' or 'wasserstein'")

# --- chapter 5 (issue 13): BatchNorm replaced by a per-sample norm ------------------------------------------------

#: Norm kinds :func:`replace_norm` can put in a BatchNorm's place.
REPLACE_KINDS = ("group", "layer")


def _takes_only_flat_input(bn: nn.Module) -> bool:
    """Whether ``bn`` takes ``(N, C)`` input and no image input: its ``_check_input_dim`` accepts rank 2 and refuses
    rank 4 (BatchNorm1d and its lazy variant; SyncBatchNorm takes every rank and is not counted)."""
    def accepts(rank: int) -> bool | None:
        try:
            bn._check_input_dim(torch.empty((2, bn.num_features) + (2,) * (rank - 2), device="meta"))
            return True
        except (ValueError, RuntimeError):
            return False
        except Exception:  # noqa: BLE001 - _NormBase's NotImplementedError, or another library's check
            return None
    return accepts(2) is True and accepts(4) is False


def _replacement(bn: nn.Module, name: str, kind: str, num_groups: int | None) -> nn.Module:
    from .freeze import FrozenBatchNorm
    c = bn.num_features
    label = repr(name) if name else "(the model itself)"
    if nn.parameter.is_lazy(bn.running_mean if bn.running_mean is not None else bn.weight):
        raise ValueError(f"replace_norm: BatchNorm {name!r} is lazy and uninitialised; run one forward pass first")
    _refuse_hooks(bn, label, "a GroupNorm")
    if getattr(bn, "affine", False) and getattr(bn, "bias", 0) is None:
        raise ValueError(f"replace_norm: {type(bn).__name__} {label} was built with bias=False (a weight and no bias), "
                         "which replace_norm does not support yet; nothing was changed")
    if not computes_standard_eval(bn):  # a forward of its own (an activation inside the norm layer) would be dropped
        if not has_running_stats(bn):
            raise ValueError(f"replace_norm: {type(bn).__name__} {label} has a forward of its own and no running "
                             "statistics, so replace_norm cannot check that it only normalises; a GroupNorm in its "
                             "place could drop what its forward does. Nothing was changed; replace it yourself")
        try:
            FrozenBatchNorm._build_from_batchnorm(bn, name)
        except ValueError as e:
            raise ValueError(f"replace_norm: {type(bn).__name__} {label} does more in its forward than normalise, "
                             f"and the GroupNorm put in its place would drop that ({e})") from None
    if kind == "layer":
        g = 1
    else:
        g = math.gcd(8, c) if num_groups is None else num_groups
    if c % g:
        raise ValueError(f"replace_norm: num_groups={g} does not divide the {c} channels of {name!r}")
    if c // g == 1 and _takes_only_flat_input(bn):
        alternatives = [d for d in range(1, c) if c % d == 0]
        raise ValueError(
            f"replace_norm: {type(bn).__name__} {label} normalises (N, C) features, and "
            f"{'kind=' + repr(kind) if kind == 'layer' or num_groups is None else f'num_groups={g}'} gives "
            f"GroupNorm({g}, {c}) one channel per group: each group then holds one value per sample, which it "
            "normalises to 0, so the layer outputs its bias (0 before training) for every sample, whatever the "
            "input (opacus#567). Nothing was changed. "
            + (f"Choose num_groups dividing {c} below {c} ({alternatives}) or kind='layer'" if alternatives else
               "A single feature has nothing to normalise it with per sample: keep the BatchNorm, or remove it")
            + "; on (N, C, L) input with L > 1 one channel per group is GroupNorm's instance norm: replace the "
            f"layer yourself with nn.GroupNorm({c}, {c})")
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
    ``gcd(8, C)``, what :func:`bnstudy.study.models.make_norm2d` builds, so a converted
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

    Degenerate groups are refused: a BatchNorm1d (a layer that takes ``(N, C)`` input and
    no images) whose replacement would hold **one channel per group** (``C // num_groups
    == 1``, e.g. the default ``GroupNorm(4, 4)`` for ``BatchNorm1d(4)``, or ``kind="layer"``
    on one feature) normalises each sample's single value per group to 0: the layer would
    output its bias for every sample, whatever the input (opacus#567). Layers that take
    images (BatchNorm2d/3d, SyncBatchNorm) with one channel per group are GroupNorm's
    instance norm and are converted; one whose feature maps are ``1 x 1`` degenerates the
    same way, which cannot be seen without an input and is not checked. A ``_BatchNorm``
    subclass with a ``forward`` of its own is converted only if its eval output is torch's
    BatchNorm's (probed as :meth:`bnstudy.freeze.FrozenBatchNorm.from_batchnorm` does): an
    activation inside the norm layer (timm's ``BatchNormAct2d``) would be dropped.

    Raises ``ValueError`` for an unknown ``kind``, a ``num_groups`` that does not divide a
    layer's channels (naming the layer), ``num_groups`` given with ``kind="layer"``, an
    uninitialised lazy layer, a degenerate group or a layer whose forward does more than
    normalise (naming the layer), in each case before any layer is replaced.
    """
    from .freeze import _named_convert
    check_module("replace_norm", "model", model)
    refuse_adapted("replace_norm", "model", model)
    _refuse_script_module("replace_norm", "model", model)
    check_choice("replace_norm", "kind", kind, REPLACE_KINDS)
    check_int("replace_norm", "num_groups", num_groups, allow_none=True)
    if num_groups is not None and kind == "layer":
        raise ValueError("replace_norm: num_groups is only for kind='group' (kind='layer' is one group)")
    # every refusal names replace_norm (a layer's hooks: "replace_norm: cannot turn ..."), before any layer is replaced
    return _named_convert("replace_norm", model, lambda m, name: _replacement(m, name, kind, num_groups)
                          if isinstance(m, nn.modules.batchnorm._BatchNorm) else None)
