"""`python -m jaxtrain.export --workdir=runs/nano --out=DIR`: a Hugging Face transformers directory.

The command lives in jaxtrain/tools/export.py."""

from jaxtrain.system import exiting
from jaxtrain.tools.export import main

if __name__ == "__main__":
  exiting.quiet_broken_pipe()
  main()
