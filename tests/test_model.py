"""The model: causality under every switch, parameter count and FLOPs by hand."""

import dataclasses
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain.core import blocks, draws, programs
from jaxtrain.core import model as model_lib
from jaxtrain.testing import tiny_config

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too


def tiny_model_config(**kw) -> model_lib.ModelConfig:
  base = dict(vocab_size=64, n_layers=2, n_heads=2, d_model=16, seq_len=12)
  return model_lib.ModelConfig(**{**base, **kw})


SWITCHES = list(itertools.product(["rmsnorm", "layernorm"], ["rope", "learned"], ["swiglu", "gelu"],
                                  [True, False]))


def _assert_causal(model: model_lib.GPT, c: model_lib.ModelConfig, t: int = 7):
  """Changing token t leaves the logits before t as they were and changes those from t on;
  returns the tokens and their logits."""
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, c.seq_len), 0, c.vocab_size)
  changed = tokens.at[:, t].set((tokens[:, t] + 1) % c.vocab_size)
  a, b = model(tokens), model(changed)
  np.testing.assert_array_equal(np.asarray(a[:, :t]), np.asarray(b[:, :t]))
  assert not np.allclose(np.asarray(a[:, t:]), np.asarray(b[:, t:]))
  return tokens, a


@pytest.mark.parametrize("norm,pos,mlp,tie", SWITCHES)
def test_changing_token_t_leaves_earlier_logits_unchanged(norm, pos, mlp, tie):
  c = tiny_model_config(norm=norm, pos=pos, mlp=mlp, tie_embeddings=tie)
  _, a = _assert_causal(model_lib.GPT(c, nnx.Rngs(0)), c)
  assert a.shape == (2, c.seq_len, c.vocab_size) and a.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("norm,pos,mlp,tie,partitionable,exact", [
    ("rmsnorm", "rope", "swiglu", True, True, False),
    ("layernorm", "learned", "gelu", False, True, False),
    ("rmsnorm", "learned", "swiglu", False, False, False),
    ("layernorm", "rope", "gelu", True, True, True)])
def test_init_gives_the_same_params_as_building_the_model_with_rngs(norm, pos, mlp, tie,
                                                                    partitionable, exact):
  # model.init batches the normal draws, padded to a group's largest, which only partitionable
  # threefry (jax's default) allows, or by exact shape (FSDP); the values must not change.
  with jax.threefry_partitionable(partitionable):
    _check_init_is_exact(tiny_model_config(norm=norm, pos=pos, mlp=mlp, tie_embeddings=tie,
                                           n_layers=3), exact)


def test_init_draw_groups_bound_the_padding():
  spec = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype)
  sizes = lambda *ns: [spec((n,)) for n in ns]
  assert draws.draw_groups(sizes(5, 100, 4, 90)) == [[1, 3, 0], [2]]  # 300 values for 195
  # However big the draws, the values thrown away stay under the cap (here 1.5x it).
  cap = draws.MAX_PADDING
  assert draws.draw_groups(sizes(4 * cap, 5 * cap // 2)) == [[0], [1]]
  assert draws.draw_groups(sizes(4 * cap, 3 * cap)) == [[0, 1]]
  # Without padding, equal sizes of another shape or dtype do not split a shape's group.
  mixed = [spec((4, 8)), spec((8, 4)), spec((4, 8), jnp.bfloat16), spec((4, 8)), spec((8, 4))]
  assert sorted(map(sorted, draws.draw_groups(mixed, pad=False))) == [[0, 3], [1, 4], [2]]


def _check_init_is_exact(c: model_lib.ModelConfig, exact_shapes: bool):
  key = jax.random.PRNGKey(5)
  params = lambda model: nnx.to_pure_dict(nnx.state(model, nnx.Param))
  build = lambda: params(model_lib.GPT(c, nnx.Rngs(params=key)))
  batched = lambda: params(model_lib.init(c, key, exact_shapes))
  # Eager and jitted draws may differ in the last bit (XLA fuses the scaling): compare like
  # with like.
  for drawn, reference in ((batched(), build()), (jax.jit(batched)(), jax.jit(build)())):
    assert jax.tree.structure(drawn) == jax.tree.structure(reference)
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(reference)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert draws.BATCHING.draws is None  # a model built afterwards draws at once again


def test_param_count_matches_the_arrays_and_hand_count():
  c = tiny_model_config(mlp="gelu", pos="learned", tie_embeddings=False)
  model = model_lib.GPT(c, nnx.Rngs(0))
  actual = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  D, V, T, L, F = 16, 64, 12, 2, 64
  per_layer = 3 * D * D + D * D + D * F + F * D + 2 * D  # qkv, out, up, down, two norm scales
  by_hand = V * D + T * D + L * per_layer + D + D * V  # wte, wpe, blocks, final norm, lm_head
  assert actual == by_hand == model_lib.param_count(c)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"model.mlp": "gelu", "model.pos": "learned",
                                            "model.tie_embeddings": False},
                                       {"model.d_model": 64, "model.seq_len": 64},
                                       {"model.x0_mix": True, "model.canon": 4}])
