"""`python -m jaxtrain.sweep --config=... --sweep=a.b=x,y --root=DIR`: a grid of runs, then compare.

The command lives in jaxtrain/tools/sweep.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.sweep import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
