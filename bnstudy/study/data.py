"""Real handwritten digits as two tasks, and image corruptions at graded severities.

The data are scikit-learn's bundled copy of the UCI optical handwritten digits
(``sklearn.datasets.load_digits``): 1,797 real scans of digits 0-9, each 8x8 pixels with
integer intensities 0..16, shipped inside the package (no download).

*Preparation* (:func:`load_digits_images`): intensities divided by 16 (pixels in [0, 1]),
upsampled to ``size x size`` by bilinear interpolation (``torch.nn.functional.interpolate``,
``align_corners=False``), and the gray channel repeated to 3 channels so that torchvision's
3-channel stems apply unchanged. Corruptions act on these [0, 1] images; the networks then see
``(x - MEAN) / STD`` with one scalar mean and standard deviation of task A's training images
(:func:`normalise`), as torchvision's ``Normalize`` does per channel.

*Tasks* (:func:`digits_tasks`): task A is digits 0-4, task B digits 5-9 relabelled 0-4 (the old
head and the new head of chapter 1 each have 5 classes). *Held-out sets*: one fixed split for
every seed, drawn once with :func:`bnstudy.study.tasks.generator` ``("digits", "split")``: per digit,
:data:`HELD_OUT_PER_CLASS` images are held out and the rest train, so training and held-out sets
are disjoint (counts in :func:`split_counts`).

*Corruptions* (:func:`corrupt`), after the MNIST-C (Mu & Gilmer, 2019) and CIFAR-10-C
(Hendrycks & Dietterich, 2019) benchmarks, on [0, 1] images with results clipped to [0, 1]:
``brightness`` adds a constant; ``contrast`` scales each image about its own mean;
``gaussian_noise`` adds N(0, s^2) per pixel; ``blur`` convolves with a Gaussian of std s pixels;
``inversion`` mixes the image with its negative, ``(1 - s) x + s (1 - x)`` (s = 1: fully inverted).
Severities 1..5 index :data:`SEVERITY_LEVELS`; severity 0 is no corruption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tasks import generator

CORRUPTIONS = ("brightness", "contrast", "gaussian_noise", "blur", "inversion")
#: The corruption parameter at severities 1..5 (pixels in [0, 1]; blur: std in pixels of the resized image).
#: Brightness and contrast follow CIFAR-10-C's ranges; noise and blur are stronger, as in MNIST-C, because
#: digits are high-contrast strokes; inversion runs up to the full negative.
SEVERITY_LEVELS = {
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "gaussian_noise": (0.08, 0.16, 0.24, 0.32, 0.4),
    "blur": (0.5, 0.75, 1.0, 1.5, 2.0),
    "inversion": (0.2, 0.4, 0.6, 0.8, 1.0),
}
MAX_SEVERITY = 5
#: Held-out images per digit (fixed split); the rest of each digit's ~180 scans train.
HELD_OUT_PER_CLASS = 60
TASK_DIGITS = {"A": (0, 1, 2, 3, 4), "B": (5, 6, 7, 8, 9)}


def load_digits_images(size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as ``x (1797, 3, size, size)`` float32 in [0, 1] and ``y (1797,)`` int64 digits 0-9.

    Raises ``ValueError`` unless ``size >= 8``; ``ImportError`` without scikit-learn.
    """
    if not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an integer >= 8 (the scans are 8x8), got {size!r}")
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    return x.repeat(1, 3, 1, 1).contiguous(), torch.tensor(d.target, dtype=torch.long)


def held_out_mask(y: torch.Tensor, per_class: int = HELD_OUT_PER_CLASS) -> torch.Tensor:
    """Boolean mask ``(N,)``: ``per_class`` images of each digit held out, chosen once by a fixed generator."""
    g = generator("digits", "split")
    mask = torch.zeros(len(y), dtype=torch.bool)
    for k in range(10):
        idx = torch.nonzero(y == k).flatten()
        if len(idx) <= per_class:
            raise ValueError(f"digit {k} has {len(idx)} images; cannot hold out {per_class}")
        mask[idx[torch.randperm(len(idx), generator=g)[:per_class]]] = True
    return mask


