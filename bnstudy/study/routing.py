"""Routers: pick a statistic bank (:mod:`bnstudy.study.banks`) from the input itself, without labels.

Every router sees inputs ``x (N, C, H, W)`` in *inference batches* of ``batch_size`` consecutive
samples and makes one decision per batch (``batch_size=1``: per sample, from one image's spatial
statistics). Four routers:

* :class:`OracleRouter`: the true bank (the upper bound; needs the label the others lack).
* :class:`NearestStatistics`: the input's per-channel mean and variance at the input of the first
  BatchNorm layer (``layers="first"``) are compared with each bank's stored ``running_mean`` /
  ``running_var`` there, and the closest bank wins. The distance is the Gaussian KL divergence
  ``KL(N(m, v) || N(mu_k, sigma_k^2))`` per channel, averaged over channels (nats; ``distance="kl"``),
  or the standardized squared mean difference ``(m - mu_k)^2 / sigma_k^2`` averaged over channels
  (``distance="mean"``). Variant ``layers="all"``: for each candidate bank, the input runs through
  the network with that bank live and the distances at every BatchNorm layer's input (computed on
  the fly) are averaged over layers.
* :class:`StatisticsClassifier`: multinomial logistic regression on the first layer's per-channel
  mean and log-variance, trained on batches whose bank is known (drawn from each bank's training
  distribution: the training streams, not the evaluation data).
* :class:`SoftMixture`: no hard choice; weights ``softmax(-d_k / temperature)`` over the
  nearest-statistics distances ``d_k``, and the network normalises with the moment-matched mixture
  of the banks (:meth:`bnstudy.study.banks.StatisticBank.use_blend`).

The statistics of the first BatchNorm layer's input do not depend on any bank (only the layers
before it run), so ``layers="first"`` needs one partial forward pass; ``layers="all"`` needs one
forward pass per bank. Batch statistics are population (biased) moments over samples and spatial
positions; the layer's ``eps`` is added to every variance before a distance is taken.

Domain-specific BN (Chang et al., 2019) and detectron2's per-call norm lists select statistics by a
known domain label or a call count; these routers use only the input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .banks import StatisticBank, bank_layers
from ..running_stats import gaussian_kl

DISTANCES = ("kl", "mean")
LAYER_CHOICES = ("first", "all")


class _Stop(Exception):
    pass


@torch.no_grad()
def sample_moments(bank: StatisticBank, x: torch.Tensor, layers: str = "first") -> dict:
    """Per-sample moments at the input of BatchNorm layers, with the selected bank live, in eval mode.

    Returns ``{layer: (sum (N, C), sum_of_squares (N, C), count)}`` in float64, where ``count``
    is the number of spatial positions per sample. ``layers="first"`` stops the forward pass after
    the first banked layer's input is seen; ``"all"`` covers every banked layer. The model's
    train/eval flags are restored. Raises ``ValueError`` for an unknown ``layers``.
    """
    if layers not in LAYER_CHOICES:
        raise ValueError(f"layers={layers!r} is not allowed; choose one of {list(LAYER_CHOICES)}")
    named = bank_layers(bank.model)
    targets = dict(list(named.items())[:1]) if layers == "first" else named
    out, handles = {}, []

    def make_hook(name):
        def hook(module, args):
            v = args[0].double().flatten(2)  # (N, C, positions)
            out[name] = (v.sum(2), (v * v).sum(2), v.shape[2])
            if layers == "first":
                raise _Stop
        return hook

    flags = {m: m.training for m in bank.model.modules()}
    try:
        for n, m in targets.items():
            handles.append(m.register_forward_pre_hook(make_hook(n)))
        nn.Module.train(bank.model, False)
        try:
            bank.model(x)
        except _Stop:
            pass
    finally:
        for h in handles:
            h.remove()
        for m, t in flags.items():
            m.training = t
    return out


def pool_moments(moments: dict, batch_size: int | None) -> dict:
    """Mean and (population) variance ``(G, C)`` per layer over groups of ``batch_size`` consecutive samples.

    ``batch_size=None``: one group of all ``N`` samples. Raises ``ValueError`` unless ``N`` is a
    multiple of ``batch_size``.
    """
    out = {}
    for name, (s1, s2, count) in moments.items():
        n = s1.shape[0]
        b = n if batch_size is None else int(batch_size)
        if b < 1 or n % b:
            raise ValueError(f"the number of samples ({n}) must be a multiple of batch_size ({batch_size})")
        g1 = s1.reshape(n // b, b, -1).sum(1) / (b * count)
        g2 = s2.reshape(n // b, b, -1).sum(1) / (b * count)
        out[name] = (g1, (g2 - g1 * g1).clamp_min(0.0))
    return out


def statistic_distance(mean: torch.Tensor, var: torch.Tensor, mu: torch.Tensor, sigma2: torch.Tensor,
                       eps: float, distance: str = "kl") -> torch.Tensor:
    """Distance ``(G,)`` of batch statistics ``mean, var (G, C)`` to a bank's ``mu, sigma2 (C,)``, averaged over channels.

    ``"kl"``: Gaussian KL of the batch's per-channel distribution from the bank's (nats); ``"mean"``:
    ``(mean - mu)^2 / sigma2``. ``eps`` is added to both variances.
    """
    if distance not in DISTANCES:
        raise ValueError(f"distance={distance!r} is not allowed; choose one of {list(DISTANCES)}")
    mu, s2 = mu.double()[None], sigma2.double()[None] + eps
    if distance == "kl":
        return gaussian_kl(mean.double(), var.double() + eps, mu, s2).mean(1)
    return ((mean.double() - mu) ** 2 / s2).mean(1)


def _expand(decisions: torch.Tensor, n: int) -> torch.Tensor:
    """Per-group values ``(G, ...)`` repeated for the ``n / G`` samples of each group."""
    return decisions.repeat_interleave(n // decisions.shape[0], dim=0)


class Router:
    """Base class: ``route(x, batch_size)`` gives one bank index per sample ``(N,)`` (constant within a batch)."""

    def route(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        raise NotImplementedError


class OracleRouter(Router):
    """The true bank ``k`` for every input: the upper bound (it is handed the label)."""

    def __init__(self, k: int):
        self.k = int(k)

    def route(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        return torch.full((x.shape[0],), self.k, dtype=torch.long)


class NearestStatistics(Router):
    """The bank whose stored statistics are closest to the input's (see the module docstring).

    ``layers``: ``"first"`` or ``"all"``; ``distance``: ``"kl"`` or ``"mean"``.
    """

    def __init__(self, bank: StatisticBank, layers: str = "first", distance: str = "kl"):
        if layers not in LAYER_CHOICES:
            raise ValueError(f"layers={layers!r} is not allowed; choose one of {list(LAYER_CHOICES)}")
        if distance not in DISTANCES:
            raise ValueError(f"distance={distance!r} is not allowed; choose one of {list(DISTANCES)}")
        self.bank, self.layers, self.distance = bank, layers, distance

    def moments(self, x: torch.Tensor) -> list[dict]:
        """Per-sample moments per bank: one dict for ``"first"`` (bank-independent), else one per bank."""
        if self.layers == "first":
            return [sample_moments(self.bank, x, "first")]
        out = []
        for k in range(self.bank.n_banks):
            with self.bank.use(k):
                out.append(sample_moments(self.bank, x, "all"))
        return out

    def distances_from_moments(self, moments: list[dict], batch_size: int | None) -> torch.Tensor:
        """Distances ``(G, K)`` per group of ``batch_size`` samples from :meth:`moments`' output."""
        layers = bank_layers(self.bank.model)
        cols = []
        for k in range(self.bank.n_banks):
            stored = self.bank.statistics(k)
            pooled = pool_moments(moments[0] if len(moments) == 1 else moments[k], batch_size)
            d = [statistic_distance(m, v, *stored[n], layers[n].eps, self.distance) for n, (m, v) in pooled.items()]
            cols.append(torch.stack(d).mean(0))
        return torch.stack(cols, 1)

    def distances(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """Distances ``(G, K)``: one row per inference batch of ``batch_size`` samples."""
        return self.distances_from_moments(self.moments(x), batch_size)

    def route(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        return _expand(self.distances(x, batch_size).argmin(1), x.shape[0])


class SoftMixture(NearestStatistics):
    """Weights ``softmax(-d / temperature)`` over the nearest-statistics distances (nats for ``"kl"``).

    :meth:`weights` gives ``(N, K)`` per sample (constant within a batch); :meth:`route` the
    heaviest bank. Raises ``ValueError`` unless ``temperature > 0``.
    """

    def __init__(self, bank: StatisticBank, temperature: float = 1.0, layers: str = "first", distance: str = "kl"):
        super().__init__(bank, layers, distance)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.temperature = float(temperature)

    def weights_from_distances(self, d: torch.Tensor, n: int) -> torch.Tensor:
        return _expand(torch.softmax(-d / self.temperature, dim=1), n)

    def weights(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        return self.weights_from_distances(self.distances(x, batch_size), x.shape[0])


def first_layer_features(pooled: dict) -> torch.Tensor:
    """Classifier features ``(G, 2C)``: per-channel mean and log-variance at the first banked layer."""
    mean, var = next(iter(pooled.values()))
    return torch.cat([mean, torch.log(var + 1e-5)], 1).float()


class StatisticsClassifier(Router):
    """Multinomial logistic regression from first-layer statistics to a bank index.

    :meth:`fit` takes, per bank, inputs known to belong to it (from its training distribution) and
    the inference ``batch_size`` the classifier will serve (features of a batch differ from a
    single image's). Features are standardized with the training mean and standard deviation;
    the weights are fitted with L-BFGS on cross-entropy plus ``l2 * ||W||^2``.
    """

    def __init__(self, bank: StatisticBank, l2: float = 1e-3, iterations: int = 100):
        self.bank, self.l2, self.iterations = bank, float(l2), int(iterations)
        self.linear: nn.Linear | None = None

    def features_from_moments(self, moments: dict, batch_size: int | None) -> torch.Tensor:
        return first_layer_features(pool_moments(moments, batch_size))

    def fit_features(self, features: torch.Tensor, labels: torch.Tensor, seed_parts: tuple = (0,)) -> "StatisticsClassifier":
        """Fit on ``features (M, 2C)`` and bank ``labels (M,)``. Deterministic (zero initialisation)."""
        self.mu, self.sd = features.mean(0), features.std(0).clamp_min(1e-6)
        z = (features - self.mu) / self.sd
        lin = nn.Linear(z.shape[1], self.bank.n_banks)
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
        opt = torch.optim.LBFGS(lin.parameters(), max_iter=self.iterations, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(lin(z), labels) + self.l2 * (lin.weight ** 2).sum()
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        self.linear = lin.requires_grad_(False)
        return self

    def fit(self, inputs: list[torch.Tensor], batch_size: int | None = 1) -> "StatisticsClassifier":
        """Fit on ``inputs[k] (N_k, C, H, W)``, known to come from bank ``k``'s distribution.

        Raises ``ValueError`` unless one tensor per bank is given.
        """
        if len(inputs) != self.bank.n_banks:
            raise ValueError(f"fit needs one input tensor per bank ({self.bank.n_banks}), got {len(inputs)}")
        feats, labels = [], []
        for k, x in enumerate(inputs):
            f = self.features_from_moments(sample_moments(self.bank, x, "first"), batch_size)
            feats.append(f)
            labels.append(torch.full((len(f),), k, dtype=torch.long))
        return self.fit_features(torch.cat(feats), torch.cat(labels))

    def decide(self, features: torch.Tensor) -> torch.Tensor:
        if self.linear is None:
            raise RuntimeError("StatisticsClassifier: call fit first")
        return self.linear((features - self.mu) / self.sd).argmax(1)

    def route(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        f = self.features_from_moments(sample_moments(self.bank, x, "first"), batch_size)
        return _expand(self.decide(f), x.shape[0])


@torch.no_grad()
def routed_forward(bank: StatisticBank, x: torch.Tensor, router: Router, batch_size: int | None = None) -> torch.Tensor:
    """The model's eval-mode output on ``x`` with each inference batch normalised by the bank its router picks.

    Hard routers: samples routed to bank ``k`` run under ``bank.use(k)`` (eval-mode BatchNorm treats
    samples independently, so grouping them changes no sample's computation). :class:`SoftMixture`:
    one pass with :meth:`~bnstudy.study.banks.StatisticBank.use_blend`. Train/eval flags are restored.
    """
    flags = {m: m.training for m in bank.model.modules()}
    try:
        nn.Module.train(bank.model, False)
        if isinstance(router, SoftMixture):
            with bank.use_blend(router.weights(x, batch_size)):
                return bank.model(x)
        idx = router.route(x, batch_size)
        out = None
        for k in idx.unique().tolist():
            sel = (idx == k).nonzero().flatten()
            with bank.use(k):
                y = bank.model(x[sel])
            if out is None:
                out = y.new_empty((x.shape[0],) + y.shape[1:])
            out[sel] = y
        return out
    finally:
        for m, t in flags.items():
            m.training = t


__all__ = ["sample_moments", "pool_moments", "statistic_distance", "Router", "OracleRouter", "NearestStatistics",
           "SoftMixture", "StatisticsClassifier", "routed_forward", "first_layer_features", "DISTANCES",
           "LAYER_CHOICES"]
