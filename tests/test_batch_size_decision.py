"""Chapter 5's batch-size-2 decision (issue 34): the tuned-rate grid and its extensions, the verdicts against
BatchNorm in train mode, breaks at tuned rates, the one answer's sentences, and the pool of precise BN's reference."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from bnstudy.study.experiments.batch_size import decision, findings, run
from bnstudy.study.tasks import generator, make_task


def _cfg(**kw):
    base = dict(seeds=3, batch_sizes=(2, 8, 32), samples=64, stage1_steps=5, noise_pool=512, precise_samples=(32, 64),
                precise_pool=256, tune_batch_sizes=(2, 32), lr_factors=(0.5, 1.0, 2.0), budget_steps=4,
                decision_batch_sizes=(2, 32), grid_extensions=2, strategies=("bn_train", "stats_frozen"))
    base.update(kw)
    return run.make_config("quick", **base)


# --- configuration ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,value,words", [("budget_steps", 0, "budget_steps"),
                                              ("decision_batch_sizes", (2, 48), "decision_batch_sizes"),
                                              ("grid_extensions", -1, "grid_extensions"),
                                              ("precise_pool", 255, "precise_pool"),
                                              ("noise_pool", 513, "noise_pool")])
def test_bad_decision_settings_are_refused_naming_the_parameter(name, value, words):
    with pytest.raises(ValueError, match=words):
        _cfg(**{name: value})


def test_budgets_set_the_samples_of_a_run_and_precise_after_scores_bn_train_runs():
    cfg = _cfg()
    assert cfg.budget_samples("samples", 2) == 64 and cfg.budget_samples("samples", 32) == 64
    assert cfg.budget_samples("steps", 2) == 8 and cfg.budget_samples("steps", 32) == 128
    with pytest.raises(ValueError, match="budget"):
        cfg.budget_samples("epochs", 2)
    c = cfg.decision_config(("steps", 32, "shifted", run.PRECISE_AFTER), 1000, 2.0)
    assert c.strategy == "bn_train" and c.samples == 128 and c.batch_size == 32
    assert c.lr == pytest.approx(2.0 * cfg.lr_for(32))
    assert run.score_column(run.PRECISE_AFTER) == "target_restat" and run.score_column("bn_train") == "target"
    arms = {cell[3] for cell in cfg.decision_cells()}
    assert arms == {"bn_train", "stats_frozen", run.PRECISE_AFTER}


# --- precise BN's reference pool (the reported fault: precise_pool < 512 crashed) -------------------------------------

def test_pool_is_the_streams_images_and_any_even_size_works():
    task = make_task(0, "A", 10, 3.0)
    whole = run._pool(task, 1024, generator(0, "precise", "reference"))
    streamed = torch.cat(list(run._stream(task, 1024, 512, generator(0, "precise", "reference"))))
    assert torch.equal(whole, streamed)
    for n in (2, 256, 600):  # below one chunk of 512, and not a multiple of it
        x = run._pool(task, n, generator(0, "precise", "reference"))
        assert x.shape[0] == n and torch.equal(x, whole[:n])


# --- the tuned-rate grid ----------------------------------------------------------------------------------------------

def _fake_sweep(peak: dict, diverge_above: float = math.inf):
    """A stand-in for run()'s sweep: score peaks at ``peak[(strategy)]`` (a factor) in log distance, no training."""
    calls = []

    def sweep(cfgs, desc, factor=False):
        calls.append((desc, len(cfgs), len(set(cfgs))))
        rows = []
        for c in cfgs:
            f = c.lr / (0.01 * c.batch_size / 32)
            p = peak[c.strategy]
            acc = 0.9 - 0.1 * abs(math.log2(f / p)) + 0.001 * (c.seed % 7)
            rows.append(dict(seed=c.seed, strategy=c.strategy, batch_size=c.batch_size, samples=c.samples, lr=c.lr,
                             brightness=c.brightness, contrast=c.contrast, n_classes=c.n_classes,
                             target=acc if f <= diverge_above else 0.1, target_restat=acc + 0.01 if
                             c.strategy == "bn_train" else math.nan, diverged=f > diverge_above, wall_s=1.0))
        out = pd.DataFrame(rows)
        names = {v: k for k, v in run.TARGETS.items()}
        out["target_name"] = [names[(b, ct)] for b, ct in zip(out.brightness, out.contrast)]
        return out
    sweep.calls = calls
    return sweep


