"""`python -m jaxtrain.sample --workdir=runs/nano [--prompt=...]`: text from a trained run.

The command lives in jaxtrain/tools/sample.py."""

from jaxtrain.system import exiting

if __name__ == "__main__":
  exiting.install()  # before jax is imported: the command ends without XLA's teardown
  exiting.quiet_broken_pipe()
  from jaxtrain.tools.sample import main

  main()
