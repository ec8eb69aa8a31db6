"""Which attention kernel a run uses: jaxtrain's own (XLA ops, `ops.causal_attention`) or cuDNN's
fused flash attention, which needs an NVIDIA GPU and 16-bit inputs."""

import jax
import jax.numpy as jnp

from jaxtrain.system.errors import ConfigError


def resolve_attention(choice: str, dtype: str, seq_len: int, n_heads: int, head_dim: int,
                      platform: str, deterministic: bool = False) -> tuple[str, str]:
  """(implementation, why) on `platform`'s devices: "auto" takes cuDNN's fused attention where it
  compiles, else XLA's; a deterministic run takes XLA's (cuDNN's backward pass is not)."""
  on_gpu = platform == "gpu"
  if choice == "cudnn" and not on_gpu:
    raise ConfigError("model.attention", "cudnn needs an NVIDIA GPU",
                      "pass --config.model.attention=auto (or xla)")
  if choice == "cudnn" and deterministic:
    raise ConfigError("model.attention", "cudnn's fused attention is not deterministic",
                      "pass --config.model.attention=auto (or xla) with train.deterministic=True")
  if choice != "auto":
    return choice, "as configured"
  if not on_gpu:
    return "xla", f"{platform} has no cuDNN"
  if deterministic:
    return "xla", "deterministic (cuDNN's fused attention backward is not)"
  if dtype not in ("bfloat16", "float16"):
    return "xla", "cuDNN attention needs 16-bit inputs"
  x = jax.ShapeDtypeStruct((1, seq_len, n_heads, head_dim), jnp.dtype(dtype))
  try:  # shapes cuDNN does not support fail here, at compile time
    jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn")).lower(x, x, x).compile()
  except Exception as e:  # the reasons vary by cuDNN version: any failure means "not here"
    return "xla", f"cuDNN attention unavailable ({str(e).splitlines()[0][:100]})"
  return "cudnn", "cuDNN fused attention"
