"""Chapter 1: does a frozen backbone stay frozen? The four freeze modes, paired over seeds: :mod:`.run` (what is
trained), :mod:`.findings` (what is claimed) and :mod:`.figures` (what is drawn)."""
