"""Chapter 5, small batches and BatchNorm: :mod:`.run` (what is trained), :mod:`.findings` and :mod:`.decision`
(what is claimed) and :mod:`.figures` (what is drawn)."""
