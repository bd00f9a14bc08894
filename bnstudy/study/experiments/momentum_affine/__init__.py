"""Chapter 9 (issue 39): how fast should BatchNorm's statistics follow when a network is fine-tuned (momentum), what
should be trained (BatchNorm's affine parameters only, statistics pinned or in train mode?), and Frankle, Schwab &
Morcos 2021's BatchNorm-only training at digit scale.

:mod:`.run` (what is run), :mod:`.claims` (the questions, fixed before any full-profile row was computed, and the
page's numbers, tables and sentences) and :mod:`.figures`; the page is ``chapters/09_momentum_affine.ipynb``.
"""
