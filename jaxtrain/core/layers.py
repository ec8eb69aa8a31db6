"""The model's parts, each kind's built-ins registered as an extension's are (core/registry.py):
norms, positions, MLPs, attention variants and the block; and what they share: `Dense`, `Embed`,
the attention's projections (`Attention`), and `Attend`, what an attention variant is given.
A part is made by `make(kind, c, rngs)` from the component its config field names; a block's
parts see one forward pass through its `Context` (positions, document mask, key-value cache).
Shape suffixes as in model.py, plus S key positions (T in training; the cache's with one).
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain.core import draws, ops, registry
from jaxtrain.core.registry import decorator as _builtin
from jaxtrain.system.errors import ConfigError, UserError


class Dense(nnx.Module):
  """A bias-free linear layer whose backward pass is `ops.dense`'s (params stay float32)."""

  def __init__(self, d_in: int, d_out: int, *, dtype, kernel_init, rngs: nnx.Rngs):
    self.kernel = nnx.Param(kernel_init(rngs.params(), (d_in, d_out), jnp.float32))
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    return ops.dense(x.astype(self.dtype), self.kernel[...].astype(self.dtype))


class Embed(nnx.Module):
  """A token embedding, `embedding` float32[V, D] (the layout of `nnx.Embed`), looked up by
  `ops.embed`: rows are cast to `dtype` after the lookup, and the gradient sums in float32."""

  def __init__(self, vocab_size: int, d: int, *, dtype, grad: str, embedding_init, rngs: nnx.Rngs):
    self.embedding = nnx.Param(embedding_init(rngs.params(), (vocab_size, d), jnp.float32))
    self.dtype = dtype
    self.grad = grad

  def __call__(self, tokens: jax.Array) -> jax.Array:
    return ops.embed(self.embedding[...], tokens, self.dtype, self.grad)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if rate == 0.0 or key is None:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def out_std(c) -> float:
  """Projections back into the residual stream: zero (each block starts as the identity) or
  scaled down, since 2 residual branches per layer add up."""
  return 0.0 if c.zero_init_out else 0.02 / math.sqrt(2 * c.n_layers)


def make(kind: str, c, rngs: nnx.Rngs):
  """The `kind` part of a model of `c` (a ModelConfig), its component's options given."""
  component = registry.get(kind, _chosen(kind, c))
  return registry.call(component, c, rngs, options=c.options_of(component.name))


def _chosen(kind: str, c) -> str:
  return getattr(c, registry.KINDS[kind].field.split(".")[1])


def expect(y, like, kind: str, c, what: str = "returned"):
  """A part's output must have `like`'s shape and dtype: one line naming the part and its file."""
  component = registry.get(kind, _chosen(kind, c))
  if isinstance(y, jax.Array | jax.ShapeDtypeStruct) and (y.shape, y.dtype) == (like.shape, like.dtype):
    return y
  got = f"{y.dtype}{list(y.shape)}" if hasattr(y, "shape") else type(y).__name__
  raise UserError(f"{registry.KINDS[kind].field}={component.name}: the {kind} ({component.where}) "
                  f"{what} {got}, not {like.dtype}{list(like.shape)} (its input's shape and dtype, "
                  f"model.dtype={c.dtype}); make it return that")


def guarded(kind: str, c, fn, *args):
  """`fn(*args)`, a part's call: an exception raised in an extension's code shows its frames."""
  component = registry.get(kind, _chosen(kind, c))
  if component.builtin:
    return fn(*args)
  try:
    return fn(*args)
  except UserError:
    raise
  except Exception as e:
    raise registry.in_component(component, e) from None


# Norms: nnx's, without biases.
@_builtin("norm", "rmsnorm", {}, builtin=True, batched_init=True)
def rmsnorm(c, rngs):
  return nnx.RMSNorm(c.d_model, epsilon=1e-5, dtype=jnp.dtype(c.dtype), rngs=rngs)


@_builtin("norm", "layernorm", {}, builtin=True, batched_init=True)
def layernorm(c, rngs):
  return nnx.LayerNorm(c.d_model, epsilon=1e-5, use_bias=False, dtype=jnp.dtype(c.dtype), rngs=rngs)


