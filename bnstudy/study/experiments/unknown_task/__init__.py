"""Chapter 6: can separate statistics serve inputs whose task is unknown at inference?

``separate_stats`` (chapter 1) keeps task A exact and adapts each new task, but at inference it must know which
statistics an input needs. This chapter keeps one bank of BatchNorm statistics per task over one frozen backbone
and routes every input to a bank by what the input alone shows: where does that routing reach the right bank,
and what does a wrong one cost?

Three parts: :mod:`.run` (what is trained), :mod:`.findings` (what is claimed), :mod:`.figures` (what is drawn).
"""
