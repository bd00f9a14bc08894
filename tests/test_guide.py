"""The decision guide (book/guide.md): every number and verdict on it is glued from an executed chapter, every
recommendation cites a figure or table that a chapter defines, and the cross-page Markdown glue renders."""

import re
from pathlib import Path

import pytest
from docutils import nodes

from bnstudy.study import book
from bnstudy.study.sphinxext import inline_markdown

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "book" / "guide.md"
ROLE = re.compile(r"\{(glue(?::\w+)?|numref|cite(?::\w+)?|ref)\}`([^`]*)`")


def _refs(kind: str) -> list[str]:
    return [text for k, text in ROLE.findall(GUIDE.read_text()) if k.startswith(kind)]


def _chapter_sources() -> dict[str, str]:
    """``{"../chapters/01-freeze-modes.ipynb": source text of chapters/01_freeze_modes.ipynb, ...}``: the path as a
    page in ``book/`` (the guide, the front page) names a chapter's page."""
    return {f"../chapters/{book.page_name(p)}.ipynb": p.read_text() for p in book.chapter_paths()}


def test_guide_is_the_last_chapter_of_the_toc():
    toc = (REPO / "_toc.yml").read_text()
    chapters = re.findall(r"- file: (\S+)", toc.split("caption: Reference")[0])
    assert chapters[-1] == "book/guide"


def test_guide_types_no_number_of_its_own():
    text = GUIDE.read_text()
    text = ROLE.sub(" ", text)
    text = re.sub(r"`[^`]*`", " ", text)  # code
    text = re.sub(r"\$[^$]*\$", " ", text)  # math
    text = re.sub(r"https?://[^\s)>]+", " ", text)  # addresses (the wheel's name carries the package version)
    # what may stay: chapter, trap and question numbers, list numbers, network names, the 95% of "95% interval"
    text = re.sub(r"\b([Cc]hapters?|trap|[Qq]uestion) \d+( to \d+)?", " ", text)
    text = re.sub(r"^\d\. ", " ", text, flags=re.M)
    for name in ("ResNet-18", "MobileNetV3", "95%"):
        text = text.replace(name, " ")
    assert not re.search(r"\d", text), re.findall(r".{30}\d.{30}", text)


def test_guide_glues_only_from_chapter_pages_with_their_own_keys():
    pages = _chapter_sources()
    glued = _refs("glue")
    assert len(glued) > 50
    for text in glued:
        assert "::" in text, f"{text!r}: the guide has no glue of its own; give the chapter page"
        page, key = text.split("::", 1)
        assert page in pages, f"{page!r} is not a chapter page ({sorted(pages)})"
        number = page.split("/")[-1][:2]
        assert key.startswith(f"ch{number}_"), f"{key!r} is not chapter {number}'s key"


def test_guide_cites_figures_and_tables_that_the_chapters_define():
    labels = set()
    for src in _chapter_sources().values():
        labels |= set(re.findall(r":name:\s*([\w-]+)", src))
    cited = _refs("numref")
    assert {"tbl-ch02-checklist", "fig-ch03-mismatch", "fig-ch06-routing", "tab-ch05-decision"} <= set(cited)
    assert set(cited) <= labels, sorted(set(cited) - labels)
    # every chapter backs at least one recommendation
    assert {c[6:8] for c in cited} == {f"{i:02d}" for i in range(1, 10)}


def test_inline_markdown_renders_verdict_words_and_refuses_other_markdown():
    out = inline_markdown("**does not hold**")
    assert len(out) == 1 and isinstance(out[0], nodes.strong) and out[0].astext() == "does not hold"
    assert [type(n) for n in inline_markdown("yes")] == [nodes.Text]
    mixed = inline_markdown("*quick* profile, **3** seeds")
    assert [type(n) for n in mixed] == [nodes.emphasis, nodes.Text, nodes.strong, nodes.Text]
    assert "".join(n.astext() for n in mixed) == "quick profile, 3 seeds"
    for other in ("[a link](x.html)", "`code`", "**`bnstudy.f(x)`**", "*[link](x.html)*", "<b>html</b>", "# heading", "two\nlines", "**open"):
        assert inline_markdown(other) is None, other


@pytest.mark.slow
def test_guide_page_pastes_every_value_and_verdict(built_html):
    page = (built_html / "book" / "guide.html").read_text()
    assert "IPython.core.display" not in page and "glue:" not in page and "::ch0" not in page
    pasted = re.findall(r'class="pasted-(?:text|inline)"', page)
    assert len(pasted) == len(_refs("glue"))
    for label in set(_refs("numref")):  # resolved to a numbered link, not left as the label
        assert f"#{label}" in page, label


# --- the practitioner's page (issue 25): code on every row, snippets that run, one import path per name -------------

