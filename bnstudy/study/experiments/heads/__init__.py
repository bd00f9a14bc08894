"""Chapter 4: does the head absorb the shift? Pinning the backbone's statistics keeps task A exactly but, with SGD
and momentum, costs the new head on task B (chapter 1, the seed article's finding 3). Does a deeper head (``mlp``,
``mlp2``), a head with its own normalization (``mlp_bn``, ``mlp_ln``) or another optimizer (plain SGD, Adam), each
at a learning rate searched per head, mode and shift on held-out seeds, close the *gap* ``task_b(separate_stats) -
task_b(backbone_eval)``, at no shift, a middle one and chapter 1's? Within a seed every head, optimizer and mode
shares the backbone, the task-B stream and the head initialization: comparisons are paired per seed.
"""
