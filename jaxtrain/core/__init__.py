"""The model and what turns it into compiled programs, `programs.build` the one way a config becomes
jitted init/train/eval programs; the registry of the components a config names, built-in and the
user's own, and their check (docs/layout.md says what each module holds).

May import: system, config.
"""
