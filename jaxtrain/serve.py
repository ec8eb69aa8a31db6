"""`python -m jaxtrain.serve --workdir=runs/nano [--port=8000]`: a run's model behind an
OpenAI-compatible HTTP API, with a chat page."""

from jaxtrain import commands

if __name__ == "__main__":
  commands.tool("jaxtrain.tools.serve", before_jax=True)