# Positions: `embed` adds to the token embeddings, `rotate` turns queries and keys; `start` is the
# window position of x's first token (0 in training, where it stays a Python int).
def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  inv_freq_K = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_TK = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq_K[None, :]
  return jnp.cos(angles_TK), jnp.sin(angles_TK)


def apply_rope(x_BTHK: jax.Array, cos_TK: jax.Array, sin_TK: jax.Array) -> jax.Array:
  half = x_BTHK.shape[-1] // 2
  x1, x2 = x_BTHK[..., :half], x_BTHK[..., half:]
  cos, sin = cos_TK[None, :, None, :].astype(x_BTHK.dtype), sin_TK[None, :, None, :].astype(x_BTHK.dtype)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _even_heads(cfg) -> None:
  head_dim = cfg.model.d_model // cfg.model.n_heads
  if head_dim % 2:
    raise ConfigError("model.d_model", f"RoPE needs an even head size, got d_model/n_heads={head_dim}",
                      "change d_model or n_heads, or pass --config.model.pos=learned")


@_builtin("positions", "rope", {}, builtin=True, batched_init=True, check=_even_heads)
class Rope(nnx.Module):
  def __init__(self, c, rngs):
    self.seq_len, self.head_dim, self.theta = c.seq_len, c.head_dim, c.rope_theta

  def rotate(self, x_BTHK: jax.Array, start) -> jax.Array:
    T = x_BTHK.shape[1]
    if isinstance(start, int) and start == 0:
      return apply_rope(x_BTHK, *rope_tables(T, self.head_dim, self.theta))
    tables = rope_tables(self.seq_len, self.head_dim, self.theta)
    return apply_rope(x_BTHK, *(jax.lax.dynamic_slice_in_dim(t, start, T) for t in tables))


class LearnedPositions(nnx.Param):
  """A learned table float32[seq_len, D] added to the embeddings: a param itself, so that it sits
  where checkpoints and exports have always found it (`wpe`)."""

  def embed(self, x_BTD: jax.Array, start) -> jax.Array:
    T = x_BTD.shape[1]
    wpe_TD = self[:T] if isinstance(start, int) and start == 0 else \
        jax.lax.dynamic_slice_in_dim(self[...], start, T)
    return x_BTD + wpe_TD.astype(x_BTD.dtype)


@_builtin("positions", "learned", {}, builtin=True, batched_init=True)
def learned(c, rngs):
  return LearnedPositions(draws.normal(0.01)(rngs.params(), (c.seq_len, c.d_model), jnp.float32))


@_builtin("positions", "none", {}, builtin=True, batched_init=True)
class NoPositions(nnx.Module):
  def __init__(self, c, rngs):
    pass


# MLPs: SwiGLU's gate and up projections are one matrix, one matmul instead of two.
class MLP(nnx.Module):

  def __init__(self, c, rngs: nnx.Rngs, kind: str):
    self.kind = kind
    dtype = jnp.dtype(c.dtype)
    F = c.mlp_hidden
    self.up = Dense(c.d_model, 2 * F if kind == "swiglu" else F, dtype=dtype,
                    kernel_init=draws.normal(0.02), rngs=rngs)
    self.down = Dense(F, c.d_model, dtype=dtype, kernel_init=draws.normal(out_std(c)), rngs=rngs)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    h = self.up(x_BTD)
    if self.kind == "swiglu":
      gate_BTF, up_BTF = jnp.split(h, 2, axis=-1)
      h_BTF = jax.nn.silu(gate_BTF) * up_BTF
    elif self.kind == "relu2":
      h_BTF = jnp.square(jax.nn.relu(h))
    else:
      h_BTF = jax.nn.gelu(h, approximate=True)
    return self.down(h_BTF)


def _width_at_least_1(cfg) -> None:
  m = cfg.model
  if int(m.mlp_ratio * m.d_model) < 1:
    raise ConfigError("model.mlp_ratio", f"the MLP would have width int(mlp_ratio * d_model) = "
                      f"{int(m.mlp_ratio * m.d_model)}", "pass --config.model.mlp_ratio=4.0")


for _name in ("swiglu", "gelu", "relu2"):
  _builtin("mlp", _name, {}, builtin=True, batched_init=True,
           check=None if _name == "swiglu" else _width_at_least_1)(
               lambda c, rngs, kind=_name: MLP(c, rngs, kind))