def test_flops_agree_with_xlas_cost_analysis(overrides):
  """Our matmul FLOPs against XLA's count of the compiled programs, which also counts the
  elementwise work (norms, softmax, AdamW): a few percent more, never less."""
  cfg = tiny_config(**overrides)
  p = programs.build(cfg, 256, jax.devices()[:1])
  B, T = cfg.train.batch_size, cfg.model.seq_len
  graphdef, params = nnx.split(p.init().model())
  forward = jax.jit(lambda params, tokens: nnx.merge(graphdef, params)(tokens))
  xla_forward = forward.lower(params, jnp.zeros((B, T), jnp.int32)).compile().cost_analysis()
  ours = model_lib.flops_per_token(p.model_cfg, training=False) * B * T
  assert 1.0 <= xla_forward["flops"] / ours < 1.12, (xla_forward["flops"], ours)
  xla_step = p.compile_train().cost_analysis()["flops"]
  ours = model_lib.flops_per_step(p.model_cfg, B)
  assert 1.0 <= xla_step / ours < 1.12, (xla_step, ours)


def test_swiglu_width_keeps_the_mlp_parameter_count_close_to_gelu():
  g, s = tiny_model_config(mlp="gelu", d_model=96), tiny_model_config(mlp="swiglu", d_model=96)
  gelu_mlp, swiglu_mlp = 2 * 96 * g.mlp_hidden, 3 * 96 * s.mlp_hidden
  assert s.mlp_hidden % 8 == 0
  assert abs(swiglu_mlp - gelu_mlp) / gelu_mlp < 0.05


@pytest.mark.slow
def test_dropout_needs_a_key_and_changes_the_output():
  c = tiny_model_config(dropout=0.5)
  model = model_lib.GPT(c, nnx.Rngs(0))
  tokens = jnp.zeros((1, c.seq_len), jnp.int32)
  np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(model(tokens)))
  assert not np.allclose(model(tokens), model(tokens, dropout_key=jax.random.PRNGKey(0)))


NEW_SWITCHES = [{"n_kv_heads": 1}, {"qk_norm": True}, {"mlp": "relu2"}, {"zero_init_out": True},
                {"n_kv_heads": 1, "qk_norm": True, "mlp": "relu2", "tie_embeddings": False,
                 "pos": "learned"}]


@pytest.mark.parametrize("switches", NEW_SWITCHES, ids=lambda s: ",".join(s))
def test_new_switches_keep_the_model_causal(switches):
  c = tiny_model_config(n_heads=4, **switches)
  _assert_causal(model_lib.GPT(c, nnx.Rngs(0)), c)


def test_switches_change_what_they_should():
  base = tiny_model_config(n_heads=4)
  gqa = tiny_model_config(n_heads=4, n_kv_heads=2)
  params = lambda c: nnx.to_pure_dict(nnx.state(model_lib.GPT(c, nnx.Rngs(0)), nnx.Param))
  assert params(gqa)["blocks"][0]["attn"]["qkv"]["kernel"].shape == (16, (4 + 2 * 2) * 4)
  assert model_lib.param_count(gqa) == model_lib.param_count(base) - 2 * 2 * 16 * 8
  zero = params(tiny_model_config(zero_init_out=True))["blocks"][1]
  assert not np.any(zero["attn"]["out"]["kernel"]) and not np.any(zero["mlp"]["down"]["kernel"])
  assert np.any(zero["attn"]["qkv"]["kernel"])
  relu2 = tiny_model_config(mlp="relu2", mlp_ratio=4.0)
  assert relu2.mlp_hidden == 64
  # With one key/value head repeated, GQA is ordinary attention whose heads share k and v.
  qkv = jax.random.normal(jax.random.PRNGKey(0), (1, 5, (4 + 2) * 4))
  q, k, v = blocks.qkv_heads(qkv, 4, 1, 4)
  assert q.shape == (1, 5, 4, 4) and k.shape == v.shape == (1, 5, 1, 4)


