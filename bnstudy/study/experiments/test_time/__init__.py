"""Chapter 8 (issue 38): statistics at test time. Adapt to the test batch (test-batch statistics, a prior-weighted
mix, a DUA-style update, TENT), or route each sample to a bank of statistics per domain (chapter 6's router)?

:mod:`.run` (what is run), :mod:`.claims` (the questions and the page's numbers, tables and sentences) and
:mod:`.figures`; the page is ``chapters/08_test_time.ipynb``.
"""
