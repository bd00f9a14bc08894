"""The book's study machinery (``bnstudy[study]``): configs, the training engine, cached sweeps, the claims
engine (``inference``, ``words``, ``pages``), the data release and the book runner, and one folder per chapter
(``experiments/NAME/``: ``run`` (the design), ``findings`` (the claims), ``figures``). The practitioner's
library is the package above it (``import bnstudy``).
"""
