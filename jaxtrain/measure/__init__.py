"""What a run costs and how fast it goes: before it starts, as it trains, at its end, and what a
time budget can train here (docs/layout.md says what each module holds; what this machine is, and
what was measured on it, live in system/).

May import: system, config, core, data.
"""
