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
