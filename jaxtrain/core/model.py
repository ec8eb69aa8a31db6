"""Decoder-only, pre-norm transformer in flax NNX, with no biases anywhere; its switches are
`ModelConfig`'s fields. Linear layers, attention and embeddings use `ops`' backward passes (on GPUs
with 16-bit compute, attention can be cuDNN's fused kernel); blocks can be rematerialized (REMAT).
One forward pass serves training and generation: given a key-value cache (`kvcache`), the same
layers run new tokens after the cached ones and write theirs into it.
Shape suffixes: B batch, T time, D d_model, H heads, G key/value heads, K head size, F MLP width, V vocab.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from jaxtrain.config import defaults, validate
from jaxtrain.core import draws, kvcache, ops
from jaxtrain.system.errors import UserError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """The model's shape and switches, by keyword (`ModelConfig(n_layers=2, d_model=64)`); each
  field's default is config/defaults.py's for model.<field> (a byte vocabulary: 256).
  `from_config(cfg.model, vocab_size)` makes one from a run's config."""
  vocab_size: int = 256
  n_layers: int = 4
  n_heads: int = 4
  d_model: int = 128
  seq_len: int = 128
  norm: str = "rmsnorm"
  pos: str = "rope"
  mlp: str = "swiglu"
  mlp_ratio: float = 4.0
  tie_embeddings: bool = True
  dropout: float = 0.0
  rope_theta: float = 10000.0
  dtype: str = "float32"
  attention: str = "xla"  # "xla" (jaxtrain's, in XLA ops), "cudnn", or "auto" (see resolve_attention)
  n_kv_heads: int = 0  # 0: n_heads (multi-head attention); fewer: grouped-query attention
  qk_norm: bool = False
  zero_init_out: bool = False
  doc_mask: bool = False  # attention stays within documents, which end at eot_id
  eot_id: int = -1  # the tokenizer's end-of-text token
  remat: str = "none"  # none | dots | full: what each block keeps for the backward pass (REMAT)
  loss_chunk: int = 0  # tokens per chunk of the chunked cross-entropy (core/loss.py); 0: off
  fused_loss: bool = False  # the cross-entropy and its gradient in one pass (core/loss.py)
  x0_mix: bool = False  # each layer after the first adds a learned multiple of the embeddings
  canon: int = 0  # > 0: short causal convolutions of this width before attention and MLP
  scatter_free: bool = False  # no scatter in the backward pass (programs.scatter_free)

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "ModelConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model.to_dict().items() if k in fields}
    kwargs["vocab_size"] = vocab_size
    return cls(**kwargs)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def kv_heads(self) -> int:
    return self.n_kv_heads or self.n_heads

  @property
  def mlp_hidden(self) -> int:
    return defaults.mlp_width(self.mlp, self.mlp_ratio, self.d_model)


def matmul_param_count(c: ModelConfig) -> int:
  """Parameters that take part in a matmul: attention and MLP kernels, and the output projection
  (norm scales, position embeddings and the input embedding lookup cost no matmul FLOPs)."""
  F = c.mlp_hidden
  attn = c.d_model * (c.n_heads + 2 * c.kv_heads) * c.head_dim + c.d_model * c.d_model
  mlp = (3 if c.mlp == "swiglu" else 2) * c.d_model * F
  return c.n_layers * (attn + mlp) + c.vocab_size * c.d_model


def flops_per_token(c: ModelConfig, training: bool = True) -> int:
  """Matmul FLOPs per token: 2N forward plus 4*L*T*D for the attention scores and values;
  training (forward + backward) is 3x that: 6N + 12*L*T*D."""
  forward = 2 * matmul_param_count(c) + 4 * c.n_layers * c.seq_len * c.d_model
  forward += 2 * 2 * c.n_layers * c.canon * c.d_model  # two convolutions' multiply-adds per layer
  return 3 * forward if training else forward


