"""Chapter 1: does a frozen backbone stay frozen? The four freeze modes, paired over seeds.

The chapter in three parts: :mod:`.run` (what is trained: the main run, the head sweep, the thread check),
:mod:`.findings` (what is claimed: claims tables, the records and sentences the page glues) and :mod:`.figures`
(what is drawn). Import them as ``from bnstudy.study.experiments.freeze_modes import run, findings, figures``.
"""
