"""`python -m jaxtrain.sample --workdir=runs/nano [--prompt=...]`: text from a trained run.

The command lives in jaxtrain/tools/sample.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.sample import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
