"""`python -m jaxtrain.chat --workdir=runs/chat [--system=...]`: talk with a run trained on chat
records.

The command lives in jaxtrain/tools/chat.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.chat import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
