"""Decoder-only, pre-norm transformer in flax NNX, with no biases anywhere; its switches are
`ModelConfig`'s fields, its parts the components they name (core/layers.py, core/blocks.py: a
user's own too, core/registry.py). Linear layers, attention and embeddings use `ops`' backward
passes (on GPUs with 16-bit compute, attention can be cuDNN's fused kernel); blocks can be
rematerialized (REMAT). One forward pass serves training and generation: given a key-value cache
(`kvcache`), the same layers run new tokens after the cached ones and write theirs into it.
`build` makes the model model.arch names: `GPT`, or a user's whole model.
Shape suffixes: B batch, T time, D d_model, H heads, G key/value heads, K head size, F MLP width, V vocab.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from jaxtrain.config import defaults, validate
from jaxtrain.core import blocks, draws, kvcache, layers, ops, registry
from jaxtrain.core.registry import decorator as _builtin
from jaxtrain.system.errors import UserError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """The model's shape and switches, by keyword (`ModelConfig(n_layers=2, d_model=64)`); each
  field's default is config/defaults.py's for model.<field> (a byte vocabulary: 256).
  `from_config(cfg.model, vocab_size, cfg.ext)` makes one from a run's config."""
  vocab_size: int = 256
  n_layers: int = 4
  n_heads: int = 4
  d_model: int = 128
  seq_len: int = 128
  norm: str = "rmsnorm"
  pos: str = "rope"
  mlp: str = "swiglu"
  attention_variant: str = "causal"
  block: str = "prenorm"
  arch: str = "gpt"
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
  # The options of the components above that have some: ((component, ((option, value), ...)), ...)
  options: tuple = ()

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int, ext=None) -> "ModelConfig":
    """`ext`: the config's ext section, whose options of the model's components it takes."""
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model.to_dict().items() if k in fields}
    kwargs["vocab_size"] = vocab_size
    names = sorted({kwargs.get(registry.KINDS[k].field.split(".")[1], "") for k in registry.MODEL_KINDS})
    kwargs["options"] = tuple((n, o) for n in names if (o := registry.options_of(ext, n)))
    return cls(**kwargs)

  def options_of(self, component: str) -> tuple:
    return dict(self.options).get(component, ())

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def kv_heads(self) -> int:
    return self.n_kv_heads or self.n_heads

  @property
  def mlp_hidden(self) -> int:
    return defaults.mlp_width(self.mlp, self.mlp_ratio, self.d_model)


def components(c: ModelConfig) -> list[registry.Component]:
  """The components a model of `c` is made of (its model, then its parts where it is `GPT`)."""
  arch = registry.get("model", c.arch)
  kinds = ("block", "norm", "positions", "mlp", "attention") if arch.name == "gpt" else ()
  return [arch, *(registry.get(k, getattr(c, registry.KINDS[k].field.split(".")[1])) for k in kinds)]


def extensions_in(c: ModelConfig) -> list[registry.Component]:
  """The components of a model of `c` that are not jaxtrain's own."""
  return [comp for comp in components(c) if not comp.builtin]


def kv_cache(c: ModelConfig) -> list[registry.Component]:
  """The components of a model of `c` that cannot extend a key-value cache (none: it can)."""
  return [comp for comp in components(c) if not comp.kv_cache]


def matmul_param_count(c: ModelConfig) -> int:
  """Parameters that take part in a matmul: attention and MLP kernels, and the output projection
  (norm scales, position embeddings and the input embedding lookup cost no matmul FLOPs). An
  extension's parts are counted as the built-in ones of their kind would be."""
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


