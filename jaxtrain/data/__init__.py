"""Text in, token batches out: `corpus` is the one entry for what a run needs, the other modules
are behind it (docs/layout.md says what each holds).

May import: system, config.
"""