def test_grid_grows_past_an_edge_until_the_best_rate_is_inside_and_reported_runs_use_it():
    cfg = _cfg(grid_extensions=3)
    sweep = _fake_sweep({"bn_train": 8.0, "stats_frozen": 1.0})
    check, rep = run.decision_tables(cfg, sweep)
    best = run.best_factors(check)
    bt = best[best.arm == "bn_train"]
    # 2 -> 4 -> 8 -> 16: the peak at 8 is inside after three extensions
    assert set(bt.lr_factor) == {8.0} and not bt.at_edge.any() and set(bt.grid_high) == {16.0}
    sf = best[best.arm == "stats_frozen"]
    assert set(sf.lr_factor) == {1.0} and set(sf.grid_low) == {0.5} and set(sf.grid_high) == {2.0}
    assert set(rep.seed) == set(cfg.seeds) and not set(rep.seed) & set(cfg.tune_seeds)
    for r in rep.itertuples():
        assert r.lr_factor == {"bn_train": 8.0, run.PRECISE_AFTER: 8.0, "stats_frozen": 1.0}[r.arm]
        assert r.score == (r.target_restat if r.arm == run.PRECISE_AFTER else r.target)
    # a shared config runs once: bn_train and its precise-BN arm ask for the same runs
    assert all(n == distinct for _, n, distinct in sweep.calls)
    n_rep = sum(n for desc, n, _ in sweep.calls if "reported" in desc)
    assert n_rep == len(cfg.seeds) * 2 * 2 * 2 * 2  # seeds x budgets x batch sizes x targets x {bn_train, stats_frozen}
    assert len(rep) == len(cfg.seeds) * len(cfg.decision_cells())  # the precise-BN arm reads the bn_train runs


def test_a_rate_still_at_the_edge_after_the_extensions_is_flagged_and_named():
    cfg = _cfg(grid_extensions=1)
    check, rep = run.decision_tables(cfg, _fake_sweep({"bn_train": 64.0, "stats_frozen": 1.0}))
    best = run.best_factors(check)
    assert best[best.arm == "bn_train"].at_edge.all() and set(best[best.arm == "bn_train"].lr_factor) == {4.0}
    d = decision.decision(rep, check, 0.02)
    edges = decision.edge_cells(d)
    assert set(edges.arm) == {"bn_train", run.PRECISE_AFTER}
    assert "still at an end of their grid" in decision.words(d)["edges"]


def test_a_diverging_rate_is_never_chosen():
    cfg = _cfg(grid_extensions=3)
    check, _ = run.decision_tables(cfg, _fake_sweep({"bn_train": 8.0, "stats_frozen": 1.0}, diverge_above=2.0))
    best = run.best_factors(check)
    assert (best[best.arm == "bn_train"].lr_factor <= 2.0).all()


# --- verdicts ---------------------------------------------------------------------------------------------------------

def _reported(means: dict, sd: float = 0.005, seeds=range(10), large_means: dict | None = None):
    """Reported decision rows: arm -> mean accuracy at batch 2 (and at 256 from ``large_means``), both budgets,
    both targets; per-seed noise shared across arms (paired)."""
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        common = rng.normal(0, 0.03)
        for bu in run.BUDGETS:
            for t in run.TARGETS:
                for b, mm in ((2, means), (256, large_means or means)):
                    for a, m in mm.items():
                        v = m + common + rng.normal(0, sd)
                        rows.append(dict(seed=s, budget=bu, batch_size=b, target_name=t, arm=a, score=v, target=v,
                                         lr=0.001, lr_factor=1.0, diverged=False, n_classes=10, wall_s=1.0,
                                         strategy=run.run_strategy(a), samples=64))
    return pd.DataFrame(rows)


def _check(rep):
    c = rep[rep.seed < 2].copy()
    c["seed"] += 1000
    return pd.concat([c.assign(lr_factor=f) for f in (0.5, 1.0, 2.0)], ignore_index=True)


