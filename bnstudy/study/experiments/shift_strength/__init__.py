"""Chapter 3: where the crossover sits. Drifting BatchNorm statistics against shift strength.

Chapter 1 shows that the one-line freeze (``train_mode``) lets the backbone's ``running_mean``/``running_var`` drift
to task B's statistics: that costs task A and helps task B. How do that cost and that benefit grow as the shift
between the tasks grows, and at what strength does the benefit stop paying for the cost?

The chapter in three parts (docs/chapter-code.md): :mod:`.run` (what is trained: the shift lines, the grid, the
budget check and the statistics mismatch of each run), :mod:`.findings` (what is claimed: paired effects, per-level
verdicts, the crossover, the mismatch candidates, the page's records and sentences) and :mod:`.figures` (what is
drawn).
"""
