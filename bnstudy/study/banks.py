"""Statistic banks: one network's frozen weights with K sets of BatchNorm buffers, chosen explicitly.

A :class:`StatisticBank` wraps a model and keeps ``K >= 2`` copies ("banks") of every BatchNorm
layer's ``running_mean``, ``running_var`` and ``num_batches_tracked``. The model's own buffers are
the *live* slot: they hold the selected bank's values, and BatchNorm reads (eval mode) or writes
(train mode) them as usual. Selecting a bank copies its values into the live slot, after writing
the live slot back into the bank that was selected before, so statistics a train-mode pass
accumulates under ``with bank.use(k):`` end up in bank ``k``::

    bank = StatisticBank(model, n_banks=2)   # every bank starts as a copy of the model's buffers
    with bank.use(1):
        model.train(); model(x_new)          # updates bank 1 only
    with bank.use(0):
        model.eval(); model(x_old)           # bit-identical to the model before the bank existed

Selecting a bank changes buffers only, never a parameter (the weights are the model's one set;
:class:`bnstudy.audit.FreezeAudit` around :meth:`StatisticBank.select` shows exactly the live
buffers moving). ``state_dict()`` holds the live slot, every bank and the selected index, so a
round trip through ``load_state_dict`` restores every bank.

This is the structure of domain-specific batch normalisation (Chang et al., 2019, "Domain-Specific
Batch Normalization for Unsupervised Domain Adaptation", CVPR), with the affine parameters shared
as well; there a known domain label picks the branch. Here nothing says which bank an input
needs: :mod:`bnstudy.study.routing` picks it from the input itself. :meth:`StatisticBank.use_blend`
normalises with a per-sample mixture of banks (a soft choice).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

_FIELDS = ("running_mean", "running_var", "num_batches_tracked")


def _slug(name: str) -> str:
    return name.replace(".", "__")


def bank_layers(model: nn.Module) -> dict[str, _BatchNorm]:
    """The BatchNorm layers of ``model`` that keep running statistics, by qualified name, in model order."""
    return {n: m for n, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None}


class _Slot(nn.Module):
    """One bank: a copy of every banked layer's buffers (names ``<layer with __>__<field>``)."""

    def __init__(self, layers: dict[str, _BatchNorm]):
        super().__init__()
        for name, m in layers.items():
            for f in _FIELDS:
                self.register_buffer(f"{_slug(name)}__{f}", getattr(m, f).detach().clone())