def flops_per_step(c: ModelConfig, batch_size: int) -> int:
  """Training FLOPs of one micro-batch of `batch_size` full-length rows."""
  return flops_per_token(c) * batch_size * c.seq_len


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


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if rate == 0.0 or key is None:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _norm(c: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
  dtype = jnp.dtype(c.dtype)
  if c.norm == "rmsnorm":
    return nnx.RMSNorm(c.d_model, epsilon=1e-5, dtype=dtype, rngs=rngs)
  return nnx.LayerNorm(c.d_model, epsilon=1e-5, use_bias=False, dtype=dtype, rngs=rngs)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  inv_freq_K = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_TK = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq_K[None, :]
  return jnp.cos(angles_TK), jnp.sin(angles_TK)


def apply_rope(x_BTHK: jax.Array, cos_TK: jax.Array, sin_TK: jax.Array) -> jax.Array:
  half = x_BTHK.shape[-1] // 2
  x1, x2 = x_BTHK[..., :half], x_BTHK[..., half:]
  cos, sin = cos_TK[None, :, None, :].astype(x_BTHK.dtype), sin_TK[None, :, None, :].astype(x_BTHK.dtype)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Attention(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    self.c = c
    dtype = jnp.dtype(c.dtype)
    self.qkv = Dense(c.d_model, (c.n_heads + 2 * c.kv_heads) * c.head_dim, dtype=dtype,
                     kernel_init=draws.normal(0.02), rngs=rngs)
    self.out = Dense(c.d_model, c.d_model, dtype=dtype, kernel_init=draws.normal(_out_std(c)), rngs=rngs)

  def __call__(self, x_BTD: jax.Array, rope: tuple[jax.Array, jax.Array] | None,
               same_doc_BTS: jax.Array | None = None, layer: kvcache.Layer | None = None,
               pos=None) -> tuple[jax.Array, kvcache.Layer | None]:
    """The output; with a cache `layer` (x at window positions pos..), that with x's keys and values."""
    B, T, D = x_BTD.shape
    c = self.c
    H, G, K = c.n_heads, c.kv_heads, c.head_dim
    q_BTHK, k_BTGK, v_BTGK = qkv_heads(self.qkv(x_BTD), H, G, K)
    if c.qk_norm:
      q_BTHK, k_BTGK = rms_heads(q_BTHK), rms_heads(k_BTGK)
    if rope is not None:
      q_BTHK, k_BTGK = apply_rope(q_BTHK, *rope), apply_rope(k_BTGK, *rope)
    if layer is not None:  # the cached positions' keys and values too; no document mask
      y_BTHK, layer = kvcache.attend(q_BTHK, k_BTGK, v_BTGK, layer, pos)
    elif c.attention == "cudnn":  # takes G < H as it is
      mask = None if same_doc_BTS is None else same_doc_BTS[:, None]
      y_BTHK = jax.nn.dot_product_attention(q_BTHK, k_BTGK, v_BTGK, mask=mask, is_causal=True,
                                            implementation="cudnn")
    else:  # heads first: each head's attention is then a batch of plain matmuls
      heads = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # BTHK <-> BHTK
      k_BTHK, v_BTHK = (jnp.repeat(x, H // G, axis=2) for x in (k_BTGK, v_BTGK))
      qkv = heads(q_BTHK), heads(k_BTHK), heads(v_BTHK)
      y_BTHK = heads(ops.causal_attention(*qkv) if same_doc_BTS is None else
                     ops.document_attention(*qkv, same_doc_BTS))
    return self.out(y_BTHK.reshape(B, T, D)), layer


def qkv_heads(qkv_BTN: jax.Array, H: int, G: int, K: int) -> tuple[jax.Array, ...]:
  """Queries [B, T, H, K], keys and values [B, T, G, K] from the fused projection's output."""
  B, T, _ = qkv_BTN.shape
  q, k, v = jnp.split(qkv_BTN, [H * K, (H + G) * K], axis=-1)
  return q.reshape(B, T, H, K), k.reshape(B, T, G, K), v.reshape(B, T, G, K)


def rms_heads(x: jax.Array) -> jax.Array:
  """QK-norm: each head's query or key scaled to unit RMS (no weights), so that attention logits
  cannot grow without bound."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def _out_std(c: ModelConfig) -> float:
  """Projections back into the residual stream: zero (each block starts as the identity) or
  scaled down, since 2 residual branches per layer add up."""
  return 0.0 if c.zero_init_out else 0.02 / math.sqrt(2 * c.n_layers)


class MLP(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    self.kind = c.mlp
    dtype = jnp.dtype(c.dtype)
    F = c.mlp_hidden
    # SwiGLU's gate and up projections are one matrix: one matmul instead of two.
    self.up = Dense(c.d_model, 2 * F if self.kind == "swiglu" else F, dtype=dtype,
                    kernel_init=draws.normal(0.02), rngs=rngs)
    self.down = Dense(F, c.d_model, dtype=dtype, kernel_init=draws.normal(_out_std(c)), rngs=rngs)

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


def causal_conv(x_BTD: jax.Array, w_KD: jax.Array, same_doc_BTS: jax.Array | None = None):
  """x plus a short causal depthwise convolution of it: position t adds w[i] * x[t - i] for
  i < K (zeros before the window, and before its document's start where documents are given)."""
  K, T = w_KD.shape[0], x_BTD.shape[1]
  padded_BTD = jnp.pad(x_BTD, ((0, 0), (K - 1, 0), (0, 0)))  # one pad, K slices: fastest on CPU
  y_BTD = x_BTD
  for i in range(K):
    shifted_BTD = padded_BTD[:, K - 1 - i:K - 1 - i + T]
    if same_doc_BTS is not None and i > 0:  # t and t - i in one document
      same_BT = jnp.pad(jnp.diagonal(same_doc_BTS, -i, 1, 2), ((0, 0), (i, 0)))
      shifted_BTD = jnp.where(same_BT[..., None], shifted_BTD, 0)
    y_BTD = y_BTD + shifted_BTD * w_KD[i].astype(x_BTD.dtype)
  return y_BTD


class Block(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    self.dropout = c.dropout
    self.norm1 = _norm(c, rngs)
    self.attn = Attention(c, rngs)
    self.norm2 = _norm(c, rngs)
    self.mlp = MLP(c, rngs)
    self.canon = c.canon
    if c.canon:  # zero: each convolution starts as the identity
      self.conv_attn = nnx.Param(jnp.zeros((c.canon, c.d_model), jnp.float32))
      self.conv_mlp = nnx.Param(jnp.zeros((c.canon, c.d_model), jnp.float32))

  def __call__(self, x_BTD, rope, key: jax.Array | None, same_doc_BTS: jax.Array | None = None,
               layer: kvcache.Layer | None = None, pos=None):
    """The block's output, and with a cache `layer` (x at window positions pos..), the layer with
    x's keys, values and convolution inputs written in."""
    k1, k2 = jax.random.split(key) if key is not None else (None, None)
    inputs = [None, None] if layer is None else [layer.attn_in_BSD, layer.mlp_in_BSD]
    a_BTD = self.norm1(x_BTD)
    if self.canon:
      a_BTD, inputs[0] = _conv(a_BTD, self.conv_attn[...], same_doc_BTS, inputs[0], pos)
    y_BTD, layer = self.attn(a_BTD, rope, same_doc_BTS, layer, pos)
    x_BTD = x_BTD + _dropout(y_BTD, self.dropout, k1)
    m_BTD = self.norm2(x_BTD)
    if self.canon:
      m_BTD, inputs[1] = _conv(m_BTD, self.conv_mlp[...], same_doc_BTS, inputs[1], pos)
    layer = None if layer is None else layer._replace(attn_in_BSD=inputs[0], mlp_in_BSD=inputs[1])
    return x_BTD + _dropout(self.mlp(m_BTD), self.dropout, k2), layer


def _conv(x_BTD, w_KD, same_doc_BTS, cache_BSD: jax.Array | None, pos):
  """`causal_conv` of x, and the cached inputs with x written in (None without a cache)."""
  if cache_BSD is None:
    return causal_conv(x_BTD, w_KD, same_doc_BTS), None
  span_BTD, cache_BSD = kvcache.conv_span(x_BTD, cache_BSD, w_KD.shape[0], pos)
  return causal_conv(span_BTD, w_KD)[:, w_KD.shape[0] - 1:], cache_BSD


class GPT(nnx.Module):
  """`GPT(model_config)`: the model, its params drawn from `rngs` (an `nnx.Rngs`, or a seed: 0).
  A ModelConfig the config check refuses is its ConfigError, one line naming the field."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs | int = 0):
    if not isinstance(c, ModelConfig):
      raise UserError(f"GPT takes a ModelConfig, not {type(c).__name__}: e.g. GPT(ModelConfig("
                      "n_layers=2, d_model=64)), or jt.model_config(cfg) of a run's config")
    validate.model_fields(dataclasses.asdict(c))
    rngs = nnx.Rngs(rngs) if isinstance(rngs, int) else rngs
    self.c = c
    dtype = jnp.dtype(c.dtype)
    grad = "scan" if c.scatter_free else "scatter"
    self.wte = Embed(c.vocab_size, c.d_model, dtype=dtype, grad=grad,
                     embedding_init=draws.normal(0.02), rngs=rngs)
    if c.pos == "learned":
      self.wpe = nnx.Param(draws.normal(0.01)(rngs.params(), (c.seq_len, c.d_model), jnp.float32))
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.n_layers)])
    if c.x0_mix:
      self.x0_scale = nnx.Param(jnp.zeros((c.n_layers,), jnp.float32))
    self.norm_f = _norm(c, rngs)
    if not c.tie_embeddings:
      self.lm_head = Dense(c.d_model, c.vocab_size, dtype=dtype, kernel_init=draws.normal(0.02), rngs=rngs)

  def __call__(self, tokens_BT: jax.Array, *, dropout_key: jax.Array | None = None,
               cache: kvcache.Cache | None = None, pos=None) -> jax.Array | tuple[jax.Array, kvcache.Cache]:
    """float32 logits for the next token at every position; with a `cache`, and the cache (`hidden`)."""
    if cache is None:
      return self.head(self.hidden(tokens_BT, dropout_key=dropout_key), self.head_weight())
    x_BTD, cache = self.hidden(tokens_BT, cache=cache, pos=pos)
    return self.head(x_BTD, self.head_weight()), cache

  def hidden(self, tokens_BT: jax.Array, *, dropout_key: jax.Array | None = None,
             cache: kvcache.Cache | None = None, pos=None) -> jax.Array | tuple[jax.Array, kvcache.Cache]:
    """The final norm's output at every position of `tokens_BT`, a whole sequence from position 0.
    With a `cache` (kvcache.empty's, or one this returned), the tokens sit at window positions
    pos.. (an int, traced or not) after the cached ones, which they see: (the output, the cache
    with their keys and values written in). No document mask then: that is generation."""
    c = self.c
    T = tokens_BT.shape[1]
    x_BTD = self.wte(tokens_BT)
    rope = None
    if c.pos == "learned":
      wpe_TD = self.wpe[:T] if cache is None else jax.lax.dynamic_slice_in_dim(self.wpe[...], pos, T)
      x_BTD = x_BTD + wpe_TD.astype(x_BTD.dtype)
    else:
      tables = rope_tables(T if cache is None else c.seq_len, c.head_dim, c.rope_theta)
      rope = tables if cache is None else tuple(jax.lax.dynamic_slice_in_dim(x, pos, T) for x in tables)
    keys = [None] * (c.n_layers + 1)
    if dropout_key is not None and c.dropout > 0:
      keys = list(jax.random.split(dropout_key, c.n_layers + 1))
    x_BTD = _dropout(x_BTD, c.dropout, keys[0])
    same_doc_BTS = same_document(tokens_BT, c.eot_id) if c.doc_mask and cache is None else None
    call = _block_call(c.remat if cache is None else "none")
    layers = [None] * c.n_layers if cache is None else list(cache)
    x0_BTD = x_BTD
    for i, (block, key) in enumerate(zip(self.blocks, keys[1:])):
      if c.x0_mix and i > 0:
        x_BTD = x_BTD + self.x0_scale[i].astype(x_BTD.dtype) * x0_BTD
      x_BTD, layers[i] = call(block, x_BTD, rope, key, same_doc_BTS, layers[i], pos)
    return self.norm_f(x_BTD) if cache is None else (self.norm_f(x_BTD), layers)

  def head_weight(self) -> jax.Array:
    """The output projection as a float32 [D, V] matrix (a tied embedding, transposed once)."""
    if self.c.tie_embeddings:
      return ops.transposed(self.wte.embedding[...])
    return self.lm_head.kernel[...]

  def head(self, x_BTD: jax.Array, w_DV: jax.Array) -> jax.Array:
    """float32 logits of `x` through `w_DV`: inputs in the compute dtype, products summed into
    float32 (never rounded to the compute dtype first)."""
    dtype = jnp.dtype(self.c.dtype)
    return ops.dense_f32(x_BTD.astype(dtype), w_DV.astype(dtype))


# What a block keeps for the backward pass: all; its matmul outputs; its input (all recomputed).
REMAT = {"none": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
         "full": jax.checkpoint_policies.nothing_saveable}


def _block_call(remat: str):
  """`call(block, *args)`: the block's output, recomputed in the backward pass as `remat` says
  (the block goes in as its state, so a model built outside the trace works too)."""
  if REMAT[remat] is None:
    return lambda block, *args: block(*args)

  def call(block: Block, *args):
    graphdef, state = nnx.split(block)
    run = lambda state, *args: nnx.merge(graphdef, state)(*args)
    return jax.checkpoint(run, policy=REMAT[remat])(state, *args)
  return call


def same_document(tokens_BT: jax.Array, eot_id: int) -> jax.Array:
  """bool[B, T, T]: whether positions t and s hold tokens of one document. A document's
  end-of-text token is its last; the next token starts another."""
  is_eot_BT = (tokens_BT == eot_id).astype(jnp.int32)
  doc_BT = jnp.cumsum(is_eot_BT, axis=1) - is_eot_BT
  return doc_BT[:, :, None] == doc_BT[:, None, :]


def init(c: ModelConfig, key: jax.Array, exact_shapes: bool = False) -> GPT:
  """`GPT(c, nnx.Rngs(params=key))`, with the same values, but cheaper to compile (`draws`)."""
  return draws.batched(lambda rngs: GPT(c, rngs), key, exact_shapes)


def param_count(c: ModelConfig) -> int:
  """All parameters, counted from abstract shapes (nothing is allocated)."""
  abstract = nnx.eval_shape(lambda: GPT(c, nnx.Rngs(0)))
  return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
