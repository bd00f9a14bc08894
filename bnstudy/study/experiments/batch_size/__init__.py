"""Chapter 5: what do small batches do to BatchNorm, and which fine-tuning strategy survives them?

The chapter in three parts: :mod:`.run` (what is trained: configs, profiles, :func:`.run.run`), :mod:`.findings`
(what is claimed: claims tables, findings, sentences) and :mod:`.figures` (what is drawn).
"""