@dataclass(frozen=True)
class DigitsTask:
    """One task's images (clean, [0, 1]) and labels 0..4: ``x_train (N, 3, S, S)``, ``x_test (M, 3, S, S)``."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def n_classes(self) -> int:
        return 5


def digits_tasks(size: int = 16) -> dict[str, DigitsTask]:
    """Tasks ``"A"`` (digits 0-4) and ``"B"`` (digits 5-9, labels 0-4), split by :func:`held_out_mask`."""
    x, y = load_digits_images(size)
    test = held_out_mask(y)
    out = {}
    for name, digits in TASK_DIGITS.items():
        sel = torch.isin(y, torch.tensor(digits))
        lab = y - digits[0]
        out[name] = DigitsTask(name, x[sel & ~test], lab[sel & ~test], x[sel & test], lab[sel & test])
    return out


def split_counts(size: int = 16) -> dict[str, int]:
    """Image counts: ``A_train``, ``A_test``, ``B_train``, ``B_test``, ``total``."""
    t = digits_tasks(size)
    out = {f"{k}_{s}": len(getattr(v, f"y_{s}")) for k, v in t.items() for s in ("train", "test")}
    out["total"] = sum(out.values())
    return out


def _gaussian_kernel(sigma: float) -> torch.Tensor:
    r = max(1, int(round(3 * sigma)))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return k / k.sum()


def corrupt(x: torch.Tensor, corruption: str, severity: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """``x (N, C, H, W)`` in [0, 1] with ``corruption`` at ``severity`` (0: unchanged copy; 1..5), clipped to [0, 1].

    ``gen`` draws the Gaussian noise (required for ``gaussian_noise`` at severity > 0). Blur pads by
    reflection. Raises ``ValueError`` for an unknown corruption or a severity outside 0..5.
    """
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption={corruption!r} is not allowed; choose one of {list(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 0 <= severity <= MAX_SEVERITY:
        raise ValueError(f"severity must be an integer in 0..{MAX_SEVERITY}, got {severity!r}")
    if severity == 0:
        return x.clone()
    s = SEVERITY_LEVELS[corruption][severity - 1]
    if corruption == "brightness":
        out = x + s
    elif corruption == "contrast":
        m = x.mean(dim=(1, 2, 3), keepdim=True)
        out = (x - m) * s + m
    elif corruption == "gaussian_noise":
        if gen is None:
            raise ValueError("gaussian_noise needs a generator (gen=) for its noise")
        out = x + s * torch.randn(x.shape, generator=gen)
    elif corruption == "blur":
        k = _gaussian_kernel(s)
        c, r = x.shape[1], (len(k) - 1) // 2
        xp = F.pad(x, (r, r, r, r), mode="reflect") if r < min(x.shape[-2:]) else F.pad(x, (r, r, r, r), mode="replicate")
        out = F.conv2d(xp, k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
        out = F.conv2d(out, k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)
    else:
        out = (1 - s) * x + s * (1 - x)
    return out.clamp(0, 1)


def pixel_statistics(task_a: DigitsTask) -> tuple[float, float]:
    """Mean and standard deviation of all pixels of task A's clean training images."""
    return float(task_a.x_train.mean()), float(task_a.x_train.std())


def normalise(x: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """``(x - mean) / std``: what the networks see."""
    return (x - mean) / std


def corrupted_task_b(tasks: dict[str, DigitsTask], corruption: str, severity: int, seed: int) -> tuple:
    """Task B's training and held-out images under ``corruption`` at ``severity``, normalised with task A's pixels.

    Returns ``(x_train, y_train, x_test, y_test)``. The noise of ``gaussian_noise`` is drawn once per
    (seed, corruption, severity) for the training pool and once per (corruption, severity) for the
    held-out set (the same held-out images for every seed), like a fixed corrupted benchmark set.
    """
    a, b = tasks["A"], tasks["B"]
    mean, std = pixel_statistics(a)
    xtr = corrupt(b.x_train, corruption, severity, generator(seed, "corrupt", corruption, severity, "train"))
    xte = corrupt(b.x_test, corruption, severity, generator("digits", "corrupt", corruption, severity, "test"))
    return normalise(xtr, mean, std), b.y_train, normalise(xte, mean, std), b.y_test
