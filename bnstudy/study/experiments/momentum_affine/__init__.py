"""Chapter 9 (issue 39): how fast should BatchNorm's statistics follow when a network is fine-tuned
(momentum), and what should be trained (BatchNorm's affine parameters only?).

Three parts, each paired within a seed:

1. **Momentum.** The book's source network (chapters 1, 6 and 8's stage 1) is fine-tuned whole on task B, a close
   and a shifted target, at two batch sizes; the running statistics that every BatchNorm momentum of a grid (and
   PyTorch's cumulative average) would hold are tracked on the same training run, and at each of three step
   budgets they are compared with a precise-BN estimate at the weights of that step (Wu & Johnson 2021), scored by
   eval-mode accuracy on task B and task A's retention, against two published rules (PyTorch's 0.1; Kornblith,
   Shlens & Le 2019's ``min(10 / s, 0.1)``, ``s`` steps per epoch) and precise BN after training.
2. **What to train.** Head only; BatchNorm's affine + head with statistics pinned; affine + head with statistics in
   train mode (fastai's and Lightning's ``train_bn=True``); head only with statistics in train mode (the two-by-two's
   fourth cell); the first block + head; the whole network; per shift family (brightness/contrast, noise, blur), for
   new classes and for the source's classes seen through the shift, with the trainable share of parameters, task-B
   accuracy and task-A retention, each condition at its own learning rate, chosen on tuning seeds.
3. **Frankle, Schwab & Morcos 2021 at digit scale.** From a random initialisation, train only BatchNorm's ``gamma``
   and ``beta`` (and the output layer) on task A, against the same number of randomly chosen convolution weights,
   against the output layer alone and against every parameter.

:mod:`.run` (what is run), :mod:`.claims` (the questions, fixed before any full-profile row was computed, and the
page's numbers, tables and rule-triggered sentences) and :mod:`.figures`; the page is
``chapters/09_momentum_affine.ipynb``.
"""
