"""Running-statistics tools: population statistics (precise BN), AdaBN re-estimation.

``precise_bn_statistics`` follows fvcore's ``update_bn_stats``
(``fvcore/nn/precise_bn.py``, after Wu & Johnson, 2021, "Rethinking 'Batch' in
BatchNorm"): instead of an exponential moving average with ``momentum``, it
averages the batch statistics of many train-mode forward passes with equal
weight (PyTorch's ``momentum=None`` cumulative average). With ``n`` batches the
estimate's noise falls like ``1/n`` in variance, where the moving average's
stays at about ``momentum / (2 - momentum)`` of one batch's.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
from torch import nn

from .freeze import batchnorm_layers, unpin


@torch.no_grad()
def precise_bn_statistics(model: nn.Module, batches: Iterable[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Population mean and variance at every BatchNorm layer of ``model``, on ``batches``.

    Runs a deep copy of ``model`` in train mode over ``batches`` (each a valid
    input of ``model``) with every BN layer reset and switched to
    ``momentum=None``, so each layer's buffers end as the equal-weight average of
    its per-batch statistics. ``model`` itself is not touched.

    Returns ``{layer_name: (running_mean (C,), running_var (C,))}``.
    Raises ``ValueError`` if ``model`` has no BatchNorm layer that tracks
    running statistics, or ``batches`` is empty.
    """
    work = unpin(copy.deepcopy(model))
    bns = {n: m for n, m in batchnorm_layers(work).items() if m.track_running_stats}
    if not bns:
        raise ValueError("precise_bn_statistics: model has no BatchNorm layer with track_running_stats=True")
    for m in bns.values():
        m.reset_running_stats()
        m.momentum = None
    work.train()
    n = 0
    for x in batches:
        work(x)
        n += 1
    if n == 0:
        raise ValueError("precise_bn_statistics: batches is empty")
    return {name: (m.running_mean.clone(), m.running_var.clone()) for name, m in bns.items()}


# --- Statistics mismatch: how far stored running statistics are from new data's -------------------------------

#: Distances :func:`statistics_mismatch` can report, per channel.
MISMATCH_MEASURES = ("kl", "mean_shift")
#: Which forward pass produces the activations that are compared with the stored statistics.
MISMATCH_PASSES = ("eval", "train")


@torch.no_grad()
def bn_input_statistics(model: nn.Module, batches: Iterable[torch.Tensor], network_mode: str = "eval",
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
    reached. Raises ``ValueError`` for an unknown ``network_mode``, a model with
    no such BN layer, or empty ``batches``.
    """
    if network_mode not in MISMATCH_PASSES:
        raise ValueError(f"network_mode={network_mode!r} is not allowed; choose one of {list(MISMATCH_PASSES)}")
    work = unpin(copy.deepcopy(model))
    bns = {n: m for n, m in batchnorm_layers(work).items() if m.track_running_stats}
    if not bns:
        raise ValueError("bn_input_statistics: model has no BatchNorm layer with track_running_stats=True")
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
        for x in batches:
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


def statistics_mismatch(model: nn.Module, batches: Iterable[torch.Tensor], measure: str = "kl",
                        network_mode: str = "eval", per_channel: bool = False) -> dict:
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

    It is the early diagnostic practitioners recommend before fine-tuning or
    deploying a BN network on new data: do its running statistics still
    describe that data? The per-channel Gaussian summary is the one BatchNorm
    itself keeps (Ioffe & Szegedy, 2015); AdaBN (Li et al., 2016) is the remedy
    when they do not.

    ``model``: any module with BN layers (single-replica: for a packed
    :class:`bnstudy.models.ConvBackbone` the channels of all replicas would be
    averaged together unless ``per_channel=True``). ``batches``: an iterable of
    valid inputs of ``model``, e.g. a few ``(B, 3, H, W)`` batches of the new
    data; no labels are needed.

    Returns ``{layer_name: value}``: the mean over channels (a float), or with
    ``per_channel=True`` the per-channel values (a float64 tensor ``(C,)``).
    A single number for a whole network is the mean over layers, which is what
    the book's chapter 3 uses.

    Raises ``ValueError`` for an unknown ``measure`` or ``network_mode``, a model
    with no BN layer that tracks running statistics, or empty ``batches``.
    """
    _check_measure(measure)
    return mismatch_from_statistics(model, bn_input_statistics(model, batches, network_mode), measure, per_channel)


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
        else:
            d = (mean_new - mean_s).abs() / var_s.sqrt()
        out[name] = d.cpu() if per_channel else float(d.mean())
    return out