@pytest.mark.slow
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_gradients_with_every_new_switch_match_autodiff(pos, monkeypatch):
  """ops.py's hand-written backward passes, composed with GQA's repeat, QK-norm and ReLU^2,
  against autodiff of the same forward functions (each custom_vjp's `fun`)."""
  from jaxtrain.core import ops, steps
  c = tiny_model_config(n_heads=4, n_kv_heads=2, qk_norm=True, mlp="relu2", pos=pos,
                        tie_embeddings=False)
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(2)), nnx.Param)
  params = jax.tree.map(lambda p: p * 5, nnx.to_pure_dict(params))  # past init's small values
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, c.seq_len + 1), 0, c.vocab_size)
  grad = lambda: jax.grad(steps.loss_fn)(params, graphdef, tokens)
  ours = grad()
  monkeypatch.setattr(ops, "dense", ops.dense.fun)
  monkeypatch.setattr(ops, "dense_f32", ops.dense_f32.fun)
  monkeypatch.setattr(ops, "causal_attention", ops.causal_attention.fun)
  monkeypatch.setattr(ops, "embed", ops.embed.fun)
  reference = grad()
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(reference)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ours)) > 1e-2  # not all ~0


def _loss_and_grads(c: model_lib.ModelConfig, dropout: bool = False):
  from jaxtrain.core import steps
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(4)), nnx.Param)
  params = jax.tree.map(lambda p: p * 5, nnx.to_pure_dict(params))  # past init's small values
  tokens = jax.random.randint(jax.random.PRNGKey(5), (3, c.seq_len + 1), 0, c.vocab_size)
  key = jax.random.PRNGKey(6) if dropout else None
  return jax.jit(jax.value_and_grad(steps.loss_fn), static_argnums=1)(params, graphdef, tokens, key)


def _assert_same_loss_and_grads(a, b):
  np.testing.assert_allclose(float(a[0]), float(b[0]), rtol=1e-6)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a[1]), jax.tree.leaves(b[1])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(a[1])) > 1e-2  # not all ~0


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["dots", "full"])
def test_remat_gives_the_same_loss_and_gradients(remat):
  c = tiny_model_config(n_heads=4, n_kv_heads=2, qk_norm=True, dropout=0.1)
  model = model_lib.GPT(dataclasses.replace(c, remat=remat), nnx.Rngs(0))
  tokens = jnp.zeros((1, c.seq_len), jnp.int32)
  jaxpr = str(jax.make_jaxpr(lambda t: model(t))(tokens))
  assert len(re.findall(r"\b(?:remat\w*|checkpoint)\[", jaxpr)) == c.n_layers
  _assert_same_loss_and_grads(_loss_and_grads(dataclasses.replace(c, remat=remat), dropout=True),
                              _loss_and_grads(c, dropout=True))


@pytest.mark.slow
@pytest.mark.parametrize("tie,chunk", [(True, 8), (False, 5), (True, 1000)])
def test_chunked_cross_entropy_gives_the_same_loss_and_gradients(tie, chunk):
  """Chunks that divide the 3 x 12 tokens or not (the last one padded), and one chunk for all."""
  c = tiny_model_config(tie_embeddings=tie)
  _assert_same_loss_and_grads(_loss_and_grads(dataclasses.replace(c, loss_chunk=chunk)),
                              _loss_and_grads(c))


def _grad_temp_bytes(**kw) -> int:
  """XLA's temporary memory of the compiled loss and gradient of 36 x 12 tokens, vocab 4096.

  The loss and its gradient, as the train step takes them: from jax 0.12.1 on (where
  jax.nn.logsumexp's derivative is the softmax of its input) XLA writes the whole loss's gradient
  over its logits where the program returns the gradient alone, a program no run compiles."""
  from jaxtrain.core import steps
  c = tiny_model_config(vocab_size=4096, seq_len=12, **kw)
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(0)), nnx.Param)
  tokens = jnp.zeros((36, c.seq_len + 1), jnp.int32)
  grad = jax.jit(jax.value_and_grad(steps.loss_fn), static_argnums=1)
  compiled = grad.lower(nnx.to_pure_dict(params), graphdef, tokens).compile()
  return compiled.memory_analysis().temp_size_in_bytes


LOGITS_BYTES = 36 * 12 * 4096 * 4  # float32 logits of _grad_temp_bytes' batch


