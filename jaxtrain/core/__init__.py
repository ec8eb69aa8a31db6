"""The model and what turns it into compiled programs, `programs.build` the one way a config becomes
jitted init/train/eval programs (docs/layout.md says what each module holds).

May import: system, config.
"""
