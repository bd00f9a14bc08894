"""Chapter 4: does the head absorb the shift? Head depth, the head's own normalization, and its optimizer.

Chapter 1 found that pinning the backbone's statistics (``backbone_eval``, ``all_eval``) keeps
task A exactly but leaves the new head with task-B features normalized by task A's
statistics, and that with SGD and momentum the new head then scores lower on task B than
with task B's own statistics (the seed article's finding 3). This module asks whether a
different head or a different head optimizer closes that gap:

* heads (:func:`bnstudy.study.models.make_head`, ``hidden`` units per hidden layer, 64 by default):
  ``linear``; ``mlp`` (one hidden layer); ``mlp2`` (two); ``mlp_bn`` (one, with its own
  BatchNorm1d and running statistics); ``mlp_ln`` (one, with its own LayerNorm);
* optimizers (:func:`bnstudy.study.engine.make_optimizer`): ``sgd`` (momentum 0.9), ``sgd_plain``
  (no momentum), ``adam``, each at a learning rate chosen per head, mode and shift by the same
  small search (:func:`lr_search`, :func:`chosen_lrs_by_shift`) on held-out tuning seeds and a
  task-B *validation* set (``RunConfig(eval_split="validation")``), never on the reported seeds
  or the test set;
* the four freeze modes; three shifts: none, chapter 1's ``(brightness 4, contrast 5)`` and one
  point between on chapter 3's ``both`` line (:func:`bnstudy.study.experiments.shift_strength.run.shift_of`).

Within a seed every head, optimizer and mode sees the same trained backbone and the same
task-B batch stream, and every mode and optimizer of a head the same head initialization
(the engine draws it from ``(seed, "init", "head_b", head)``): comparisons are paired per seed.

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed
(condition minus the pinned reference, the book's one sign: positive when pinning costs the new task). Every
interval, test and verdict comes from :mod:`bnstudy.study.inference`: the cells of one shift are one family
(Bonferroni intervals, equivalence at ``alpha / m``, Holm counts).

The chapter in three parts: :mod:`.run` (what is trained: ``Config`` -> ``run_tables``, the search, the sweep, the
step-count check, the measured explanation ``feature_geometry`` and the buffer audit ``audit_buffers``),
:mod:`.findings` (what is claimed: its ``QUESTIONS`` asked by ``claims`` into a claims table, ``findings``' numbers
table, and the page's sentences) and :mod:`.figures` (what is drawn).
"""
