"""`python -m jaxtrain.sample --workdir=runs/nano [--prompt=...]`: text from a trained run."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.sample", before_jax=True)
