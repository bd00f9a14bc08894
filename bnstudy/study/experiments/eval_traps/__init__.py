"""Chapter 2, eval() traps: which everyday calls undo a freeze of a network's BatchNorm layers, how does the freeze
audit catch each, and what fixes it?

Three parts, read in order: :mod:`.run` (what is trained: the traps, their configs and the tables a run saves),
:mod:`.findings` (what is claimed: the claims and numbers tables and the sentences the page glues) and :mod:`.figures`
(what is drawn: the chapter's figures and display tables).
"""
