"""Chapter 3: where the crossover sits, the cost and the benefit of drifting BatchNorm statistics against shift
strength. :mod:`.run` (what is trained), :mod:`.findings` (what is claimed), :mod:`.figures` (what is drawn)."""
