"""Hooks: what watches a run from outside the loop through the `Hook` protocol, and the hooks a run
has; early stopping and the profile see the run only through the protocol, as a user's hook does
(docs/layout.md says what each module holds).

May import: system, config, core.
"""
