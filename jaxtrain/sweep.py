"""`python -m jaxtrain.sweep --config=... --sweep=a.b=x,y --root=DIR`: a grid of runs, then compare."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.sweep")
