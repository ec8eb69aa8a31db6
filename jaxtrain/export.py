"""`python -m jaxtrain.export --workdir=runs/nano --out=DIR`: a Hugging Face transformers directory."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.export")