@pytest.mark.slow
def test_chunked_cross_entropy_never_holds_the_whole_batchs_logits():
  """The compiled train step's temporary memory: at vocab 4096 the whole logits and their
  gradient (2 x 36 x 12 x 4096 float32, 14 MB) dominate; in chunks of 48 tokens the step holds
  less than one whole copy of the logits (what else it holds differs a little by jax version)."""
  whole, chunked = _grad_temp_bytes(), _grad_temp_bytes(loss_chunk=48)
  assert whole > 2 * LOGITS_BYTES * 0.9 and chunked < 0.75 * LOGITS_BYTES, (whole, chunked)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_cross_entropy_never_holds_the_logits_and_their_gradient_at_once(dtype):
  """The fused loss writes the logits' gradient where the logits were: in float32 the step holds
  about one copy of them (the whole loss: over two); in bfloat16 it holds less than the whole
  loss does by at least a quarter of a float32 copy (XLA:CPU's bfloat16 matmuls work in float32)."""
  whole, fused = _grad_temp_bytes(dtype=dtype), _grad_temp_bytes(dtype=dtype, fused_loss=True)
  print(dtype, {"whole": whole, "fused": fused, "float32 logits": LOGITS_BYTES})
  assert fused < whole - LOGITS_BYTES / 4, (whole, fused)
  if dtype == "float32":
    assert fused < 1.5 * LOGITS_BYTES, (whole, fused)


def _losses_and_grads(c: model_lib.ModelConfig, weights=None, z_loss: float = 0.0):
  """((the loss that trains, the reported loss), gradients of the first) at params past init."""
  from jaxtrain.core import steps
  graphdef, params = nnx.split(model_lib.GPT(c, nnx.Rngs(4)), nnx.Param)
  params = jax.tree.map(lambda p: p * 5, nnx.to_pure_dict(params))
  tokens = jax.random.randint(jax.random.PRNGKey(5), (3, c.seq_len + 1), 0, c.vocab_size)
  f = lambda p: steps.losses(p, graphdef, tokens, weights_BT=weights, z_loss=z_loss)
  return jax.jit(jax.value_and_grad(f, has_aux=True))(params)


@pytest.mark.slow
@pytest.mark.parametrize("tie,z_loss,weighted", [(True, 0.0, False), (False, 1e-2, True),
                                                 (True, 1e-2, False)])
def test_fused_cross_entropy_gives_the_whole_and_the_chunked_loss_and_gradients(tie, z_loss, weighted):
  """float32: the same losses (the one that trains, with the z-loss, and the one reported) and
  gradients as the whole and the chunked loss, up to float rounding; with a prompt mask too."""
  c = tiny_model_config(tie_embeddings=tie)
  weights = (jax.random.uniform(jax.random.PRNGKey(7), (3, c.seq_len)) > 0.3) if weighted else None
  fused = _losses_and_grads(dataclasses.replace(c, fused_loss=True), weights, z_loss)
  for other in (c, dataclasses.replace(c, loss_chunk=5)):
    ref = _losses_and_grads(other, weights, z_loss)
    np.testing.assert_allclose([float(x) for x in fused[0]], [float(x) for x in ref[0]], rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(fused[1]), jax.tree.leaves(ref[1])):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(b))),
                                 err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_fused_cross_entropy_in_bfloat16_is_the_whole_loss_to_bfloat16s_precision():
  """bfloat16 compute: the fused loss's logits are bfloat16 (the whole loss's float32), so the
  two agree to bfloat16's precision: the losses to 1e-3, each gradient to 3% of its norm."""
  c = tiny_model_config(dtype="bfloat16", tie_embeddings=False)
  (fused, _), fused_grads = _losses_and_grads(dataclasses.replace(c, fused_loss=True), z_loss=1e-2)
  (whole, _), whole_grads = _losses_and_grads(c, z_loss=1e-2)
  np.testing.assert_allclose(float(fused), float(whole), rtol=1e-3)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(fused_grads), jax.tree.leaves(whole_grads)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.linalg.norm(a - b) < 0.03 * np.linalg.norm(b), jax.tree_util.keystr(path)


def test_the_fused_cross_entropys_gradient_has_no_scatter():
  from jaxtrain.core import loss
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 8))
  w = jax.random.normal(jax.random.PRNGKey(1), (8, 301))
  targets = jax.random.randint(jax.random.PRNGKey(2), (2, 5), 0, 301)
  grad = jax.jit(jax.grad(lambda x, w: loss.fused_token_losses(x, w, targets, 1e-3)[0].sum(), (0, 1)))
  assert "scatter" not in grad.lower(x, w).as_text()


