"""`python -m jaxtrain.eval --workdir=runs/task --data=held_out.jsonl`: task scores of a run.

The command lives in jaxtrain/tools/evaluate.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.evaluate import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
