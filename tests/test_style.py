"""bnstudy.study.style: one palette per concept, the same colour for a name in every chapter."""

import pytest

from bnstudy.study import style
from bnstudy.study.config import FINETUNE_STRATEGIES
from bnstudy.study.modes import MODE_NAMES


def test_every_concept_covers_the_names_the_study_uses():
    assert set(style.MODES) == set(MODE_NAMES)
    assert set(FINETUNE_STRATEGIES) <= set(style.STRATEGIES)
    from bnstudy.study.experiments.heads import run as heads
    from bnstudy.study.experiments.real_data import run as real_data
    from bnstudy.study.experiments.unknown_task import run as unknown_task
    assert set(heads.OPTIMIZERS) <= set(style.OPTIMIZERS) and set(heads.HEADS) <= set(style.HEADS)
    assert set(real_data.NETWORKS) <= set(style.NETWORKS)
    assert set(unknown_task.CONDITIONS) <= set(style.ROUTERS)


def test_colours_are_distinct_within_a_concept_and_stable_across_concepts():
    for concept, pal in style.PALETTES.items():
        assert len(set(pal.values())) == len(pal), concept
    # the same condition is the same colour wherever it appears
    assert style.ROUTERS["train_mode"] == style.MODES["train_mode"] == style.STATISTICS["batch"]
    assert style.ROUTERS["pinned"] == style.MODES["backbone_eval"] == style.STATISTICS["running"]


def test_unknown_names_raise_naming_the_choices():
    with pytest.raises(KeyError, match="names: \\['train_mode'"):
        style.color("mode", "frozen")
    with pytest.raises(KeyError, match="concepts:"):
        style.color("colour", "x")
    assert style.palette("optimizer", ["adam", "sgd"]) == {"adam": style.OPTIMIZERS["adam"],
                                                           "sgd": style.OPTIMIZERS["sgd"]}


def test_fonts_are_at_least_the_minimum():
    assert all(v >= style.MIN_FONT_PT for k, v in style.rc().items() if "size" in k)


def test_a_kind_of_shift_has_one_colour_in_chapters_3_and_7():
    assert style.color("shift", "gaussian_noise") == style.color("shift", "noise") == style.color("shift", "same_noise")
    assert style.color("shift", "same_both") == style.color("shift", "both")
    assert list(style.sequential([2, 8, 32])) == [2, 8, 32] and len(set(style.sequential([2, 8, 32]).values())) == 3