INDEX = REPO / "book" / "index.md"
#: Study machinery a guide row may name beside the front door (``bnstudy.__all__``).
STUDY_MODULES = ("modes", "banks", "routing")
#: Verdict words of the book before the glossary (issue 24); the guide uses the glossary's instead.
STALE_VERDICTS = ("holds", "does not hold", "not separated", "unresolved", "undetermined")


def _section(text: str, heading: str) -> str:
    """The Markdown under ``## heading`` up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def short_answer_rows(text: str) -> list[list[str]]:
    """The cells of every body row of the guide's short-answer table."""
    lines = [ln for ln in _section(text, "The short answer").splitlines() if ln.startswith("|")]
    assert len(lines) > 2 and set(lines[1].replace("|", "").split()) == {"---"}, "no Markdown table"
    return [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[2:]]


def resolve_call(code: str) -> str | None:
    """The library path an inline code span names (``bnstudy.pin_eval``, ``bnstudy.study.banks.StatisticBank``), if it
    names one that exists through the front door or a study module; else None."""
    import importlib

    import bnstudy

    for m in re.finditer(r"\bbnstudy\.(study\.)?(\w+)(?:\.(\w+))?", code):
        study, first, second = m.groups()
        if not study and first in bnstudy.__all__:
            return f"bnstudy.{first}"
        if study and first in STUDY_MODULES and second and hasattr(importlib.import_module(f"bnstudy.study.{first}"),
                                                                   second):
            return f"bnstudy.study.{first}.{second}"
    return None


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_short_answer_table_has_a_row_for_each_situation_the_issue_names():
    situations = " / ".join(r[0] for r in short_answer_rows(GUIDE.read_text()))
    for s in ("any freeze", "task known", "task unknown", "only the new task counts", "a deeper head or another optimizer",
              "small per-device batch", "whole network"):
        assert s in situations, s


def test_every_short_answer_row_names_a_call_that_exists_through_one_door():
    rows = short_answer_rows(GUIDE.read_text())
    for row in rows:
        assert len(row) == 3, row
        assert row[0].startswith("{ref}`"), f"row {row[0]!r} does not link the section that explains it"
        spans = re.findall(r"(?<!\})`([^`]+)`", row[1])  # inline code, not a role's target
        called = [resolve_call(s) for s in spans]
        assert any(called), f"row {row[0]!r}: {row[1]!r} names no call of bnstudy.__all__ (or " \
                            f"bnstudy.study.{{{', '.join(STUDY_MODULES)}}})"
        assert "{numref}" in row[2], f"row {row[0]!r} rests on no figure or table"


def test_resolve_call_refuses_names_that_do_not_exist_or_take_a_second_path():
    assert resolve_call("bnstudy.pin_eval(model.backbone)") == "bnstudy.pin_eval"
    assert resolve_call("bnstudy.study.routing.NearestStatistics(bank)") == "bnstudy.study.routing.NearestStatistics"
    for bad in ("bnstudy.pin_everything(model)", "bnstudy.study.routing.Nearest(bank)", "model.eval()",
                "bnstudy.stats.update_bn_stats(model, x)", "bnstudy.freeze.pin_eval(model)"):
        assert resolve_call(bad) is None, bad


def test_every_bnstudy_path_on_the_guide_takes_the_front_door():
    """One import path per name: a front-door name is spelled ``bnstudy.<name>`` (never through the submodule
    that defines it), study machinery ``bnstudy.study.<modes|banks|routing>.<name>``, and every such name exists."""
    import bnstudy

    text = GUIDE.read_text()
    code = " ".join(re.findall(r"`([^`]+)`", text)) + " ".join(python_blocks(text))
    code = re.sub(r"https?://\S+", " ", code)  # the book's address is not a module path
    paths = re.findall(r"\bbnstudy(?:\.\w+)+", code)
    assert len(paths) > 10
    for path in paths:
        parts = path.split(".")[1:]
        if parts[0].startswith("__"):
            continue
        study = parts[0] == "study" and len(parts) > 1 and parts[1] in STUDY_MODULES
        assert parts[0] in bnstudy.__all__ or (study and (len(parts) == 2 or resolve_call(path))), \
            f"{path}: not a front-door name (bnstudy.__all__) nor one of bnstudy.study.{{{', '.join(STUDY_MODULES)}}}"
    for mod, names in re.findall(r"^from bnstudy(\.study\.\w+|\.\w+)? import (.+)$", " \n".join(python_blocks(text)),
                                 flags=re.M):
        for name in (n.strip() for n in names.split(",")):
            where = "bnstudy" + mod
            assert (not mod and name in bnstudy.__all__) or (mod[7:] in STUDY_MODULES and resolve_call(
                f"{where}.{name}")), f"from {where} import {name}: import front-door names from bnstudy itself"


