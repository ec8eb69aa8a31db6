"""`python -m jaxtrain.lm_eval --model jaxtrain --model_args workdir=runs/nano --tasks ...`:
lm-evaluation-harness on a run (tools/harness.py)."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.harness")
