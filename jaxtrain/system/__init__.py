"""Process and file plumbing that every other folder uses: errors, number formats, the exit
path, paths and JSON files (the one metrics.jsonl reader), locks, the memory allocator, lost
peers, JAX process setup, collectives and how many dispatches may run ahead (`runtime`), signal
handling, what a person sees (`console`: the progress bar or lines; the libraries' logs kept in a
file), and what this machine is (`machine`: CPU, cores, memory, a process's start, the load) and
what was measured on it (`measured`: cached with its load and age).

May import: nothing else of jaxtrain.
"""
