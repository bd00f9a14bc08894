"""One palette per concept, shared by every figure of the book (issue 24): a freeze mode, an optimizer, a
fine-tuning strategy, a router, a network or a head has the same colour in every chapter.

Colours come from seaborn's ``colorblind`` palette; :func:`color` raises for a name that has none, so a new
condition cannot silently get matplotlib's default cycle. Figures are drawn at :data:`COLUMN_WIDTH_IN` with fonts
of at least :data:`MIN_FONT_PT` points.
"""

from __future__ import annotations

#: The book's text column in inches (the Jupyter Book theme's ~700 px at 96 dpi).
COLUMN_WIDTH_IN = 7.3
#: The smallest font a figure may use, in points at column width.
MIN_FONT_PT = 9
#: A phone's figure width in CSS px, and the smallest text height in px a figure read there keeps.
PHONE_WIDTH_PX, PHONE_MIN_FONT_PX = 360, 9.0

_CB = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9"]
BLUE, ORANGE, GREEN, VERMILLION, PURPLE, BROWN, PINK, GREY, YELLOW, SKY = _CB

#: The four freeze modes (bnstudy.study.modes): train mode (drifting statistics) is blue everywhere; the pinned
#: backbone orange; the whole model in eval mode green; task-B's own statistics purple.
MODES = {"train_mode": BLUE, "backbone_eval": ORANGE, "all_eval": GREEN, "separate_stats": PURPLE}
#: Which statistics a layer normalises with: batch statistics as train mode, running statistics as pinned.
STATISTICS = {"batch": MODES["train_mode"], "running": MODES["backbone_eval"], "per-sample": GREY}
#: Head optimizers (chapter 4; chapter 1's head sweep uses the same names).
OPTIMIZERS = {"sgd": "#222222", "sgd_plain": GREY, "adam": VERMILLION}
#: Fine-tuning strategies (chapter 5): BatchNorm variants in warm colours, per-sample norms in greens/purples.
STRATEGIES = {"bn_frozen": ORANGE, "stats_frozen": YELLOW, "adabn": BROWN, "bn_train": BLUE, "to_group": GREEN,
              "to_layer": PURPLE, "group_pretrained": "#016b4f", "layer_pretrained": "#8a3f82",
              "bn_train_precise": "#0b3d66"}
#: Routers to per-task statistics and their baselines (chapter 6).
ROUTERS = {"nearest_first": GREEN, "nearest_all": "#016b4f", "classifier": VERMILLION, "mixture": BROWN, "oracle": "#222222",
           "train_mode": MODES["train_mode"], "pinned": MODES["backbone_eval"]}
#: Test-time methods (chapter 8), coloured as the freeze modes and chapter 6's routers they correspond to.
TEST_TIME = {"source": MODES["backbone_eval"], "test_batch": MODES["train_mode"], "prior_tuned": SKY, "dua": PURPLE,
             "tent_tuned": VERMILLION, "routed": GREEN, "oracle": "#222222"}
#: What is trained (chapter 9): pinned statistics in oranges, train mode in blues.
TRAINING = {"head": ORANGE, "head_train": SKY, "affine_pinned": BROWN, "affine_train": BLUE, "first_block": GREEN,
            "full": "#222222"}
#: Frankle et al.'s conditions (chapter 9, part 3).
FRANKLE = {"bn_affine": BLUE, "random_same": GREY, "head": ORANGE, "all": "#222222"}
#: Networks (chapter 7).
NETWORKS = {"small_cnn": GREY, "resnet18": BLUE, "mobilenet_v3_small": VERMILLION}
#: Heads (chapter 4).
HEADS = {"linear": GREY, "mlp": BLUE, "mlp2": SKY, "mlp_bn": ORANGE, "mlp_ln": GREEN, "std_linear": "#222222",
         "bn_linear": BROWN, "ln_linear": PURPLE}
#: Effects drawn against each other (chapter 3): what drifting statistics cost task A, what they give task B.
EFFECTS = {"cost": VERMILLION, "benefit": BLUE, "net": "#222222"}
#: Reference lines: chance, zero, an equivalence band.
REFERENCE = {"chance": "0.4", "zero": "black", "band": "0.9"}

#: Kinds of input shift (chapter 3's lines, chapter 7's corruptions): one colour per kind in both chapters.
SHIFTS = {"none": "black", "brightness": BLUE, "contrast": ORANGE, "both": GREEN, "blur": PINK, "noise": BROWN,
          "inversion": PURPLE}
#: Other names of the same kinds of shift (chapters 3, 7, 8): :func:`color` gives them their kind's colour.
SHIFT_ALIASES = {"gaussian_noise": "noise", "same_both": "both", "same_noise": "noise", "affine": "both"}

PALETTES = {"mode": MODES, "statistics": STATISTICS, "optimizer": OPTIMIZERS, "strategy": STRATEGIES,
            "router": ROUTERS, "network": NETWORKS, "head": HEADS, "effect": EFFECTS, "reference": REFERENCE,
            "shift": SHIFTS, "test_time": TEST_TIME, "training": TRAINING, "frankle": FRANKLE}


def sequential(values) -> dict:
    """``{value: colour}`` for an ordered quantity (batch sizes, shift strengths, layers), on one sequential scale
    (viridis, dark to light in the order given) in every figure."""
    import seaborn as sns

    values = list(values)
    return dict(zip(values, sns.color_palette("viridis", len(values)).as_hex()))


def color(concept: str, name: str) -> str:
    """The colour of ``name`` (``"train_mode"``) within ``concept`` (``"mode"``). Raises ``KeyError`` naming the
    concept's names when ``name`` has no colour, and the concepts when ``concept`` is unknown."""
    if concept not in PALETTES:
        raise KeyError(f"style.color: unknown concept {concept!r}; concepts: {sorted(PALETTES)}")
    pal = PALETTES[concept]
    if concept == "shift":
        name = SHIFT_ALIASES.get(name, name)
    if name not in pal:
        raise KeyError(f"style.color: {concept} {name!r} has no colour; names: {list(pal)}")
    return pal[name]


def palette(concept: str, names=None) -> dict:
    """``{name: colour}`` for ``concept`` (all its names, or ``names`` in that order; see :func:`color`)."""
    return {n: color(concept, n) for n in (names if names is not None else PALETTES[concept])}


def rc() -> dict:
    """matplotlib rcParams for the book's figures: fonts of at least :data:`MIN_FONT_PT` points."""
    return {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": MIN_FONT_PT,
            "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
            "figure.titlesize": 11}


# chapter 3
#: train_mode's path along each of chapter 3's affine lines: colours no freeze mode uses.
SHIFT_PATHS = {"brightness": SKY, "contrast": BROWN, "both": PINK}
PALETTES["shift_path"] = SHIFT_PATHS
