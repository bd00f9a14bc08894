"""Chapter 2, eval() traps: which everyday calls undo a freeze of a network's BatchNorm layers, how does the freeze
audit catch each, and what fixes it? :mod:`.run` (what is trained), :mod:`.findings` (what is claimed) and
:mod:`.figures` (what is drawn)."""
