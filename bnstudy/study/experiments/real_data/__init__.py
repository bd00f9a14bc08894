"""Chapter 7: do chapter 1's and 3's findings hold on real handwritten digits and torchvision networks? In three parts
(docs/chapter-code.md): :mod:`.run` (what is trained), :mod:`.findings` (what is claimed), :mod:`.figures` (drawn)."""
