"""Chapter 8, what is asked (issue 38), fixed before any full-profile row was computed: the questions as data, the
margin and the rule that picks each method's setting, run by :func:`bnstudy.study.inference.ask`; then the page's
numbers, tables and rule-triggered sentences.

Settings chosen by trying are chosen on the tuning seeds only (:func:`choices`): per stream, family, strength and
test batch, the prior ``N`` and TENT's rate with the highest mean accuracy there. Each grid is closed by its method's
limits, which were run (the prior's ``N = 0`` and ``N = inf``, TENT's rate ``0``), so a choice there is a finding;
a choice at an open end of its grid is flagged. The grids were widened once, after a first full run (not reported)
chose an end of the first grids in 56% of the tuned cells; the questions, margin and families did not change.

Three families (Bonferroni within each, TOST at ±:data:`MARGIN`, the book's margin): ``gain`` (each method minus the
source statistics), ``mix`` (the tuned prior minus test-batch statistics) and ``route`` (per-sample routing minus the
best batch method, chosen on the tuning seeds per cell, on the mixed and class-sorted streams). The mismatch question
(Spearman's rho of chapter 3's mismatch before adapting and the gain of test-batch statistics) is descriptive.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ...inference import Interval, Question, ask, numbers_table, rank_correlation, t_interval
from ...inference import number as _n
from ...words import Note, counts_text, join, notes

#: Equivalence margin (accuracy, fraction): the book's, two points, the smallest difference we would act on.
MARGIN = 0.02
#: The conditions the analysis compares (column ``condition``; the prior and TENT at their tuned settings).
CONDITIONS = ("source", "test_batch", "prior_tuned", "dua", "tent_tuned", "routed", "oracle")
#: The batch methods, among which the ``route`` family's reference is chosen per cell on the tuning seeds.
BATCH_METHODS = ("test_batch", "prior_tuned", "dua", "tent_tuned")
CELL = ("stream", "family", "strength", "test_batch")


def _means(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy over a stream's domains, per seed, cell, method and setting."""
    runs = rows[rows["method"] != "mismatch"]
    keys = ["seed", *CELL, "method", "setting"]
    return runs.groupby(keys, dropna=False, sort=True)["accuracy"].mean().reset_index()


def _candidates(m: pd.DataFrame) -> pd.DataFrame:
    """Per-seed means ``m`` (:func:`_means`) of the tuned methods with each one's closed ends added as settings:
    the prior's ``N = inf`` is the source statistics exactly and its ``N = 0`` test-batch statistics (run at
    batches of two or more); TENT's rate ``0`` is test-batch statistics exactly (no step changes a parameter)."""
    src = m[m["method"] == "source"].assign(method="prior", setting=math.inf)
    tb = m[(m["method"] == "prior") & (m["setting"] == 0)]
    return pd.concat([m[m["method"].isin(["prior", "tent"])], src, tb.assign(method="tent")], ignore_index=True)


def choices(tuning: pd.DataFrame) -> pd.DataFrame:
    """Per cell and tuned method, the setting with the highest mean accuracy over the tuning seeds (ties: the
    smaller), among the grid closed by its limits (:func:`_candidates`). ``at_edge``: a choice at an open end (the
    prior's smallest ``N > 0`` where ``N = 0`` is not run, TENT's largest rate). Columns: the cell, ``method``,
    ``setting``, ``accuracy`` (the tuning mean), ``at_edge``."""
    m = _candidates(_means(tuning))
    mean = m.groupby([*CELL, "method", "setting"], sort=True)["accuracy"].mean().reset_index()
    out = []
    for key, g in mean.groupby([*CELL, "method"], sort=True):
        best = g.sort_values(["accuracy", "setting"], ascending=[False, True]).iloc[0]
        grid = sorted(g["setting"])
        open_end = grid[-1] if key[-1] == "tent" else (grid[0] if grid[0] > 0 else None)
        out.append(dict(zip([*CELL, "method"], key), setting=best["setting"], accuracy=best["accuracy"],
                        at_edge=bool(best["setting"] == open_end and len(grid) > 1)))
    return pd.DataFrame(out)


