"""Template classification tasks, input shifts, batch samplers and evaluation sets.

A task has ``n_classes`` fixed random templates of shape ``(3, 32, 32)`` with
entries drawn from N(0, 1); a sample of class ``k`` is ``template[k] + noise * N(0, 1)``
per pixel. An input shift is then applied to every sample:

    x_shifted = contrast * x + brightness

so ``brightness`` is an additive offset (in units of the template's standard
deviation) and ``contrast`` a multiplicative gain (1 = no change). Task A and
task B of a seed use different templates (derived from the seed with different
tags), so a head trained on one says nothing about the other.

All randomness flows from explicit :class:`torch.Generator` objects seeded by
:func:`derive_seed`, never from global RNG state, so a run is reproducible on
its own and packed replicas never share a random stream.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

SAMPLERS = ("shuffled", "class_sorted")
IMAGE_SHAPE = (3, 32, 32)


def derive_seed(*parts) -> int:
    """A 63-bit seed derived from ``parts`` (ints and strings) with SHA-256.

    Different tags give statistically independent streams:
    ``derive_seed(seed, "task", "A")`` and ``derive_seed(seed, "task", "B")``.
    """
    h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def generator(*parts) -> torch.Generator:
    """A CPU :class:`torch.Generator` seeded with ``derive_seed(*parts)``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g


