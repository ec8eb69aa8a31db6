"""`python -m jaxtrain.export --workdir=runs/nano --out=DIR`: a Hugging Face transformers directory.

The command lives in jaxtrain/tools/export.py."""

from jaxtrain.tools.export import main

if __name__ == "__main__":
  main()