class StatisticBank(nn.Module):
    """``model`` with ``n_banks`` sets of BatchNorm buffers and one set of weights (see module docstring).

    ``forward`` is ``model``'s forward with the selected bank live. Bank 0 is selected at
    construction; every bank starts as a copy of the model's current buffers.

    Raises ``TypeError`` if ``model`` is not an ``nn.Module``, ``ValueError`` if ``n_banks < 2`` or
    the model has no BatchNorm layer with running statistics.
    """

    def __init__(self, model: nn.Module, n_banks: int = 2):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"StatisticBank needs an nn.Module, got {type(model).__name__}")
        if isinstance(n_banks, bool) or not isinstance(n_banks, int) or n_banks < 2:
            raise ValueError(f"n_banks must be an integer >= 2 (one bank is the plain model), got {n_banks!r}")
        layers = bank_layers(model)
        if not layers:
            raise ValueError("StatisticBank: the model has no BatchNorm layer with running statistics to bank")
        self.model = model
        self.banks = nn.ModuleList(_Slot(layers) for _ in range(n_banks))
        self.register_buffer("selected", torch.tensor(0, dtype=torch.long))

    # --- selection -----------------------------------------------------------------------------------------------

    @property
    def n_banks(self) -> int:
        return len(self.banks)

    @property
    def layer_names(self) -> list[str]:
        """The banked layers' qualified names inside ``model``, in model order."""
        return list(bank_layers(self.model))

    def _check_index(self, k) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.n_banks:
            raise ValueError(f"bank index must be an integer in 0..{self.n_banks - 1}, got {k!r}")
        return k

    @torch.no_grad()
    def _copy(self, to_bank: bool, k: int) -> None:
        slot = self.banks[k]
        for name, m in bank_layers(self.model).items():
            for f in _FIELDS:
                live, stored = getattr(m, f), getattr(slot, f"{_slug(name)}__{f}")
                (stored if to_bank else live).copy_(live if to_bank else stored)

    def sync(self) -> None:
        """Write the live buffers back into the selected bank (``state_dict`` and ``select`` do this)."""
        self._copy(True, int(self.selected))

    def select(self, k: int) -> int:
        """Make bank ``k`` live; returns the index that was selected before.

        The live buffers are first written back into the previously selected bank. Only buffers are
        written: no parameter changes. Raises ``ValueError`` for an index outside ``0..K-1``.
        """
        k = self._check_index(k)
        prev = int(self.selected)
        self.sync()
        self._copy(False, k)
        self.selected.fill_(k)
        return prev

    @contextmanager
    def use(self, k: int):
        """``with bank.use(k):`` bank ``k`` is live inside the block; the previous bank is live again after.

        Train-mode passes inside the block update bank ``k`` (written back on exit, also on an error).
        """
        prev = self.select(k)
        try:
            yield self
        finally:
            self.select(prev)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    # --- reading and writing banks -------------------------------------------------------------------------------

    def statistics(self, k: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Bank ``k``'s ``(running_mean, running_var)`` per layer name (copies; the live values if ``k`` is selected)."""
        k = self._check_index(k)
        if k == int(self.selected):
            self.sync()
        slot = self.banks[k]
        return {n: (getattr(slot, f"{_slug(n)}__running_mean").detach().clone(),
                    getattr(slot, f"{_slug(n)}__running_var").detach().clone()) for n in self.layer_names}

    @torch.no_grad()
    def copy_bank(self, source: int, target: int) -> None:
        """Overwrite bank ``target`` with bank ``source`` (the live slot too, if ``target`` is selected)."""
        source, target = self._check_index(source), self._check_index(target)
        self.sync()
        for name, buf in self.banks[source].named_buffers():
            getattr(self.banks[target], name).copy_(buf)
        if target == int(self.selected):
            self._copy(False, target)

    def state_dict(self, *args, **kwargs):
        """The model's state dict (live slot), every bank and ``selected``; the live slot is synced first."""
        self.sync()
        return super().state_dict(*args, **kwargs)

    # --- soft choice: a per-sample mixture of banks ---------------------------------------------------------------

    def blended_statistics(self, weights: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the mean and variance ``(B, C)`` of the mixture of banks with ``weights (B, K)``.

        Moment matching of a mixture of Gaussians: ``mean = sum_k w_k mu_k`` and
        ``var = sum_k w_k (sigma_k^2 + mu_k^2) - mean^2``, i.e. the statistics the pooled data of
        the banks would have in those proportions. Raises ``ValueError`` unless ``weights`` is
        ``(B, K)`` with non-negative rows summing to 1.
        """
        w = torch.as_tensor(weights, dtype=torch.float64)
        if w.dim() != 2 or w.shape[1] != self.n_banks:
            raise ValueError(f"weights must have shape (B, {self.n_banks}), got {tuple(w.shape)}")
        if (w < 0).any() or not torch.allclose(w.sum(1), torch.ones(len(w), dtype=w.dtype), atol=1e-6):
            raise ValueError("weights must be non-negative and each row must sum to 1")
        stats = [self.statistics(k) for k in range(self.n_banks)]
        out = {}
        for name in self.layer_names:
            mu = torch.stack([s[name][0].double() for s in stats])   # (K, C)
            var = torch.stack([s[name][1].double() for s in stats])
            mean = w @ mu
            second = w @ (var + mu * mu)
            out[name] = (mean.float(), (second - mean * mean).clamp_min(0.0).float())
        return out

    @contextmanager
    def use_blend(self, weights: torch.Tensor):
        """Inside the block, every banked layer normalises sample ``i`` with the mixture ``weights[i] (K,)``.

        ``weights``: ``(B, K)`` for the next forward passes of exactly ``B`` samples, or ``(K,)``
        for one blend for all samples. Eval-mode normalisation only (the layer's affine weight and
        bias, its ``eps``); buffers are not written. A forward hook replaces each layer's output,
        so a one-hot row gives the bank's normalisation up to float rounding, not bit for bit (use
        :meth:`use` for exact results). Raises ``ValueError`` for bad weights (see
        :meth:`blended_statistics`) and, in the forward pass, for a batch of another size.
        """
        w = torch.as_tensor(weights, dtype=torch.float64)
        per_sample = w.dim() == 2
        stats = self.blended_statistics(w if per_sample else w[None])
        handles = []

        def make_hook(mean, var):
            def hook(module, args, output):
                x = args[0]
                if per_sample and x.shape[0] != mean.shape[0]:
                    raise ValueError(f"use_blend: weights were given for {mean.shape[0]} samples, the batch has "
                                     f"{x.shape[0]}")
                shape = (mean.shape[0], -1) + (1,) * (x.dim() - 2)
                m, v = mean.to(x).reshape(shape), var.to(x).reshape(shape)
                y = (x - m) * torch.rsqrt(v + module.eps)  # rsqrt, as BatchNorm does: same bits on every CPU
                if module.affine:
                    ws = (1, -1) + (1,) * (x.dim() - 2)
                    y = y * module.weight.reshape(ws) + module.bias.reshape(ws)
                return y
            return hook

        layers = bank_layers(self.model)
        try:
            for name, (mean, var) in stats.items():
                handles.append(layers[name].register_forward_hook(make_hook(mean, var)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def extra_repr(self) -> str:
        return f"n_banks={self.n_banks}, layers={len(self.layer_names)}, selected={int(self.selected)}"


__all__ = ["StatisticBank", "bank_layers"]
