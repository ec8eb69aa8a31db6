"""Process and file plumbing that every other folder uses: errors, number formats, the exit
path, paths and JSON files (the one metrics.jsonl reader), locks, the memory allocator, lost
peers, JAX process setup and collectives, and signal handling.

May import: nothing else of jaxtrain.
"""