@pytest.mark.parametrize("scatter_free", [False, True])
def test_cross_entropy_equals_optaxs_in_value_and_gradient(scatter_free):
  """Bit for bit, scatter-free without its gather: logits far apart too (the label's is not the
  largest)."""
  import optax

  from jaxtrain.core import loss
  logits = 8 * jax.random.normal(jax.random.PRNGKey(0), (3, 7, 301))
  targets = jax.random.randint(jax.random.PRNGKey(1), (3, 7), 0, 301)
  weights = jax.random.normal(jax.random.PRNGKey(2), (3, 7))
  ours, ref = (jax.jit(jax.value_and_grad(lambda x, f=f: jnp.sum(f(x, targets) * weights)))(logits)
               for f in (lambda x, t: loss.token_losses(x, t, scatter_free),
                         optax.softmax_cross_entropy_with_integer_labels))
  np.testing.assert_array_equal(ours[0], ref[0])
  np.testing.assert_array_equal(ours[1], ref[1])
  grad = jax.jit(jax.grad(lambda x: loss.token_losses(x, targets, scatter_free).sum()))
  text = grad.lower(logits).as_text()
  assert ("scatter" in text) != scatter_free and not (scatter_free and "gather" in text)


@pytest.mark.slow
def test_weighted_cross_entropy_is_the_mean_over_weighted_tokens():
  from jaxtrain.core import loss
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5))
  targets = jnp.array([[0, 1, 2], [3, 4, 0]])
  per_token = loss.token_losses(logits, targets)
  weights = jnp.array([[0, 1, 1], [0, 0, 1]])
  np.testing.assert_allclose(float(loss.mean_loss(per_token, weights)),
                             float(per_token[weights == 1].mean()), rtol=1e-6)
  assert float(loss.mean_loss(per_token, jnp.zeros_like(weights))) == 0.0


def _perturbed(c: model_lib.ModelConfig, seed: int = 0) -> model_lib.GPT:
  """A model whose zero-initialised switches (convolutions, x0 scales) are non-zero, as after some
  training."""
  model = model_lib.GPT(c, nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)
  keys = iter(jax.random.split(jax.random.PRNGKey(seed + 1), len(jax.tree.leaves(params))))
  params = jax.tree.map(lambda p: p + 0.3 * jax.random.normal(next(keys), p.shape), params)
  return nnx.merge(graphdef, params)


ARCH_SWITCHES = [{"x0_mix": True}, {"canon": 4}, {"x0_mix": True, "canon": 3, "n_kv_heads": 2}]


@pytest.mark.slow
@pytest.mark.parametrize("switches", ARCH_SWITCHES, ids=lambda s: ",".join(s))
def test_x0_and_convolutions_keep_the_model_causal(switches):
  c = tiny_model_config(n_heads=4, n_layers=3, **switches)
  base = _perturbed(tiny_model_config(n_heads=4, n_layers=3), 0)
  tokens, a = _assert_causal(_perturbed(c, 0), c)
  assert not np.allclose(np.asarray(a), np.asarray(base(tokens)), atol=1e-3)  # the switch acts


def test_switches_start_as_the_plain_model():
  """Zero convolutions and x0 scales: the same logits as without them."""
  c = tiny_model_config(n_heads=4, n_layers=3)
  with_all = dataclasses.replace(c, x0_mix=True, canon=4)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, c.seq_len), 0, c.vocab_size)
  plain = model_lib.init(c, jax.random.PRNGKey(0))
  switched = model_lib.init(with_all, jax.random.PRNGKey(0))
  np.testing.assert_allclose(np.asarray(switched(tokens)), np.asarray(plain(tokens)), atol=1e-6)
  extra = model_lib.param_count(with_all) - model_lib.param_count(c)
  assert extra == 3 * 2 * 4 * c.d_model + 3


@pytest.mark.slow
def test_convolutions_stop_at_a_documents_start():
  x_BTD = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 2))
  w_KD = jnp.ones((3, 2))
  tokens_BT = jnp.array([[5, 5, 9, 5, 5, 5]])  # 9 ends the first document
  same = model_lib.same_document(tokens_BT, 9)
  y = np.asarray(blocks.causal_conv(x_BTD, w_KD, same))
  x = np.asarray(x_BTD)
  np.testing.assert_allclose(y[0, 2], 2 * x[0, 2] + x[0, 1] + x[0, 0], rtol=1e-6)
  np.testing.assert_allclose(y[0, 3], 2 * x[0, 3], rtol=1e-6)  # the first token of document two
  np.testing.assert_allclose(y[0, 4], 2 * x[0, 4] + x[0, 3], rtol=1e-6)
  np.testing.assert_allclose(y[0, 5], 2 * x[0, 5] + x[0, 4] + x[0, 3], rtol=1e-6)
  whole = np.asarray(blocks.causal_conv(x_BTD, w_KD))
  np.testing.assert_allclose(whole[0, 3], 2 * x[0, 3] + x[0, 2] + x[0, 1], rtol=1e-6)
