"""Draw the intro's freeze-modes diagram (_static/freeze-modes.svg) and the README thumbnail.

Run from the repository root: `.venv/bin/python docs/make_static_images.py [figures/01-accuracy.png]`.
Both outputs are committed; rerun only when the picture should change.
"""
import sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

OUT = Path("_static")
TRAIN, EVAL, COPY = "#e69f00", "#56b4e9", "#009e73"  # colorblind-safe (Okabe-Ito)

MODES = [
    ("train_mode", "gradients off only", [("backbone BN", TRAIN, "train: stats drift to task B"),
                                          ("new head", TRAIN, "trains on task B")]),
    ("backbone_eval", "backbone pinned in eval", [("backbone BN", EVAL, "eval: stats fixed"),
                                                  ("new head", TRAIN, "trains on task B")]),
    ("all_eval", "whole model pinned in eval", [("backbone BN", EVAL, "eval: stats fixed"),
                                                ("new head", EVAL, "trains, but in eval mode")]),
    ("separate_stats", "shared weights, own BN buffers", [("task A's BN", EVAL, "original stats, kept"),
                                                          ("task B's BN copy", COPY, "own stats, follow task B")]),
]


def draw(path: Path) -> None:
    # 2 x 2 panels: at the book's text width (about 700 px) every label stays readable.
    fig, axes = plt.subplots(2, 2, figsize=(7.2, 5.0))
    for ax, (name, sub, boxes) in zip(axes.flat, MODES):
        ax.set_xlim(0, 1); ax.set_ylim(0, 1); ax.axis("off")
        ax.text(0.5, 0.95, name, ha="center", va="top", fontsize=12, family="monospace", weight="bold")
        ax.text(0.5, 0.80, sub, ha="center", va="top", fontsize=9, color="#333333")
        for i, (label, color, note) in enumerate(boxes):
            y = 0.42 - i * 0.34
            ax.add_patch(FancyBboxPatch((0.06, y), 0.88, 0.26, boxstyle="round,pad=0.01,rounding_size=0.04",
                                        fc=color, ec="black", lw=0.8, alpha=0.85))
            ax.text(0.5, y + 0.175, label, ha="center", va="center", fontsize=9.5, weight="bold")
            ax.text(0.5, y + 0.075, note, ha="center", va="center", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="black", lw=0.6) for c in (TRAIN, EVAL, COPY)]
    fig.legend(handles, ["train mode (batch statistics, buffers updated)", "eval mode (stored statistics)",
                         "train mode on a private copy of the buffers"],
               loc="lower center", ncol=1, fontsize=9, frameon=False, bbox_to_anchor=(0.5, -0.09))
    fig.subplots_adjust(left=0.01, right=0.99, top=0.98, bottom=0.08, wspace=0.06, hspace=0.12)
    matplotlib.rcParams["svg.fonttype"] = "none"
    fig.savefig(path, format="svg", bbox_inches="tight")
    plt.close(fig)


def thumbnail(src: Path, dst: Path, width: int = 560) -> None:
    """A small palette PNG of a book figure for the README."""
    from PIL import Image
    img = Image.open(src).convert("RGB")
    img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    img.quantize(colors=64).save(dst, optimize=True)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    draw(OUT / "freeze-modes.svg")
    if len(sys.argv) > 1:
        thumbnail(Path(sys.argv[1]), Path("docs/accuracy-thumbnail.png"))
