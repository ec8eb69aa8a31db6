"""`python -m jaxtrain.compare RUN... [--out=DIR]`: runs side by side, best first.

The command lives in jaxtrain/tools/compare.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.compare import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
