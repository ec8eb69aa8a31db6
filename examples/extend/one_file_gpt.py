"""A whole GPT in one file, to copy, change and name in the config:

  cp examples/extend/one_file_gpt.py my_gpt.py   # then change my_gpt.py as you like
  jaxtrain --config=nano --config.extend=my_gpt.py --config.model.arch=my_gpt

(rename the model in its @jt.model("...") line first: two files may not register one name).

It is the model jaxtrain's own `gpt` builds for the nano recipe, written top to bottom in plain JAX
and flax NNX: token embeddings, n_layers pre-norm blocks (RMSNorm, attention with rotary positions,
a SwiGLU MLP), a final RMSNorm and the head. Trained from the same seed, its loss at step 100 is the
built-in model's to float rounding (tests/test_extend.py). The rest is the trainer's, as for any
model: data, optimizer, schedule, checkpoints and exact resume, time budget, sampling (without a
key-value cache: each new token runs the whole window), compare, sweeps.

What a model gets: `c`, the run's ModelConfig (c.n_layers, c.d_model, c.n_heads, c.seq_len,
c.vocab_size, c.dtype, ...), and `rngs`, whose rngs.params() gives each param's key. What it gives
back: model(tokens_BT) -> float32 logits [B, T, V]. The optimizer groups params by their names, as
jaxtrain's own model names them: `wte` (embeddings) and `lm_head` (the head) apart from the blocks'
2-D matrices (Muon's), and weight decay falls on matrices only.
Shapes: B batch, T time, D width, H query heads, G key/value heads, K head size, F MLP width, V vocab.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

import jaxtrain as jt

# Fields of model.* this model does not read: a run that sets one is refused, not silently
# trained without it (write it in here, and drop it from this list).
NOT_READ = {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "attention_variant": "causal",
            "block": "prenorm", "dropout": 0.0, "qk_norm": False, "canon": 0, "x0_mix": False,
            "doc_mask": False, "remat": "none"}


def check(cfg):
  for field, value in NOT_READ.items():
    if cfg.model[field] != value:
      raise jt.ConfigError(f"model.{field}", f"is {cfg.model[field]!r}, which one_file_gpt does not "
                           "read", f"leave it {value!r}, or write it into the model's file")


def normal(rngs, shape, std):
  """A float32 param drawn from N(0, std^2), its key the next of rngs (the order matters: jaxtrain's
  own model draws the same params in the same order)."""
  return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32) * std)


class Linear(nnx.Module):
  def __init__(self, d_in, d_out, std, c, rngs):
    self.kernel = normal(rngs, (d_in, d_out), std)
    self.dtype = c.dtype  # compute dtype; params stay float32

  def __call__(self, x):
    return x.astype(self.dtype) @ self.kernel[...].astype(self.dtype)


class Embed(nnx.Module):
  def __init__(self, c, rngs):
    self.embedding = normal(rngs, (c.vocab_size, c.d_model), 0.02)
    self.dtype = c.dtype

  def __call__(self, tokens_BT):
    return jnp.take(self.embedding[...], tokens_BT, axis=0).astype(self.dtype)


def rope(x_BTHK, theta):
  """Rotary positions: each pair of a head's halves turned by an angle that grows with position."""
  T, K = x_BTHK.shape[1], x_BTHK.shape[-1]
  inv_freq_K = 1.0 / (theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))
  angles_TK = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq_K[None, :]
  cos, sin = (f(angles_TK)[None, :, None, :].astype(x_BTHK.dtype) for f in (jnp.cos, jnp.sin))
  x1, x2 = x_BTHK[..., :K // 2], x_BTHK[..., K // 2:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def out_std(c):
  """Projections back into the residual stream start at zero, or scaled down by depth."""
  return 0.0 if c.zero_init_out else 0.02 / math.sqrt(2 * c.n_layers)


class Attention(nnx.Module):
  def __init__(self, c, rngs):
    self.H, self.G, self.K = c.n_heads, c.n_kv_heads or c.n_heads, c.d_model // c.n_heads
    self.theta = c.rope_theta
    self.qkv = Linear(c.d_model, (self.H + 2 * self.G) * self.K, 0.02, c, rngs)  # one matmul
    self.out = Linear(c.d_model, c.d_model, out_std(c), c, rngs)

  def __call__(self, x_BTD):
    B, T, D = x_BTD.shape
    H, G, K = self.H, self.G, self.K
    q, k, v = jnp.split(self.qkv(x_BTD), [H * K, (H + G) * K], axis=-1)
    q_BTHK, k_BTGK, v_BTGK = q.reshape(B, T, H, K), k.reshape(B, T, G, K), v.reshape(B, T, G, K)
    q_BTHK, k_BTGK = rope(q_BTHK, self.theta), rope(k_BTGK, self.theta)
    k_BTHK, v_BTHK = (jnp.repeat(x, H // G, axis=2) for x in (k_BTGK, v_BTGK))  # grouped query
    scores_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK * K**-0.5, k_BTHK).astype(jnp.float32)
    causal_TS = jnp.tril(jnp.ones((T, T), bool))  # position t sees positions up to t
    probs_BHTS = jax.nn.softmax(jnp.where(causal_TS, scores_BHTS, -jnp.inf), axis=-1)
    y_BTHK = jnp.einsum("bhts,bshk->bthk", probs_BHTS.astype(x_BTD.dtype), v_BTHK)
    return self.out(y_BTHK.reshape(B, T, D))


class MLP(nnx.Module):
  def __init__(self, c, rngs):
    F = 8 * math.ceil(2 / 3 * c.mlp_ratio * c.d_model / 8)  # 2/3 of 4D: the params of a GELU MLP
    self.up = Linear(c.d_model, 2 * F, 0.02, c, rngs)  # gate and up projections, one matmul
    self.down = Linear(F, c.d_model, out_std(c), c, rngs)

  def __call__(self, x_BTD):
    gate_BTF, up_BTF = jnp.split(self.up(x_BTD), 2, axis=-1)
    return self.down(jax.nn.silu(gate_BTF) * up_BTF)


def rms_norm(c, rngs):
  return nnx.RMSNorm(c.d_model, epsilon=1e-5, dtype=jnp.dtype(c.dtype), rngs=rngs)


class Block(nnx.Module):
  def __init__(self, c, rngs):
    self.norm1 = rms_norm(c, rngs)
    self.attn = Attention(c, rngs)
    self.norm2 = rms_norm(c, rngs)
    self.mlp = MLP(c, rngs)

  def __call__(self, x_BTD):
    x_BTD = x_BTD + self.attn(self.norm1(x_BTD))
    return x_BTD + self.mlp(self.norm2(x_BTD))


@jt.model("one_file_gpt", check=check)
class GPT(nnx.Module):
  def __init__(self, c, rngs):
    self.c = c  # the trainer and generation read it (c.seq_len)
    self.wte = Embed(c, rngs)
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.n_layers)])
    self.norm_f = rms_norm(c, rngs)
    if not c.tie_embeddings:
      self.lm_head = Linear(c.d_model, c.vocab_size, 0.02, c, rngs)

  def __call__(self, tokens_BT):
    x_BTD = self.wte(tokens_BT)
    for block in self.blocks:
      x_BTD = block(x_BTD)
    x_BTD = self.norm_f(x_BTD).astype(self.c.dtype)
    w_DV = self.wte.embedding[...].T if self.c.tie_embeddings else self.lm_head.kernel[...]
    # float32 logits: the products summed in float32, never rounded to a 16-bit dtype first
    return jnp.matmul(x_BTD, w_DV.astype(self.c.dtype), preferred_element_type=jnp.float32)
