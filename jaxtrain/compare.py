"""`python -m jaxtrain.compare RUN... [--out=DIR]`: runs side by side, best first."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.compare")