@dataclass(frozen=True)
class TemplateTask:
    """A template classification task with an input shift.

    ``templates``: ``(n_classes, 3, 32, 32)``; ``noise``: per-pixel standard
    deviation of the additive Gaussian noise; ``brightness``/``contrast``: the
    input shift (see module docstring).
    """

    templates: torch.Tensor
    noise: float
    brightness: float = 0.0
    contrast: float = 1.0

    @property
    def n_classes(self) -> int:
        return self.templates.shape[0]

    def sample(self, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Images ``(len(labels), 3, 32, 32)`` for integer ``labels`` ``(N,)``."""
        x = self.templates[labels]
        x = x + self.noise * torch.randn(x.shape, generator=gen)
        return self.contrast * x + self.brightness


def make_task(seed: int, which: str, n_classes: int = 10, noise: float = 1.0,
              brightness: float = 0.0, contrast: float = 1.0) -> TemplateTask:
    """Task ``which`` (any tag, conventionally ``"A"`` or ``"B"``) of ``seed``.

    Raises ``ValueError`` when ``n_classes < 2``, ``noise < 0`` or ``contrast <= 0``
    (a non-positive gain would flip or erase the image).
    """
    if not isinstance(n_classes, int) or n_classes < 2:
        raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise!r}")
    if contrast <= 0:
        raise ValueError(f"contrast must be > 0 (a multiplicative gain), got {contrast!r}")
    g = generator(seed, "templates", which)
    templates = torch.randn((n_classes, *IMAGE_SHAPE), generator=g)
    return TemplateTask(templates, float(noise), float(brightness), float(contrast))


class BatchStream:
    """An endless stream of ``(x, y)`` batches from a task.

    ``sampler="shuffled"``: labels drawn uniformly at random each batch (an
    i.i.d. draw, what BatchNorm's batch statistics assume). ``"class_sorted"``:
    every batch holds a single class, classes cycling in a random order each
    epoch of ``n_classes`` batches, the worst case of a loader that walks a
    dataset sorted by label.
    Raises ``ValueError`` for an unknown sampler or ``batch_size < 1``.
    """

    def __init__(self, task: TemplateTask, batch_size: int, gen: torch.Generator, sampler: str = "shuffled"):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler={sampler!r} is not allowed; choose one of {list(SAMPLERS)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.task, self.batch_size, self.gen, self.sampler = task, batch_size, gen, sampler
        self._order: list[int] = []

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.task.n_classes
        if self.sampler == "shuffled":
            y = torch.randint(k, (self.batch_size,), generator=self.gen)
        else:
            if not self._order:
                self._order = torch.randperm(k, generator=self.gen).tolist()
            y = torch.full((self.batch_size,), self._order.pop(0), dtype=torch.long)
        return self.task.sample(y, self.gen), y


def eval_set(task: TemplateTask, n: int, seed: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed held-out set: ``x (n, 3, 32, 32)``, ``y (n,)`` with balanced classes."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n_eval must be a positive integer, got {n!r}")
    g = generator(seed, "eval", tag)
    y = torch.arange(n) % task.n_classes
    return task.sample(y, g), y


# --- chapter 3 (issue 10): task B with task A's classes, and shifts a BatchNorm layer cannot undo -------------------

#: Which templates task B uses: ``"new"`` its own (tag ``"B"``, today's tasks), ``"same"`` task A's (tag ``"A"``):
#: the same classes as task A seen through the shift, the setting of AdaBN (Li et al., 2016).
TASK_B_CLASSES = ("new", "same")
#: Input corruptions applied after the affine shift: ``"none"``; ``"blur"``, a Gaussian blur of standard
#: deviation ``level`` pixels per channel (reflect padding, kernel radius ``ceil(3 * level)``), which removes
#: fine detail no per-channel affine map can restore; ``"noise"``, extra Gaussian pixel noise of standard
#: deviation ``level``, drawn from the sample's own generator, which no per-channel affine map can remove.
CORRUPTIONS = ("none", "blur", "noise")


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """``x (N, C, H, W)`` blurred per channel by a normalised Gaussian of std ``sigma`` pixels (``0``: ``x``).

    Separable kernel of radius ``ceil(3 sigma)`` with reflect padding (a constant image stays constant).
    Raises ``ValueError`` for a negative ``sigma`` or a radius that reflect padding cannot take (>= H or W).
    """
    if sigma < 0:
        raise ValueError(f"blur sigma must be >= 0, got {sigma!r}")
    if sigma == 0:
        return x
    import math
    import torch.nn.functional as F
    r = max(1, math.ceil(3 * sigma))
    if r >= min(x.shape[-2:]):
        raise ValueError(f"blur sigma={sigma!r} needs a kernel radius {r} below the image size {tuple(x.shape[-2:])}")
    k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=x.dtype) / sigma) ** 2)
    k = k / k.sum()
    c = x.shape[1]
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


@dataclass(frozen=True)
class CorruptedTask(TemplateTask):
    """A :class:`TemplateTask` whose samples are corrupted after the affine shift (see :data:`CORRUPTIONS`).

    ``corruption``: one of :data:`CORRUPTIONS`; ``level``: the blur's std in pixels or the extra noise's std.
    """

    corruption: str = "none"
    level: float = 0.0

    def sample(self, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Images ``(len(labels), 3, 32, 32)``: the shifted sample, then the corruption."""
        x = super().sample(labels, gen)
        if self.corruption == "blur":
            return gaussian_blur(x, self.level)
        if self.corruption == "noise" and self.level > 0:
            return x + self.level * torch.randn(x.shape, generator=gen)
        return x


def make_task_b(seed: int, n_classes: int = 10, noise: float = 1.0, brightness: float = 0.0, contrast: float = 1.0,
                classes: str = "new", corruption: str = "none", level: float = 0.0) -> TemplateTask:
    """Task B of ``seed``: :func:`make_task` with tag ``"B"`` (``classes="new"``) or ``"A"`` (``"same"``: task A's
    templates), shifted by ``contrast * x + brightness`` and then corrupted (:class:`CorruptedTask`).

    With the defaults it returns exactly ``make_task(seed, "B", n_classes, noise, brightness, contrast)``, so
    every run that does not ask for the new options draws the same numbers as before.
    Raises ``ValueError`` for an unknown ``classes`` or ``corruption``, a negative ``level``, and as :func:`make_task`.
    """
    if classes not in TASK_B_CLASSES:
        raise ValueError(f"task_b_classes={classes!r} is not allowed; choose one of {list(TASK_B_CLASSES)}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption={corruption!r} is not allowed; choose one of {list(CORRUPTIONS)}")
    if not level >= 0:
        raise ValueError(f"corruption_level must be >= 0, got {level!r}")
    base = make_task(seed, "B" if classes == "new" else "A", n_classes, noise, brightness, contrast)
    if corruption == "none" or level == 0:
        return base
    return CorruptedTask(base.templates, base.noise, base.brightness, base.contrast, corruption, float(level))


def task_b_of(c) -> TemplateTask:
    """Task B of a run config ``c`` (:class:`bnstudy.study.config.RunConfig` or anything with its fields); the options
    ``task_b_classes``, ``corruption`` and ``corruption_level`` default to today's task B when ``c`` lacks them."""
    return make_task_b(c.seed, c.n_classes, c.noise, c.brightness, c.contrast, getattr(c, "task_b_classes", "new"),
                       getattr(c, "corruption", "none"), getattr(c, "corruption_level", 0.0))

# --- issue 9: finite training sets -----------------------------------------------------------------------------------

def train_set(task: TemplateTask, n: int, seed: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A finite training set drawn once, as a real data set is: ``x (n, 3, 32, 32)``, ``y (n,)``.

    Classes are balanced (``n // n_classes`` or one more each) in a random order; each sample's
    noise is drawn once, from its own generator ``(seed, "train_set", tag)``, so the set is a
    fixed function of the seed, the task and ``n``. Raises ``ValueError`` for ``n < 1``.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"train_size must be a positive integer, got {n!r}")
    g = generator(seed, "train_set", tag)
    y = (torch.arange(n) % task.n_classes)[torch.randperm(n, generator=g)]
    return task.sample(y, g), y


class SetBatches:
    """Endless batches of ``batch_size`` from a finite set ``x (n, ...)``, ``y (n,)``: the sampler of a DataLoader.

    ``sampler="shuffled"``: a fresh random permutation per epoch, consecutive batches of it, an
    incomplete last batch dropped (``DataLoader(shuffle=True, drop_last=True)``). ``"class_sorted"``:
    every batch holds one class, classes cycling in a random order per round of ``n_classes``
    batches, each class's samples taken in a per-class random order that restarts when used up
    (the worst case of a loader walking a set sorted by label). :meth:`next_indices` gives the
    rows of the set a batch uses (for cached features); :meth:`next` the batch itself.
    Raises ``ValueError`` for an unknown sampler, ``batch_size < 1`` or ``batch_size > n`` (shuffled).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, gen: torch.Generator,
                 sampler: str = "shuffled"):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler={sampler!r} is not allowed; choose one of {list(SAMPLERS)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if sampler == "shuffled" and batch_size > len(y):
            raise ValueError(f"batch_size must be <= train_size with the shuffled sampler, got batch_size="
                             f"{batch_size} and train_size={len(y)}")
        self.x, self.y, self.batch_size, self.gen, self.sampler = x, y, batch_size, gen, sampler
        self._perm, self._pos = torch.empty(0, dtype=torch.long), 0
        self._order: list[int] = []
        self._class_rows = [torch.nonzero(y == k).flatten() for k in range(int(y.max()) + 1)]
        self._class_perm: dict[int, torch.Tensor] = {}
        self._class_pos: dict[int, int] = {}

    def next_indices(self) -> torch.Tensor:
        """Row indices ``(batch_size,)`` of the next batch."""
        b = self.batch_size
        if self.sampler == "shuffled":
            if self._pos + b > len(self._perm):
                self._perm, self._pos = torch.randperm(len(self.y), generator=self.gen), 0
            idx = self._perm[self._pos:self._pos + b]
            self._pos += b
            return idx
        if not self._order:
            self._order = torch.randperm(len(self._class_rows), generator=self.gen).tolist()
        k = self._order.pop(0)
        rows, out, need = self._class_rows[k], [], b
        while need:
            if self._class_pos.get(k, len(rows)) >= len(rows):
                self._class_perm[k], self._class_pos[k] = rows[torch.randperm(len(rows), generator=self.gen)], 0
            take = self._class_perm[k][self._class_pos[k]:self._class_pos[k] + need]
            self._class_pos[k] += len(take)
            out.append(take)
            need -= len(take)
        return torch.cat(out)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.next_indices()
        return self.x[idx], self.y[idx]
