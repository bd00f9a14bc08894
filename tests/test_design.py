"""The generic parameter check of a chapter's config (bnstudy.study.design, issue 33)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bnstudy.study.config import check_seeds
from bnstudy.study.design import ChapterConfig, Rule, check_like


@dataclass(frozen=True)
class Toy(ChapterConfig):
    PROFILES = {"quick": {}, "full": {}}
    NORMALIZE = {"seeds": check_seeds}
    RULES = (Rule("steps", "an integer >= 1", lambda c: c.steps >= 1),
             Rule("n_eval", "a multiple of every batch", lambda c: all(c.n_eval % b == 0 for b in c.batches)))

    profile: str = "quick"
    seeds: tuple = (0, 1)
    steps: int = 10
    lr: float = 0.1
    batches: tuple = (1, 4)
    levels: tuple = ()
    shuffle: bool = True
    kind: str = "a"
    n_eval: int = 4


@pytest.mark.parametrize("override, message", [
    (dict(profile="fast"), "profile='fast' is not allowed; choose one of ['quick', 'full']"),
    (dict(steps=2.5), "steps must be an integer, got 2.5"),
    (dict(steps=0), "steps must be an integer >= 1, got 0"),
    (dict(lr="0.1"), "lr must be a finite number, got '0.1'"),
    (dict(lr=float("nan")), "lr must be a finite number, got nan"),
    (dict(batches=[1, 2.5]), "batches[1] must be an integer, got 2.5"),
    (dict(batches=(3,), n_eval=10), "n_eval must be a multiple of every batch, got 10"),
    (dict(levels=("x",)), "levels[0] must be a finite number, got 'x'"),
    (dict(shuffle=1), "shuffle must be True or False, got 1"),
    (dict(kind=3), "kind must be a string, got 3"),
    (dict(seeds=1), "seeds must name at least 2 seeds"),
    (dict(batches=(1, 1)), "batches must not repeat a value, got [1, 1]"),
])
def test_each_value_is_checked_against_its_defaults_type_and_the_rules(override, message):
    with pytest.raises(ValueError) as e:
        Toy(**{"n_eval": 4, **override})
    assert str(e.value).startswith(message)


def test_values_come_back_in_the_defaults_type_and_describe_prints_them_resolved():
    t = Toy(seeds=3, steps=4.0, lr=1, batches=[1, 2], levels=[0.5, 2], n_eval=4)
    assert t.seeds == (0, 1, 2) and t.steps == 4 and type(t.steps) is int and t.batches == (1, 2)
    assert type(t.lr) is float and t.levels == (0.5, 2.0)
    assert t.describe() == ("profile=quick, 3 seeds (0-2), steps=4, lr=1, batches=[1, 2], levels=[0.5, 2.0], "
                            "shuffle=True, kind=a, n_eval=4")
    assert check_like("x", [1, 2], (0.5,)) == (1.0, 2.0) and check_like("x", object, None) is object



def test_a_refusal_shows_a_long_list_by_its_ends():
    """New-user report (stop 53): ``seeds=1001`` refused with all 1,001 seeds in the message."""
    from bnstudy.study.experiments.unknown_task import run as ch06
    with pytest.raises(ValueError, match=r"got \[0, 1, 2, 3, 4, \.\.\., 999, 1000\] \(1001 values\)$"):
        ch06.make_config("quick", seeds=1001)
    with pytest.raises(ValueError, match=r"got \[0, 10\]$"):  # a short one whole
        ch06.make_config("quick", seeds=(0, 10))