def test_a_strategy_clearly_above_train_mode_is_recommended_with_its_verdicts():
    rep = _reported({"bn_train": 0.70, "stats_frozen": 0.80, "adabn": 0.60})
    d = decision.decision(rep, _check(rep), 0.02)
    v = dict(zip(d["claims"].key, d["claims"].verdict))
    assert v["decision_samples_close_stats_frozen"] == "above BN in train mode"
    assert v["decision_samples_close_adabn"] == "below BN in train mode"
    assert v["decision_best_samples_close"] == "best above the runner-up"
    a = d["answers"][("samples", "close")]
    assert a["best"] == "stats_frozen" and a["runner_up"] == "bn_train" and not a["near_chance"]
    w = decision.words(d)
    assert "BN stats frozen, affine trained" in w["use"] and "pin_norm_eval" in w["code"]
    assert w["depends"].startswith("The answer is the same on both targets")
    assert "a strategy is shown above chance there, a fixed-samples leader is also among the leaders" in w["depends"]
    assert "BN stats frozen, affine trained" in w["use"] and "three-block network" in w["use"]  # scoped, with its rate
    assert "times the linear-scaling rate" in w["use"]
    # one Bonferroni family over every comparison of the decision
    fam = d["claims"][d["claims"].family == "decision"]
    assert len(fam) == 4 * (2 + 1) and np.allclose(fam.confidence, 1 - 0.05 / len(fam))


def test_equal_strategies_are_called_equivalent_within_the_margin_not_a_win():
    rep = _reported({"bn_train": 0.80, "stats_frozen": 0.8001}, sd=0.001)
    d = decision.decision(rep, _check(rep), 0.02)
    v = dict(zip(d["claims"].key, d["claims"].verdict))
    assert v["decision_samples_close_stats_frozen"] == "equivalent within ±0.02"
    assert "against the runner-up (BN in train mode): **equivalent within ±0.02**" in decision.words(d)["answer"]


def test_near_chance_cells_recommend_nothing():
    rep = _reported({"bn_train": 0.10, "stats_frozen": 0.11})
    d = decision.decision(rep, _check(rep), 0.02)
    w = decision.words(d)
    assert w["short"].startswith("no strategy shown above chance") and "no strategy is shown above chance" in w["answer"]
    assert w["use"].endswith("no strategy is shown above chance plus the near-chance margin: nothing is recommended.")
    assert w["depends"] == w["depends_full"] == ("No budget and target has a strategy shown above chance, so there "
                                                 "is no answer to compare across them.")


def _page_markdown() -> str:
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "05_batch_size.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_breaks_at_tuned_rates_use_one_rule_for_every_strategy():
    rep = _reported({"bn_train": 0.70, "stats_frozen": 0.80}, large_means={"bn_train": 0.80, "stats_frozen": 0.81})
    d = decision.decision(rep, _check(rep), 0.02)
    assert d["breaks"][("samples", "close", "bn_train")] == "breaks"  # 0.10 lower: beyond the 0.02 margin
    assert d["breaks"][("samples", "close", "stats_frozen")] == "no break"  # 0.01 lower: within it
    n = decision.numbers(d)
    # per budget: of 4 pairs, 2 break (bn_train on both targets) and 2 show no break (stats_frozen, 0.01 lower: the
    # whole interval above -0.02), the same with steps; the page (its Markdown) says the budgets drive the pairs
    for bu in ("samples", "steps"):
        assert (n[f"decision_n_pairs_{bu}"], n[f"decision_n_breaks_{bu}"]) == (4, 2)
        assert n[f"decision_n_no_break_{bu}"] + n[f"decision_n_not_decided_{bu}"] == 2
        assert n[f"decision_n_near_chance_{bu}"] == 0
    assert all(v == "breaks" for k, v in d["breaks"].items() if k[2] == "bn_train")
    assert {v for k, v in d["breaks"].items() if k[2] == "stats_frozen"} <= {"no break", "not decided"}
    assert "no break" in d["breaks"].values()
    assert "describe the budgets, not batch statistics" in _page_markdown()
    assert d["breaks"][("steps", "shifted", "bn_train")] == "breaks"


def test_the_answer_says_when_it_depends_on_the_target():
    rep = _reported({"bn_train": 0.70, "stats_frozen": 0.80})
    flip = rep.target_name.eq("shifted") & rep.arm.eq("bn_train")
    rep.loc[flip, "score"] += 0.2
    d = decision.decision(rep, _check(rep), 0.02)
    w = decision.words(d)
    assert w["depends"].startswith("The answer depends")
    assert "on the close target" in w["short"] and "on the shifted target" in w["short"]


