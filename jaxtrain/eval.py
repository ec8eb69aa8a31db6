"""`python -m jaxtrain.eval --workdir=runs/task --data=held_out.jsonl`: task scores of a run."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.eval", before_jax=True)
