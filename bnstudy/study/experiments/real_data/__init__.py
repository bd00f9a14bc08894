"""Chapter 7: do the findings hold on real handwritten digits and standard torchvision networks?

Do chapter 1's and chapter 3's findings carry over to real images and to the networks people fine-tune? Chapter
1's four freeze modes and chapter 3's statistics mismatch as a predictor of what drifting statistics cost, on
scikit-learn's bundled digit scans with the book's small CNN, ResNet-18 and MobileNetV3-small (random
initialization, nothing downloaded).

In three parts (docs/chapter-code.md): :mod:`.run` (what is trained), :mod:`.findings` (what is claimed) and
:mod:`.figures` (what is drawn).
"""
