"""Chapter 4: does the head absorb the shift? Does a deeper head, a head with its own normalization or another
optimizer, each at a rate searched per head, mode and shift, close the *gap* ``task_b(separate_stats) -
task_b(backbone_eval)`` that pinning the backbone's statistics costs the new head? Comparisons are paired per seed.
"""