class _ToyNet(__import__("torch").nn.Module):
    """A small BatchNorm network of the shape the guide's code assumes: ``backbone`` and the old task's ``head``."""

    def __init__(self):
        from torch import nn
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


def _toy_namespace() -> dict:
    """The names the guide's code blocks assume (guide.md, *Install the library*), on a toy model."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model, new_head = _ToyNet(), torch.nn.Linear(8, 4)
    loader_new = [(torch.randn(4, 3, 8, 8, generator=g) * 3 + 2, torch.randint(0, 4, (4,), generator=g))
                  for _ in range(4)]

    def train_one_epoch(m):
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
        m.train()
        for x, y in loader_new:
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    return dict(model=model, new_head=new_head, x_old=torch.randn(8, 3, 8, 8, generator=g),
                x_new=torch.randn(8, 3, 8, 8, generator=g) * 3 + 2, loader_new=loader_new,
                train_one_epoch=train_one_epoch)


def test_the_guide_shows_a_block_for_each_recipe():
    blocks = python_blocks(GUIDE.read_text())
    for call in ("statistics_mismatch", "pin_eval", "shared_weight_copy", "MODES[", "StatisticBank", "routed_forward",
                 "update_bn_stats", "pin_norm_eval", "FreezeAudit"):
        assert any(call in b for b in blocks), call


@pytest.mark.parametrize("i", range(len(python_blocks(GUIDE.read_text()))))
def test_guide_code_block_runs_on_a_toy_model_and_a_freeze_keeps_the_backbone_bit_identical(i):
    """Each ``python`` block of the guide runs as it stands on a toy model with the names the guide states; a block
    that freezes the backbone leaves every parameter and buffer of it bit-identical (the bank's block too: bank 0,
    the old task's statistics, is live again after ``bank.use(1)``), and old-task logits it computes equal the
    model's before the block."""
    import warnings

    import torch

    block = python_blocks(GUIDE.read_text())[i]
    ns = _toy_namespace()
    before = {k: v.clone() for k, v in ns["model"].backbone.state_dict().items()}
    reference = ns["model"].eval()(ns["x_old"]).detach()
    ns["model"].train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lints the blocks provoke on purpose (a batch of two)
        exec(compile(block, f"guide.md block {i}", "exec"), ns)
    if "requires_grad_(False)" in block or "MODES[" in block:
        after = ns["model"].backbone.state_dict()
        moved = [k for k, v in before.items() if not torch.equal(v, after[k])]
        assert not moved, f"block {i} freezes the backbone, yet {moved} moved"
    if "logits_old" in ns:
        assert torch.equal(ns["logits_old"], reference), f"block {i}: the old task's logits changed"
    # ... and a block that gives the new task statistics of its own has moved them away from the old task's
    own_means = {"backbone_new": lambda: {k[:-len(".running_mean")]: v for k, v in ns["backbone_new"].state_dict().items()
                                          if k.endswith(".running_mean")},
                 "tm": lambda: {k[:-len(".running_mean")]: v for k, v in ns["tm"].backbone_b.state_dict().items()
                                if k.endswith(".running_mean")},
                 "bank": lambda: {layer: mean for layer, (mean, _) in ns["bank"].statistics(1).items()}}
    for name, means in own_means.items():
        if name in ns:
            assert any(not torch.equal(m, before[f"{layer}.running_mean"]) for layer, m in means().items()), \
                f"block {i}: the new task's statistics ({name}) never moved"


def test_guide_precise_bn_block_leaves_a_pinned_backbone_and_re_estimates_only_the_train_mode_layers():
    """Question (d)'s precise-BN block, run where the guide's flow has pinned the backbone and the new part has a
    BatchNorm of its own: the pinned backbone's statistics stay bit-identical (``update_bn_stats(model, ...)`` alone
    would re-estimate every BatchNorm, the pinned ones too) and the new part's BatchNorm is re-estimated."""
    import warnings

    import torch

    import bnstudy

    text = GUIDE.read_text()
    block, = [b for b in python_blocks(_section(text, "(d) What is the batch size per device?"))
              if "update_bn_stats" in b and "lint_model" in b]
    ns = _toy_namespace()
    model = ns["model"]
    model.head = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    bnstudy.pin_eval(model.backbone)
    model.train()
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    head_mean = model.head[1].running_mean.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small_batch lints the block provokes on purpose
        exec(compile(block, "guide.md precise BN block", "exec"), ns)
    after = model.backbone.state_dict()
    moved = [k for k, v in before.items() if not torch.equal(v, after[k])]
    assert not moved, f"the precise-BN block moved the pinned backbone's {moved}"
    assert not torch.equal(model.head[1].running_mean, head_mean), "the new part's BatchNorm was not re-estimated"


def test_guide_uses_the_glossary_words_and_splices_verdicts_into_frames_that_read_for_any_word():
    """Issue 24's vocabulary: none of the old verdict words; a glued verdict (a key ending in ``_verdict``) stands
    after "verdict:", a colon or "reads", so that the sentence parses whichever word of the glossary it is (on the
    guide and on the front page's Start here box)."""
    text = GUIDE.read_text() + "\n" + _start_here(INDEX.read_text())
    prose = re.sub(r"`[^`]*`", " ", ROLE.sub(" ", text))
    for word in STALE_VERDICTS:
        assert not re.search(rf"\b{word}\b", prose), word
    assert "](glossary.md)" in text
    for m in re.finditer(r"\{glue:md\}`[^`]*_verdict`", text):
        before = re.sub(r"\s+", " ", text[max(0, m.start() - 40):m.start()]).rstrip()
        assert before.endswith(":") or before.endswith(" reads"), f"{before[-30:]!r} + {m.group(0)}"


def _start_here(text: str) -> str:
    return text[text.index("{admonition} Start here"):text.index("\n```\n", text.index("{admonition} Start here"))]


def test_front_page_links_the_guide_before_the_first_chapter_and_answers_every_chapter_in_one_line():
    text = INDEX.read_text()
    first_chapter = text.index("](../chapters/")
    assert text.index("](guide.md)") < first_chapter, "the front page links a chapter before the guide"
    assert text.index("{admonition} Start here") < first_chapter and "Start here: what to do" in text
    box = _start_here(text)
    pages = _chapter_sources()
    for page in pages:
        lines = [ln for ln in re.split(r"\n- ", box) if f"]({page})" in ln]
        assert len(lines) == 1, f"the Start here box has {len(lines)} lines for {page}"
        glued = re.findall(r"\{glue(?::\w+)?\}`([^`:]+\.ipynb)::(ch\d\d)_", lines[0])
        assert glued and {p for p, _ in glued} == {page}, f"{page}'s line glues nothing of its own: {lines[0]!r}"
    flat = re.sub(r"\s+", " ", box)
    for word in ("small", "synthetic", "digits", "randomly initialized", "ImageNet"):  # the limits, stated once
        assert word in flat, word
    assert text.count("ImageNet") == 1


def test_front_page_glues_only_keys_of_the_chapter_it_names():
    pages = _chapter_sources()
    for page, key in re.findall(r"\{glue(?::\w+)?\}`([^`]+?)::(\w+)", INDEX.read_text()):
        assert page in pages, page
        assert key.startswith(f"ch{page.split('/')[-1][:2]}_"), (page, key)


@pytest.mark.slow
def test_built_front_page_links_the_guide_before_any_chapter(built_html):
    page = (built_html / "book" / "index.html").read_text()
    main = page[page.index('<main'):]
    assert main.index('href="guide.html') < main.index('href="../chapters/01-freeze-modes.html')
    assert "glue:" not in main and "::ch0" not in main


# The guide's blocks with the front door's requirements only (torch and numpy): tests/test_code_blocks.py runs
# every page's python blocks that way, the guide's included.


def test_every_chapters_plain_lead_pastes_inline_on_the_front_page():
    """Issue 37: the front page opens each chapter's line with the chapter's ``lead`` note, glued across pages, so every
    alternative must be inline Markdown the cross-page glue renders (no code, links or underscores), one sentence,
    opening with a bold answer; a lead the renderer refused would be a build warning, and the book builds with -W."""
    from bnstudy.study.experiments.freeze_modes import findings as f1
    from bnstudy.study.experiments.real_data import findings as f7
    from bnstudy.study.experiments.shift_strength import findings as f3
    from bnstudy.study.experiments.unknown_task import findings as f6
    from bnstudy.study.sphinxext import inline_markdown
    from bnstudy.study.experiments.eval_traps import findings as f2
    from bnstudy.study.experiments.heads import findings as f4
    leads = [n.text for rules in (f1.NOTES, f2.NOTES, f3.NOTES, f6.LEAD, f7.NOTES) for n in rules if n.key == "lead"]
    leads += [n.text.format(higher=10, lower=2, m=15, steps_steps_short=800) for n in f4.NOTES if n.key == "plain"]
    assert len(leads) == 3 + 2 + 4 + 5 + 3 + 5
    for text in leads:
        assert inline_markdown(text) is not None, text
        assert text.startswith("**") and text.count(". ") <= 1 and text.endswith("."), text
    assert inline_markdown("**No.** Pin it with `bnstudy.pin_eval(model)`.") is None  # what the check refuses
    text = INDEX.read_text()
    for page in _chapter_sources():
        stem = page.split("/")[-1][:2]
        if stem in ("01", "02", "03", "06", "07"):
            assert text.count(f"{{glue:md}}`{page}::ch{stem}_lead`") == 2, page  # the box and the findings
        if stem == "04":
            assert text.count(f"{{glue:md}}`{page}::ch04_plain`") == 2, page