def _named(m: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    """Per-seed means ``m`` (:func:`_means`) as conditions of :data:`CONDITIONS` (tuned settings from ``picks``)."""
    parts = [m[m["method"].isin(["source", "dua", "routed", "oracle"])].assign(condition=m["method"]),
             m[(m["method"] == "prior") & (m["setting"] == 0)].assign(condition="test_batch")]
    cand = _candidates(m)
    for method, name in (("prior", "prior_tuned"), ("tent", "tent_tuned")):
        chosen = picks[picks["method"] == method][[*CELL, "setting"]]
        parts.append(cand[cand["method"] == method].merge(chosen, on=[*CELL, "setting"]).assign(condition=name))
    return pd.concat(parts)[["seed", *CELL, "condition", "accuracy"]]


def best_batch_methods(tuning: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the batch method of :data:`BATCH_METHODS` with the highest mean over the tuning seeds (the ``route``
    family's reference, :func:`conditions`). Columns: the cell, ``condition``."""
    picks = choices(tuning)
    tune = _named(_means(tuning), picks)
    best = tune[tune["condition"].isin(BATCH_METHODS)].groupby([*CELL, "condition"])["accuracy"].mean().reset_index()
    best = best.sort_values("accuracy", ascending=False, kind="stable")
    return best.drop_duplicates(list(CELL))[[*CELL, "condition"]]


def conditions(rows: pd.DataFrame, tuning: pd.DataFrame) -> pd.DataFrame:
    """The reported seeds' mean accuracy per seed, cell and condition of :data:`CONDITIONS` (tuned settings from
    :func:`choices` of ``tuning``), plus ``best_batch``: in each cell, the batch method of :data:`BATCH_METHODS`
    with the highest mean over the tuning seeds. Columns: ``seed``, the cell, ``condition``, ``accuracy``."""
    out = _named(_means(rows), choices(tuning))
    chosen_best = out.merge(best_batch_methods(tuning), on=[*CELL, "condition"]).assign(condition="best_batch")
    return pd.concat([out, chosen_best], ignore_index=True)


#: The questions, one family each (:func:`claims`; the module docstring).
QUESTIONS = {
    "gain": (Question("gain_{condition}_{stream}_{family}_t{strength}_b{test_batch}",
                      condition=("test_batch", "prior_tuned", "dua", "tent_tuned", "routed"), reference="source",
                      each=CELL, margin=MARGIN, optional=True),),
    "mix": (Question("mix_{stream}_{family}_t{strength}_b{test_batch}", condition="prior_tuned",
                     reference="test_batch", each=CELL, margin=MARGIN, words="prior-weighted mix"),),
    "route": (Question("route_{stream}_{family}_t{strength}_b{test_batch}", condition="routed",
                       reference="best_batch", each=CELL, at=dict(stream=("mixed", "class_sorted")),
                       margin=MARGIN, words="routing", optional=True),),
}


def claims(rows: pd.DataFrame, tuning: pd.DataFrame) -> pd.DataFrame:
    """The claims table of the three families (column ``family``), from the reported rows and the tuning rows.
    ``gain`` asks, per test batch, only the conditions run there (test-batch statistics and TENT need a batch of
    two or more); ``mix`` asks batches of two or more."""
    table = conditions(rows, tuning)
    gain = QUESTIONS["gain"][0]
    per_batch = [Question(gain.key, condition=tuple(c for c in gain.condition if c in set(t["condition"])),
                          reference="source", each=CELL, margin=MARGIN, at=dict(test_batch=b))
                 for b, t in table.groupby("test_batch")]
    return pd.concat([ask(table, per_batch, family="gain"),
                      ask(table[table["test_batch"] > 1], QUESTIONS["mix"], family="mix"),
                      ask(table, QUESTIONS["route"], family="route")], ignore_index=True)


def mix_stops(claims_table: pd.DataFrame, stream: str, family: str, strength: float, batches) -> float:
    """The smallest test batch from which the tuned prior is no longer shown higher than test-batch statistics at
    that and every larger batch (``mix`` family), for one stream, family and strength; NaN when it is shown higher
    at the largest batch (it never stops), the smallest batch asked when it is never shown higher."""
    stop = math.nan
    for b in sorted((b for b in batches if b > 1), reverse=True):
        if claims_table.loc[claims_table["key"] == f"mix_{stream}_{family}_t{_num(strength)}_b{b}", "kind"].eq(
                "higher").any():
            break
        stop = b
    return stop


def _num(v) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def mismatch_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, family, strength, domain) of the ``single`` stream: chapter 3's ``mismatch`` of the source network
    on the domain (before adapting) and the ``gain`` of test-batch statistics over the source statistics at the
    largest test batch (accuracy, fraction)."""
    single = rows[rows["stream"] == "single"]
    on = ["seed", "family", "strength", "domain"]
    mis = single[single["method"] == "mismatch"][[*on, "accuracy"]].rename(columns={"accuracy": "mismatch"})
    at = single[single["test_batch"] == single["test_batch"].max()]
    tb = at[(at["method"] == "prior") & (at["setting"] == 0)][[*on, "accuracy"]]
    src = at[at["method"] == "source"][[*on, "accuracy"]]
    g = tb.merge(src, on=on, suffixes=("_tb", "_src")).merge(mis, on=on)
    g["gain"] = g["accuracy_tb"] - g["accuracy_src"]
    return g[[*on, "mismatch", "gain"]]


# --- the page's tables and words -----------------------------------------------------------------------------------

#: The direction words this chapter's verdicts use (the glossary's table lists them).
DIRECTIONS = ("higher", "lower", "prior-weighted mix higher", "prior-weighted mix lower", "routing higher",
              "routing lower")
#: How the page names each condition and stream.
NAMES = dict(source="source statistics", test_batch="test-batch statistics", prior_tuned="prior-weighted mix",
             dua="DUA-style update", tent_tuned="TENT", routed="routing", oracle="oracle bank",
             best_batch="best batch method")
STREAM_NAMES = dict(single="single-shift", mixed="mixed-domain", class_sorted="class-sorted")
STREAMS_ORDER = tuple(STREAM_NAMES)
GAIN_CONDITIONS = ("test_batch", "prior_tuned", "dua", "tent_tuned", "routed")
KINDS = ("higher", "equivalent", "not decided", "lower")
#: Test images of a domain on which the mismatch is measured before adapting (:func:`.run.run_unit`'s first batch).
MISMATCH_IMAGES = 256
_KEY = re.compile(r"^(?P<family_q>gain|mix|route)_(?:(?P<condition>" + "|".join(CONDITIONS) + r")_)?"
                  r"(?P<stream>single|mixed|class_sorted)_(?P<family>[a-z]+)_t(?P<strength>[0-9.]+)"
                  r"_b(?P<test_batch>\d+)$")


def parsed(claims_table: pd.DataFrame) -> pd.DataFrame:
    """The claims table with its cell as columns (``condition``, ``stream``, ``shift`` (the shift family; the claims
    family stays ``family``), ``strength``, ``test_batch``) read back from each key (``mix``: condition
    ``prior_tuned``; ``route``: ``routed``)."""
    cells = claims_table["key"].str.extract(_KEY)
    out = claims_table.copy()
    out["condition"], out["stream"], out["shift"] = cells["condition"], cells["stream"], cells["family"]
    out["condition"] = out["condition"].fillna(cells["family_q"].map({"mix": "prior_tuned", "route": "routed"}))
    out["strength"] = cells["strength"].astype(float)
    out["test_batch"] = cells["test_batch"].astype(int)
    return out


def stream_means(table: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Descriptive means (no verdict rests on them): per stream, condition and test batch, each seed's accuracy
    averaged over the families and strengths run, then the mean over seeds with its Student's t interval.
    Columns: ``stream``, ``condition``, ``test_batch``, ``mean``, ``ci_low``, ``ci_high``, ``n_seeds``."""
    per_seed = table.groupby(["stream", "condition", "test_batch", "seed"])["accuracy"].mean().reset_index()
    rows = []
    for (s, c, b), g in per_seed.groupby(["stream", "condition", "test_batch"]):
        iv = t_interval(g["accuracy"].to_numpy(), confidence)
        rows.append(dict(stream=s, condition=c, test_batch=int(b), mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                         n_seeds=iv.n))
    return pd.DataFrame(rows)


def _kinds(g: pd.DataFrame) -> str:
    """``"3/1/0/0"``: how many claims of ``g`` are higher / equivalent / not decided / lower."""
    return "/".join(str(int(g["kind"].eq(k).sum())) for k in KINDS)


def main_table(means: pd.DataFrame, claims_table: pd.DataFrame, batches) -> pd.DataFrame:
    """The page's main table: per condition (rows) and stream x test batch (columns), the mean accuracy with its
    95% interval over seeds (:func:`stream_means`) and, against the source statistics, how many of the cells
    (families x strengths) show it higher / equivalent / not decided / lower (``gain`` family). ``—``: not run."""
    p = parsed(claims_table[claims_table["family"] == "gain"])
    m = means.set_index(["stream", "condition", "test_batch"])
    cols = {}
    for s in STREAMS_ORDER:
        for b in batches:
            col = {}
            for c in ("source", *GAIN_CONDITIONS):
                r = m.loc[(s, c, b)] if (s, c, b) in m.index else None
                k = p[(p.condition == c) & (p.stream == s) & (p.test_batch == b)]
                col[NAMES[c]] = "—" if r is None or r["mean"] != r["mean"] else (
                    f"{r['mean']:.3f} ({r['ci_low']:.3f}–{r['ci_high']:.3f})"
                    + (" " + _kinds(k) if c != "source" and len(k) and not k["kind"].eq("too few seeds").all() else ""))
            if col[NAMES["tent_tuned"]] == col[NAMES["test_batch"]] != "—":  # TENT's step changed nothing shown
                col[NAMES["tent_tuned"]] = "= test-batch statistics (to the digits shown)"
            cols[(STREAM_NAMES[s], f"b = {b}")] = col
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=["stream", "test batch"])
    return out


def mix_table(claims_table: pd.DataFrame, batches) -> pd.DataFrame:
    """Per stream, family and strength, the smallest test batch from which the tuned prior is no longer shown
    higher than test-batch statistics (:func:`mix_stops`; ``never`` if it still is at the largest batch), and the
    ``mix`` family's verdict counts over the batches."""
    p = parsed(claims_table[claims_table["family"] == "mix"])
    rows = []
    for (s, f, t), g in p.groupby(["stream", "shift", "strength"], sort=False):
        stop = mix_stops(claims_table, s, f, t, batches)
        rows.append(dict(stream=s, family=f, strength=t, stops="never" if stop != stop else f"{int(stop)}",
                         **{k: int(g["kind"].eq(k).sum()) for k in KINDS}))
    return pd.DataFrame(rows)


def shown_batches(batches) -> dict:
    """The test batches the page names: ``bmin`` the smallest, ``bsmall`` the smallest above one, ``bmid`` 64 where
    run (else the largest), ``bmax`` the largest."""
    batches = sorted(int(b) for b in batches)
    return dict(bmin=batches[0], bsmall=next((b for b in batches if b > 1), batches[-1]),
                bmid=64 if 64 in batches else batches[-1], bmax=batches[-1])


def _counts(g: pd.DataFrame) -> dict:
    """Verdict counts of the claims ``g`` (``higher``, ``equivalent``, ``not_decided``, ``lower``) and ``cells``."""
    return dict({k.replace(" ", "_"): int(g["kind"].eq(k).sum()) for k in KINDS}, cells=len(g))


def page_numbers(rows: pd.DataFrame, tuning: pd.DataFrame, claims_table: pd.DataFrame, config) -> pd.DataFrame:
    """The page's flat numbers table (:func:`bnstudy.study.inference.numbers_table`): descriptive means
    ``acc_<stream>_<condition>_<bmin|bsmall|bmid|bmax>`` (intervals over seeds, at :func:`shown_batches`),
    verdict counts ``<family>_<condition>_<stream>_<kind>`` and ``..._cells`` (``b1_...`` at the smallest batch),
    each family's size and confidence, where the mix stops (``stops_<stream>_*``), the grids' choices, the mismatch
    question (``mm_*``), the numbers the notes quote, the units' recorded compute (``cost_worker_min``,
    worker-minutes) and the design's settings (``cfg_*``)."""
    table = conditions(rows, tuning)
    means = stream_means(table)
    batches = sorted(rows.loc[rows["method"] != "mismatch", "test_batch"].unique())
    shown = shown_batches(batches)
    values = {f"acc_{r.stream}_{r.condition}_{name}": Interval(r.mean, r.ci_low, r.ci_high, r.n_seeds)
              for name, b in shown.items() for r in means[means["test_batch"] == b].itertuples()}
    p = parsed(claims_table)
    for (fam, c, s), g in p.groupby(["family", "condition", "stream"]):
        values.update({f"{fam}_{c}_{s}_{k}": v for k, v in _counts(g).items()})
        values[f"{fam}_{c}_{s}_est_min"], values[f"{fam}_{c}_{s}_est_max"] = g["estimate"].min(), g["estimate"].max()
    for (c, s), g in p[(p["family"] == "gain") & (p["test_batch"] == batches[0])].groupby(["condition", "stream"]):
        values.update({f"b1_{c}_{s}_{k}": v for k, v in _counts(g).items()})
    for fam, g in claims_table.groupby("family"):
        values[f"n_{fam}"], values[f"conf_{fam}"] = len(g), float(g["confidence"].iloc[0]) * 100
    for s in STREAMS_ORDER:
        stops = [mix_stops(claims_table, s, f, t, batches) for f in config.families for t in config.strengths]
        real = [int(x) for x in stops if x == x]
        values.update({f"stops_{s}_min": min(real) if real else math.nan, f"stops_{s}_max": max(real) if real
                       else math.nan, f"stops_{s}_never": len(stops) - len(real), f"stops_{s}_cells": len(stops)})
    pick = choices(tuning)
    pr, te = pick[pick["method"] == "prior"], pick[pick["method"] == "tent"]
    above_one = [b for b in batches if b > 1] or batches
    values.update(prior_at_edge=int(pr["at_edge"].sum()), prior_cells=len(pr), tent_at_edge=int(te["at_edge"].sum()),
                  tent_cells=len(te), prior_chose_source=int(np.isinf(pr["setting"]).sum()),
                  prior_chose_test_batch=int((pr["setting"] == 0).sum()),
                  tent_chose_zero=int((te["setting"] == 0).sum()),
                  wang_zero_single=int((te.loc[te["stream"] == "single", "setting"] == 0).sum()),
                  wang_cells_single=int((te["stream"] == "single").sum()),
                  tent_steps_min=int(config.n_eval // above_one[-1]), tent_steps_max=int(config.n_eval // above_one[0]))
    per_unit = pd.concat([rows, tuning]).drop_duplicates(["seed", "family", "strength"])["unit_wall_s"]
    values["cost_worker_min"] = float(per_unit.sum()) / 60
    mm = mismatch_rows(rows)  # the mismatch question: Spearman's rho over cells and over their means
    rho, iv, _ = rank_correlation(mm["mismatch"], mm["gain"])
    cellwise = mm.groupby(["family", "strength", "domain"])[["mismatch", "gain"]].mean()
    rho_c, iv_c, _ = rank_correlation(cellwise["mismatch"], cellwise["gain"])
    above, lost = mm["mismatch"] > mm["mismatch"].median(), mm["gain"] < 0
    values.update(mm_rho=rho, mm_low=iv.low, mm_high=iv.high, mm_n=len(mm),
                  mm_sign_agreement=float(np.mean(np.sign(mm["gain"]) == np.where(above, 1, -1))),
                  mm_cells_rho=rho_c, mm_cells_low=iv_c.low, mm_cells_high=iv_c.high, mm_cells_n=len(cellwise),
                  mm_base_rate=float((mm["gain"] > 0).mean()), cfg_mismatch_images=MISMATCH_IMAGES,
                  mm_gain_above=float(mm.loc[above, "gain"].mean()), mm_gain_below=float(mm.loc[~above, "gain"].mean()),
                  mm_negative=int(lost.sum()), mm_loss_max=float(-mm.loc[lost, "gain"].min()) if lost.any() else 0.0)
    one = table[table["stream"] == "single"].pivot_table(index=["seed", *CELL], columns="condition",
                                                        values="accuracy")
    if {"tent_tuned", "test_batch"} <= set(one.columns):
        d = (one["tent_tuned"] - one["test_batch"]).dropna().groupby(level=list(CELL)).mean()
        values.update(wang_diff_mean=float(d.mean()), wang_diff_max=float(d.abs().max()))
    gain, route = p[p["family"] == "gain"], p[(p["family"] == "route") & p["stream"].isin(["mixed", "class_sorted"])]
    g = gain[gain["condition"] == "test_batch"]
    low_b = g[g["kind"] == "lower"].groupby("stream")["test_batch"].max()
    d64 = g[(g["stream"] == "mixed") & (g["test_batch"] == shown["bmid"])]
    multi = route[route["test_batch"] > batches[0]]  # a batch of one mixes nothing: its references are per-sample
    ref = route[["stream", "shift", "strength", "test_batch", "kind"]].rename(columns={"shift": "family"}).merge(
        best_batch_methods(tuning), on=list(CELL), how="left")
    # identities: every seed's difference exactly 0 (the tuned mix at N = 0 is test-batch statistics; at N = inf the
    # source statistics): counted apart from equivalence found in the data
    ident = (claims_table["estimate"] == 0) & (claims_table["low"] == 0) & (claims_table["high"] == 0)
    fam_of = claims_table["family"]
    values.update(dobler_lower_bmax=int(low_b.get("mixed", 0)), single_lower_bmax=int(low_b.get("single", 0)),
                  single_lower=int(((g["stream"] == "single") & (g["kind"] == "lower")).sum()),
                  dobler_bmid_higher=int(d64["kind"].eq("higher").sum()), dobler_bmid_cells=len(d64),
                  schneider_positive=int((gain.loc[(gain["condition"] == "prior_tuned") & (gain["stream"] == "single")
                                                   & (gain["test_batch"] == batches[0]), "estimate"] > 0).sum()),
                  route_ref_dua=int(ref["condition"].eq("dua").sum()),
                  route_higher_ref_dua=int((ref["condition"].eq("dua") & ref["kind"].eq("higher")).sum()),
                  route_multi_higher=int(multi["kind"].eq("higher").sum()), route_multi_cells=len(multi),
                  route_big_higher=int((route["kind"].eq("higher") & (route["estimate"] > MARGIN)).sum()),
                  ident_mix=int((ident & (fam_of == "mix")).sum()),
                  ident_mix_equivalent=int((ident & (fam_of == "mix") & claims_table["verdict"].str.startswith(
                      "equivalent")).sum()),
                  ident_gain_prior=int((ident & (fam_of == "gain") & p["condition"].eq("prior_tuned")).sum()),
                  n_seeds=len(config.seeds), cfg_n_seeds=len(config.seeds), cfg_n_tuning=len(config.tuning_seeds),
                  cfg_tuning_first=min(config.tuning_seeds), cfg_tuning_last=max(config.tuning_seeds),
                  **{f"cfg_{k}": v for k, v in shown.items()}, cfg_n_eval=config.n_eval,
                  cfg_bank_samples=config.bank_samples, cfg_margin=MARGIN, cfg_strength_low=min(config.strengths),
                  cfg_strength_high=max(config.strengths))
    return numbers_table(values, lambda k: (0.0, 1.0) if k.startswith("acc_") else (-math.inf, math.inf))


def _anchor(n, fam, c, streams) -> dict:
    """``h`` (shown higher), ``lo`` (lower), ``eq`` (equivalent) and ``cells`` of ``fam``'s claims on ``c``, summed
    over ``streams``."""
    total = lambda kind: sum(_n(n, f"{fam}_{c}_{s}_{kind}") for s in streams)  # noqa: E731
    return dict(h=total("higher"), lo=total("lower"), eq=total("equivalent"), cells=total("cells"))


def _route(n) -> dict:
    return _anchor(n, "route", "routed", ("mixed", "class_sorted"))


def _fill_route(_, n):
    d = _route(n)
    return dict(d, lo=d["lo"] or "none", hm=_n(n, "route_multi_higher"), cm=_n(n, "route_multi_cells"),
                big=_n(n, "route_big_higher"), bank=_n(n, "cfg_bank_samples"), m=_n(n, "cfg_margin"))


def _collapse(_, n):
    d = _anchor(n, "gain", "test_batch", ("class_sorted",))
    return dict(k=d["lo"], cells=d["cells"], tent=_anchor(n, "gain", "tent_tuned", ("class_sorted",))["lo"])


def _same(fill, want: str):
    """A rule: the direction ``want`` (``"h"``: higher, ``"lo"``: lower) is shown in at least half the cells
    (the sentence always gives the opposite count too)."""
    return lambda c, n: fill(c, n)["cells"] > 0 and 2 * fill(c, n)[want] >= fill(c, n)["cells"]


_SCHNEIDER = lambda c, n: dict(_anchor(n, "b1", "prior_tuned", ("single",)), pos=_n(n, "schneider_positive"))  # noqa
_DOBLER = lambda c, n: dict(_anchor(n, "gain", "test_batch", ("mixed",)), bmax=_n(n, "dobler_lower_bmax"),  # noqa
                            top=_n(n, "cfg_bmax"), slo=_n(n, "single_lower"), sbmax=_n(n, "single_lower_bmax"),
                            mid=_n(n, "cfg_bmid"), hm=_n(n, "dobler_bmid_higher"), cm=_n(n, "dobler_bmid_cells"))
_NIU = lambda c, n: _anchor(n, "gain", "test_batch", ("class_sorted",))  # noqa: E731

def _WANGD(_, n):
    return dict(mean=_n(n, "wang_diff_mean"), mx=_n(n, "wang_diff_max"), k=_n(n, "wang_zero_single"),
                cells=_n(n, "wang_cells_single"), smin=_n(n, "tent_steps_min"), smax=_n(n, "tent_steps_max"),
                img=_n(n, "cfg_n_eval"))
_ROUTE_WINS = lambda c, n: _route(n)["lo"] == 0 and 2 * _route(n)["h"] >= _route(n)["cells"]  # noqa: E731


def _mm(_, n):
    return dict(rho=_n(n, "mm_cells_rho"), lo=_n(n, "mm_cells_low"), hi=_n(n, "mm_cells_high"),
                sign=_n(n, "mm_sign_agreement"), base=_n(n, "mm_base_rate"), neg=_n(n, "mm_negative"),
                loss=_n(n, "mm_loss_max"), img=_n(n, "cfg_mismatch_images"))


#: What the mismatch question measured, said with each of its answers.
_MM_SCOPE = ("gain at the largest test batch on single-shift streams; mismatch on each domain's first {img:.0f} "
             "test images")
_MM_RHO = "(Spearman {rho:.2f} on their means, 95% interval {lo:.2f} to {hi:.2f}; " + _MM_SCOPE + ")."
#: Wang et al.'s comparison, said with both of its answers.
_WANG = ("On single-shift streams, Wang et al.'s setting, tuned TENT minus test-batch statistics averaged {mean:+.4f} "
         "over the cells (largest difference {mx:.4f}; the tuning seeds chose rate 0, test-batch statistics itself, "
         "in {k} of {cells})")
_TENT = ("TENT here takes one SGD step per test batch, {smin} to {smax} steps over a single-shift stream of {img:.0f} "
         "images")


#: Said with every answer of the lead: the baseline that was not run.
_POOLED = " A bank pooled over the domains (the baseline for having those images) was not run."
_BANKS = "(banks estimated on {bank:.0f} unlabelled images of each exact test domain) beat the best batch method in "
_WINS = ("{h} of {cells} cells ({hm} of {cm} at test batches of two or more; {big} by more than the book's margin of "
         "{m:g}) and was below it in ")
_MIXED = "On the mixed-domain stream, test-batch statistics "
_SORTED = "On class-sorted streams, test-batch statistics fell below the source statistics in "


def _ident(_, n):
    return dict(im=_n(n, "ident_mix"), ime=_n(n, "ident_mix_equivalent"), ig=_n(n, "ident_gain_prior"))


def _dua(c, n):
    return dict(_fill_route(c, n), d=_n(n, "route_ref_dua"), dh=_n(n, "route_higher_ref_dua"))


#: The page's rule-triggered sentences (:class:`bnstudy.study.words.Note`), each with a flip test.
NOTES = (
    Note("identities", lambda c, n: _ident(c, n)["im"] + _ident(c, n)["ig"] > 0,
         "Identities, not findings: in {im} of the mix family's cells the tuned prior was N = 0 (test-batch "
         "statistics itself, every seed's difference exactly 0; {ime} read *equivalent*), and in {ig} of the gain "
         "family's prior-weighted-mix cells N = ∞ (the source statistics exactly).", _ident),
    Note("identities", lambda c, n: _ident(c, n)["im"] + _ident(c, n)["ig"] == 0,
         "No tuned prior reduced the mix to test-batch statistics or to the source statistics exactly."),
    Note("dua_ref", lambda c, n: _dua(c, n)["d"] > 0,
         "The best batch method was the DUA-style update (one update per batch, no augmentation) in {d} of the "
         "{cells} cells and {dh} of routing's {h} wins.", _dua),
    Note("dua_ref", lambda c, n: _dua(c, n)["d"] == 0,
         "The DUA-style update was the best batch method in none of the {cells} cells.", _dua),
    Note("anchor_wang", lambda c, n: _WANGD(c, n)["mx"] <= MARGIN,
         "**Not the same direction.** " + _WANG + ": the entropy step added nothing beyond the book's margin, where "
         "Wang et al. report it adding about two points. " + _TENT + ", far fewer than on CIFAR-10-C.", _WANGD),
    Note("anchor_wang", lambda c, n: _WANGD(c, n)["mx"] > MARGIN, _WANG + "; " + _TENT + ".", _WANGD),
    Note("what_to_do", _ROUTE_WINS,
         "If a deployment knows its domains ahead and can keep unlabelled images of each (here {bank:.0f} per "
         "domain, kept apart by domain), estimate a bank of statistics per domain (precise BN on those images) and "
         "route each sample to the nearest bank: it needs no batch and no assumption about what a batch holds. If "
         "it cannot, adapt with `bnstudy.adapt_bn_statistics` and a prior tuned on batches drawn the way the "
         "deployment draws them.", lambda c, n: dict(bank=_n(n, "cfg_bank_samples"))),
    Note("what_to_do", lambda c, n: not _ROUTE_WINS(c, n),
         "Compare routing and the batch methods on held-out batches drawn the way the deployment draws them: "
         "neither won everywhere here."),
    Note("mismatch_says", lambda c, n: _mm(c, n)["lo"] > 0 and _mm(c, n)["sign"] <= _mm(c, n)["base"],
         "Measured before adapting, the mismatch did not tell whether adapting gains better than always predicting "
         "a gain ({sign:.0%} of cells right against {base:.0%}; {neg:.0f} cells lost, by at most {loss:.4f}); it "
         "ranked how much adapting gained over the shift families, strengths and domains " + _MM_RHO, _mm),
    Note("mismatch_says", lambda c, n: _mm(c, n)["lo"] > 0 and _mm(c, n)["sign"] > _mm(c, n)["base"],
         "Measured before adapting, the mismatch told whether adapting gains better than always predicting a gain "
         "({sign:.0%} of cells right against {base:.0%}), and ranked how much it gained over the shift families, "
         "strengths and domains " + _MM_RHO, _mm),
    Note("mismatch_says", lambda c, n: not _mm(c, n)["lo"] > 0,
         "Measured before adapting, the mismatch was not shown to predict the gain (Spearman {rho:.2f} over the "
         "shift families, strengths and domains' means, 95% interval {lo:.2f} to {hi:.2f}; " + _MM_SCOPE + ").", _mm),
    Note("anchor_schneider", _same(_SCHNEIDER, "h"),
         "**Same direction.** At a test batch of one on single-shift streams, the prior-weighted mix was above the "
         "source statistics in {h} of {cells} cells and below in {lo}.", _SCHNEIDER),
    Note("anchor_schneider", lambda c, n: not _same(_SCHNEIDER, "h")(c, n) and _SCHNEIDER(c, n)["lo"] == 0
         and 2 * _SCHNEIDER(c, n)["pos"] > _SCHNEIDER(c, n)["cells"],
         "**Same direction in the estimates, shown in {h} of {cells}.** At a test batch of one on single-shift "
         "streams, the prior-weighted mix's estimate was above the source statistics in {pos} of {cells} cells and "
         "shown above them in {h}, below in none: the chapter's large family leaves the rest open.", _SCHNEIDER),
    Note("anchor_schneider", lambda c, n: not _same(_SCHNEIDER, "h")(c, n) and not (
        _SCHNEIDER(c, n)["lo"] == 0 and 2 * _SCHNEIDER(c, n)["pos"] > _SCHNEIDER(c, n)["cells"]),
         "**Not shown.** At a test batch of one on single-shift streams, the prior-weighted mix was above the "
         "source statistics in {h} of {cells} cells and below in {lo}.", _SCHNEIDER),
    Note("anchor_dobler", lambda c, n: _DOBLER(c, n)["lo"] > 0 and _DOBLER(c, n)["bmax"] < _DOBLER(c, n)["top"],
         "**In part: below only at small test batches.** " + _MIXED + "fell below the source statistics in {lo} of "
         "{cells} cells, all at test batches of {bmax} or fewer, where single-shift streams also fell below them "
         "({slo} cells, up to a batch of {sbmax}); they were above them in {h}, and at a test batch of {mid:.0f} in "
         "{hm} of {cm} (the others open or equivalent). The mixing here is milder than the benchmark's: three "
         "domains of one shift family at one strength.", _DOBLER),
    Note("anchor_dobler", lambda c, n: _DOBLER(c, n)["lo"] > 0 and _DOBLER(c, n)["bmax"] >= _DOBLER(c, n)["top"],
         "**In part: below up to the largest test batch.** " + _MIXED + "fell below the source statistics in {lo} "
         "of {cells} cells, up to the largest test batch, and were above them in {h}.", _DOBLER),
    Note("anchor_dobler", lambda c, n: _DOBLER(c, n)["lo"] == 0,
         "**Not the same direction.** " + _MIXED + "were below the source statistics in none of {cells} cells, and "
         "above them in {h}.", _DOBLER),
    Note("anchor_niu", _same(_NIU, "lo"),
         "**Same direction.** " + _SORTED + "{lo} of {cells} cells and were above them in {h}.", _NIU),
    Note("anchor_niu", lambda c, n: not _same(_NIU, "lo")(c, n),
         "**Not shown in most cells.** " + _SORTED + "{lo} of {cells} cells and were above them in {h}.", _NIU),
    Note("lead", _ROUTE_WINS,
         "**Route the sample when test batches mix domains or classes, if unlabelled images of each test domain "
         "can be kept.** There, per-sample routing to statistic banks " + _BANKS + _WINS + "{lo}." + _POOLED,
         _fill_route),
    Note("lead", lambda c, n: _route(n)["lo"] > 0, "**Neither everywhere.** Where test batches mix domains or "
         "classes, per-sample routing " + _BANKS + _WINS + "{lo}." + _POOLED, _fill_route),
    Note("lead", lambda c, n: _route(n)["lo"] == 0 and 2 * _route(n)["h"] < _route(n)["cells"],
         "**Not shown either way.** Where test batches mix domains or classes, per-sample routing " + _BANKS
         + "only " + _WINS + "none." + _POOLED, _fill_route),
    Note("collapse", lambda c, n: 2 * _collapse(c, n)["k"] >= _collapse(c, n)["cells"] > 0,
         _SORTED + "{k} of {cells} cells (TENT, whose tuned rate there is mostly 0, that is test-batch statistics, "
         "in {tent}): do not adapt to batches drawn from few classes.", _collapse),
    Note("collapse", lambda c, n: 2 * _collapse(c, n)["k"] < _collapse(c, n)["cells"] or not _collapse(c, n)["cells"],
         _SORTED + "{k} of {cells} cells.", _collapse),
)


#: Döbler and Marsden's benchmark, mixed domains (error %, severity 5; ``classification/benchmark.md`` of
#: ``mariodoebler/test-time-adaptation`` at ef3a2a6, read at stop 53): the published record the page places its
#: mixed-domain stream against, said in :data:`published_words`.
DOBLER_MIXED = {"ImageNet-C (ResNet-50)": dict(source=82.0, test_batch=82.5, tent=86.4),
                "CIFAR-10-C (WideResNet-28)": dict(source=43.5, test_batch=33.8, tent=44.1)}


def published_words() -> dict[str, str]:
    """The published numbers the page cites, in words (``dobler_published``), from :data:`DOBLER_MIXED`."""
    (a, x), (b, y) = DOBLER_MIXED.items()
    return dict(dobler_published=(
        f"test-batch statistics score {x['test_batch']:.1f}% error against {x['source']:.1f}% without adaptation on "
        f"{a} (TENT {x['tent']:.1f}%), {y['test_batch']:.1f}% against {y['source']:.1f}% on {b} (TENT "
        f"{y['tent']:.1f}%)"))


def grid_words(config) -> dict[str, str]:
    """The tuned settings' grids in words (plain text, glued as ``ch08_prior_grid`` / ``ch08_tent_grid``):
    ``"0.125, 1, 8, 64 and 512"``."""
    return dict(prior_grid=join([f"{v:g}" for v in config.priors if v > 0]),
                tent_grid=join([f"{v:g}" for v in config.tent_lrs]))


def page_words(claims_table: pd.DataFrame, numbers: pd.DataFrame) -> dict[str, str]:
    """``{name: Markdown}``: the notes of :data:`NOTES` and, per stream and compared condition, its ``gain``
    claims counted (``count_<condition>_<stream>``, :func:`bnstudy.study.words.counts_text`), the ``route`` and
    ``mix`` families counted per stream (``count_route_<stream>``, ``count_mix_<stream>``)."""
    out = notes(NOTES, claims_table, numbers) | published_words()
    for st in STREAMS_ORDER:
        lo, hi = _n(numbers, f"stops_{st}_min"), _n(numbers, f"stops_{st}_max")
        never, cells = _n(numbers, f"stops_{st}_never"), _n(numbers, f"stops_{st}_cells")
        span = "" if lo != lo else (f"from a test batch of {lo:.0f}" if lo == hi else
                                    f"from a test batch of {lo:.0f} to {hi:.0f}, depending on the family and strength")
        out[f"stops_{st}"] = ("the mix was no longer shown above test-batch statistics " + span
                              + (f" (at that batch and every larger one; not all of those are equivalent, some are "
                                 f"open), and was still shown above them at the largest batch in {never} of {cells}"
                                 if never else " (at that batch and every larger one; not all of those are "
                                 "equivalent, some are open)") if span else
                              f"the mix was still shown above test-batch statistics at the largest batch in all {cells}")
    p = parsed(claims_table)
    for (fam, c, s), g in p.groupby(["family", "condition", "stream"]):
        name = dict(gain=f"count_{c}_{s}", mix=f"count_mix_{s}", route=f"count_route_{s}")[fam]
        ref = dict(gain="the source statistics", mix="test-batch statistics", route="the best batch method")[fam]
        out[name] = counts_text(g, "cells", NAMES[c], ref, MARGIN)
    return out
