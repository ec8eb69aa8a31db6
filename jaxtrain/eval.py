"""`python -m jaxtrain.eval --workdir=runs/task --data=held_out.jsonl`: task scores of a run.

The command lives in jaxtrain/tools/eval.py."""

from jaxtrain.system import exiting

if __name__ == "__main__":
  exiting.install()  # before jax is imported: the command ends without XLA's teardown
  exiting.quiet_broken_pipe()
  from jaxtrain.tools.eval import main

  main()
