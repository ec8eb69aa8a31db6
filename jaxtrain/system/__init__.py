"""Process and file plumbing that every other folder uses (docs/layout.md says what each module
holds).

May import: nothing else of jaxtrain.
"""
