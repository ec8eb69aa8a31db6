"""`python -m jaxtrain.chat --workdir=runs/chat [--system=...]`: talk with a run trained on chat
records."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.chat")