def test_flip_an_edge_rate_keeps_its_result_out_of_the_headline_and_marks_it_in_the_full_answer():
    """Issue 35: no headline number from a comparison whose chosen rate sits at an edge of its grid. Inside the
    grid the steps budget's result is in ``answer`` (the answer box, the front page, the guide); with BatchNorm in
    train mode's steps-budget rate at the top of its grid, ``answer`` says so and gives no number for that budget,
    ``answer_full`` (the chapter's body) gives them, marked, and ``depends`` drops that budget's sentence."""
    import re
    rep = _reported({"bn_train": 0.80, "stats_frozen": 0.70})
    chk = _check(rep)
    inside = decision.words(decision.decision(rep, chk, 0.02))
    assert "With a fixed number of optimizer steps: on the close target **BN in train mode**, 0." in inside["answer"]
    assert inside["answer"] == inside["answer_full"] and "grid" not in inside["answer"]
    assert inside["depends"] == inside["depends_full"] and "optimizer steps" in inside["depends"]
    top = chk.arm.eq("bn_train") & chk.budget.eq("steps") & chk.lr_factor.eq(chk.lr_factor.max())
    chk.loc[top, "score"] += 0.05  # the tuning seeds now prefer the largest factor tried: the grid's top
    d = decision.decision(rep, chk, 0.02)
    assert set(decision.edge_cells(d).budget) == {"steps"}
    w = decision.words(d)
    head, steps = w["answer"].split("With a fixed number of optimizer steps")
    assert steps.startswith(", on the close and shifted targets a leading strategy's chosen rate sits at the top of its "
                            "tuning grid, so the result may change with a wider grid")
    assert not re.search(r"\d\.\d{3}", steps) and "**" not in steps  # no number, no verdict of that budget
    assert head == inside["answer"].split("With a fixed number of optimizer steps")[0]  # the samples budget as before
    full = w["answer_full"].split("With a fixed number of optimizer steps")[1]
    assert "on the close target **BN in train mode**, 0." in full
    assert full.count("with a leading strategy's chosen rate at the top of its grid (the result may change") == 2
    assert "optimizer steps" not in w["depends"] and "optimizer steps" in w["depends_full"]
    assert "may change with a wider grid" in w["depends_full"] and "the answer at the top of the page" in w["edges"]
    bottom = _check(rep)
    low = bottom.arm.eq("bn_train") & bottom.budget.eq("steps") & bottom.lr_factor.eq(bottom.lr_factor.min())
    bottom.loc[low, "score"] += 0.05
    assert "sits at the bottom of its tuning grid" in decision.words(decision.decision(rep, bottom, 0.02))["answer"]


def test_page_words_glue_the_decision_and_the_notes_and_refuse_no_decision():
    """The page's sentences: every :func:`.decision.words` sentence as ``decision_<name>`` (the answer box cites
    them) beside the rule-triggered notes; without the decision, the page has no answer and is refused."""
    rep = _reported({"bn_train": 0.70, "stats_frozen": 0.80})
    d = decision.decision(rep, _check(rep), 0.02)
    f = findings.numbers_table(dict(reference_batch=32, n_break_above=0, precise_var_err_ratio_b2_b32=2.0,
                                    equivalence_margin=0.01, stat_tolerance=0.01,
                                    precise_enough=dict(b2="16", b32="<= 32"),
                                    precise_stats_enough=dict(b2="none tried", b32="512")))
    w = findings.page_words(pd.DataFrame(dict(key=[], verdict=[])), f, d)
    assert {f"decision_{k}": v for k, v in decision.words(d).items()}.items() <= w.items()
    assert w["large_batch"].startswith("Above the reference batch size of 32, no strategy")
    assert "2.0 times" in w["restat_advice"]
    assert "at none of the N tried in batches of 2" in w["precise_enough"]
    with pytest.raises(ValueError, match="decision"):
        findings.page_words(pd.DataFrame(dict(key=[], verdict=[])), f, None)


def test_decision_refuses_rows_without_its_reference():
    rep = _reported({"stats_frozen": 0.8, "adabn": 0.7})
    with pytest.raises(ValueError, match="bn_train"):
        decision.decision(rep, _check(rep), 0.02)


def test_the_recommended_rate_is_the_named_strategys_own_on_every_target():
    """Issue 35 (a referee's case): "BN in train mode, then precise BN" was recommended with BN in train mode's rate
    on the shifted target (0.005 where the recommended arm's was 0.01). The kind: whatever the words name, each rate
    printed is that strategy's own chosen rate, per target."""
    rep = _reported({"bn_train": 0.80, decision.PRECISE_AFTER: 0.80})
    shifted = rep.arm.eq(decision.PRECISE_AFTER) & rep.target_name.eq("shifted")
    rep.loc[shifted, ["lr", "lr_factor"]] = [0.002, 2.0]
    w = decision.words(decision.decision(rep, _check(rep), 0.02))
    assert "then precise BN" in w["use"]
    assert "0.002 on the shifted target" in w["use"] and "0.001 on the close target" in w["use"]
