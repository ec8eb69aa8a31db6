"""The model's shape (`ModelConfig`) and what follows from it without building the model: its
matmul FLOPs. Kept free of flax, so that a process can size its CPU devices before importing it.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  n_layers: int
  n_heads: int
  d_model: int
  seq_len: int
  norm: str = "rmsnorm"
  pos: str = "rope"
  mlp: str = "swiglu"
  mlp_ratio: float = 4.0
  tie_embeddings: bool = True
  dropout: float = 0.0
  rope_theta: float = 10000.0
  dtype: str = "float32"
  attention: str = "xla"  # "xla" (jaxtrain's, in XLA ops) or "cudnn"; "auto" resolved by from_config

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "ModelConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model.to_dict().items() if k in fields}
    kwargs["vocab_size"] = vocab_size
    kwargs["attention"] = resolve_attention(model.attention, model.dtype, model.seq_len,
                                            model.n_heads, model.d_model // model.n_heads)[0]
    return cls(**kwargs)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def mlp_hidden(self) -> int:
    if self.mlp == "gelu":
      return int(self.mlp_ratio * self.d_model)
    # SwiGLU has three matrices instead of two: 2/3 of the width keeps the parameter count.
    return 8 * math.ceil(2 / 3 * self.mlp_ratio * self.d_model / 8)


def resolve_attention(choice: str, dtype: str, seq_len: int, n_heads: int,
                      head_dim: int) -> tuple[str, str]:
  """(implementation, why): "auto" takes cuDNN's fused attention where it compiles, else XLA's."""
  on_gpu = jax.default_backend() == "gpu"
  if choice == "cudnn" and not on_gpu:
    from jaxtrain.errors import ConfigError

    raise ConfigError("model.attention", "cudnn needs an NVIDIA GPU",
                      "pass --config.model.attention=auto (or xla)")
  if choice != "auto":
    return choice, "as configured"
  if not on_gpu:
    return "xla", f"{jax.default_backend()} has no cuDNN"
  if dtype not in ("bfloat16", "float16"):
    return "xla", "cuDNN attention needs 16-bit inputs"
  x = jax.ShapeDtypeStruct((1, seq_len, n_heads, head_dim), jnp.dtype(dtype))
  try:  # shapes cuDNN does not support fail here, at compile time
    jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn")).lower(x, x, x).compile()
  except Exception as e:  # the reasons vary by cuDNN version: any failure means "not here"
    return "xla", f"cuDNN attention unavailable ({str(e).splitlines()[0][:100]})"
  return "cudnn", "cuDNN fused attention"


def matmul_param_count(c: ModelConfig) -> int:
  """Parameters that take part in a matmul: attention and MLP kernels, and the output projection.

  Norm scales, position embeddings and the input embedding lookup cost no matmul FLOPs.
  """
  F = c.mlp_hidden
  attn = 4 * c.d_model * c.d_model
  mlp = (3 if c.mlp == "swiglu" else 2) * c.d_model * F
  return c.n_layers * (attn + mlp) + c.vocab_size * c.d_model


def flops_per_token(c: ModelConfig, training: bool = True) -> int:
  """Matmul FLOPs per token: 2N forward plus 4*L*T*D for the attention scores and values.

  Training (forward + backward) is 3x the forward pass: 6N + 12*L*T*D.
  """
  forward = 2 * matmul_param_count(c) + 4 * c.n_layers * c.seq_len * c.d_model
  return 3 * forward if training else forward


def flops_per_step(c: ModelConfig, batch_size: int) -> int:
  """Training FLOPs of one micro-batch of `batch_size` full-length rows."""
  return flops_per_token(c) * batch_size * c.seq_len
