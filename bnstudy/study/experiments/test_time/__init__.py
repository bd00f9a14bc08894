"""Chapter 8 (in progress, issue 38): statistics at test time. Adapt to the test batch, or route each sample to a bank?

One source network (chapter 6's: backbone and head trained on task A) meets task A's images under chapter 6's
shifts at test time. Batch-level test-time adaptation (test-batch statistics, Schneider et al.'s prior-weighted
mix, a DUA-style running update, TENT) is compared with per-sample routing to domain-specific statistic banks
(chapter 6's router) and with an oracle bank, on single-domain, mixed-domain and class-sorted test streams.

:mod:`.run` (what is run). The claims and the page follow in a later stop; the chapter is not yet in the book.
"""