@_builtin("model", "gpt", {}, builtin=True, batched_init=True, kv_cache=True)
class GPT(nnx.Module):
  """`GPT(model_config)`: the model, its params drawn from `rngs` (an `nnx.Rngs`, or a seed: 0).
  A ModelConfig the config check refuses is its ConfigError, one line naming the field. Its
  parts are the components model.norm, pos, mlp, attention_variant and block name."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs | int = 0):
    if not isinstance(c, ModelConfig):
      raise UserError(f"GPT takes a ModelConfig, not {type(c).__name__}: e.g. GPT(ModelConfig("
                      "n_layers=2, d_model=64)), or jt.model_config(cfg) of a run's config")
    check(c)
    rngs = nnx.Rngs(rngs) if isinstance(rngs, int) else rngs
    self.c = c
    dtype = jnp.dtype(c.dtype)
    grad = "scan" if c.scatter_free else "scatter"
    self.wte = layers.Embed(c.vocab_size, c.d_model, dtype=dtype, grad=grad,
                            embedding_init=draws.normal(0.02), rngs=rngs)
    # The positions component where learned positions' table has always been: `wpe`.
    self.wpe = layers.make("positions", c, rngs)
    self.blocks = nnx.List([layers.make("block", c, rngs) for _ in range(c.n_layers)])
    if c.x0_mix:
      self.x0_scale = nnx.Param(jnp.zeros((c.n_layers,), jnp.float32))
    self.norm_f = layers.make("norm", c, rngs)
    if not c.tie_embeddings:
      self.lm_head = layers.Dense(c.d_model, c.vocab_size, dtype=dtype,
                                  kernel_init=draws.normal(0.02), rngs=rngs)

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
    start = 0 if cache is None else pos
    x_BTD = self.wte(tokens_BT)
    embed = getattr(self.wpe, "embed", None)
    if embed is not None:
      x_BTD = layers.expect(layers.guarded("positions", c, embed, x_BTD, start), x_BTD,
                            "positions", c, "embed returned")
    keys = [None] * (c.n_layers + 1)
    if dropout_key is not None and c.dropout > 0:
      keys = list(jax.random.split(dropout_key, c.n_layers + 1))
    x_BTD = layers.dropout(x_BTD, c.dropout, keys[0])
    same_doc_BTS = same_document(tokens_BT, c.eot_id) if c.doc_mask and cache is None else None
    call = _block_call(c.remat if cache is None else "none")
    cached = [None] * c.n_layers if cache is None else list(cache)
    x0_BTD = x_BTD
    for i, (block, key) in enumerate(zip(self.blocks, keys[1:])):
      if c.x0_mix and i > 0:
        x_BTD = x_BTD + self.x0_scale[i].astype(x_BTD.dtype) * x0_BTD
      ctx = blocks.Context(start, self.wpe, same_doc_BTS, cached[i], key)
      x_BTD = layers.expect(layers.guarded("block", c, call, block, x_BTD, ctx), x_BTD, "block", c)
      cached[i] = ctx.layer
    return self.norm_f(x_BTD) if cache is None else (self.norm_f(x_BTD), cached)

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
  """`call(block, x, ctx)`: the block's output, recomputed in the backward pass as `remat` says
  (the block goes in as its state, so a model built outside the trace works too)."""
  if REMAT[remat] is None:
    return lambda block, x_BTD, ctx: block(x_BTD, ctx)

  def call(block, x_BTD, ctx: blocks.Context):
    graphdef, state = nnx.split(block)

    def run(state, x_BTD, key, same_doc_BTS):
      return nnx.merge(graphdef, state)(x_BTD, dataclasses.replace(ctx, key=key,
                                                                   same_doc_BTS=same_doc_BTS))
    return jax.checkpoint(run, policy=REMAT[remat])(state, x_BTD, ctx.key, ctx.same_doc_BTS)
  return call


def same_document(tokens_BT: jax.Array, eot_id: int) -> jax.Array:
  """bool[B, T, T]: whether positions t and s hold tokens of one document. A document's
  end-of-text token is its last; the next token starts another."""
  is_eot_BT = (tokens_BT == eot_id).astype(jnp.int32)
  doc_BT = jnp.cumsum(is_eot_BT, axis=1) - is_eot_BT
  return doc_BT[:, :, None] == doc_BT[:, None, :]


def check(c: ModelConfig) -> None:
  """`c`'s fields through the config's checks, and its components' own (`check`); a ConfigError."""
  cfg = validate.model_fields({k: v for k, v in dataclasses.asdict(c).items() if k != "options"})
  with cfg.unlocked():
    cfg.ext = ml_collections.ConfigDict({name: dict(options) for name, options in c.options})
  for component in components(c):
    if component.check is not None:
      registry.call_check(component, cfg)


def build(c: ModelConfig, rngs: nnx.Rngs):
  """The model model.arch names for `c`, its params drawn from `rngs`."""
  if c.arch == "gpt":
    return layers.make("model", c, rngs)
  check(c)
  model = layers.make("model", c, rngs)
  if not hasattr(model, "c"):  # generation reads the model's config (its seq_len) from it
    model.c = c
  return model


def init(c: ModelConfig, key: jax.Array, exact_shapes: bool = False):
  """`build(c, nnx.Rngs(params=key))`; where every part is jaxtrain's, with the same values but
  cheaper to compile (`draws`)."""
  if all(comp.batched_init for comp in components(c)):
    return draws.batched(lambda rngs: build(c, rngs), key, exact_shapes)
  return build(c, nnx.Rngs(params=key))


@functools.lru_cache(maxsize=64)
def param_count(c: ModelConfig) -> int:
  """All parameters, counted from abstract shapes (nothing is allocated)."""
  abstract = nnx.eval_shape(lambda: build(c, nnx.Rngs(0)))
  return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
