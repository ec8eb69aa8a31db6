"""Generation with the key-value cache: the same tokens as the whole window every step, for every
model switch and past the context window; top-k/top-p; chunked streaming; prompt lengths padded to
a few buckets (a handful of programs, the same tokens)."""

import jax
import numpy as np
import pytest
from flax import nnx

import jaxtrain as jt
from jaxtrain.core import kvcache
from jaxtrain.generation import decode
from jaxtrain.testing import init, tiny_config

SWITCHES = {
    "rope-rmsnorm-swiglu-tied": {},
    "learned-layernorm-gelu": {"model.pos": "learned", "model.norm": "layernorm",
                               "model.mlp": "gelu"},
    "rope-layernorm-gelu-untied": {"model.norm": "layernorm", "model.mlp": "gelu",
                                   "model.tie_embeddings": False},
    "learned-rmsnorm-swiglu-untied": {"model.pos": "learned", "model.tie_embeddings": False},
    "gqa-qknorm-relu2": {"model.n_kv_heads": 2, "model.qk_norm": True, "model.mlp": "relu2"},
    "x0-canon-gqa": {"model.x0_mix": True, "model.canon": 3, "model.n_kv_heads": 2,
                     "model.n_layers": 3},
}


def _lively(state, seed: int = 0):
  """The state with noise added to its params: a fresh init repeats one token greedily, which
  would make any two generators agree."""
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(x.dtype),
                        jax.device_get(state.params))
  return state.replace(params=params)


# The default model in the fast tier, every other switch in the slow one.
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if i else [])
                                  for i, name in enumerate(SWITCHES)])
def test_cached_greedy_tokens_equal_uncached(name):
  cfg = tiny_config(**{"model.seq_len": 16, **SWITCHES[name]})
  state = _lively(init(cfg))
  rng = np.random.default_rng(1)
  # Prompts shorter than the window and longer; 30 new tokens pass the 16-token window several
  # times, so restarts of the window are covered.
  for P in (5, 21):
    prompts = rng.integers(0, 256, (2, P)).astype(np.int32)
    cached = jt.generate(state, prompts, 30, temperature=0.0)
    plain = jt.generate(state, prompts, 30, temperature=0.0, use_cache=False)
    assert cached.shape == (2, P + 30) and np.array_equal(cached[:, :P], prompts)
    assert len(np.unique(cached[:, P:])) > 5, "a degenerate model proves nothing"
    np.testing.assert_array_equal(cached, plain)


@pytest.mark.slow
@pytest.mark.parametrize("switches", [{}, {"model.n_kv_heads": 1, "model.qk_norm": True},
                                      {"model.x0_mix": True, "model.canon": 4}])
def test_cached_logits_match_the_model_forward(switches):
  state = _lively(init(tiny_config(**switches)))
  tokens = np.random.default_rng(2).integers(0, 256, (2, 20)).astype(np.int32)
  model = state.model()
  whole = np.asarray(model(tokens))
  # A prefill of 16 tokens, then one token at a time: the same forward pass, extending a cache.
  forward = nnx.jit(lambda model, tokens, cache, pos: model(tokens, cache=cache, pos=pos))
  logits, cache = forward(model, tokens[:, :16], kvcache.empty(state.model_cfg, 2), 0)
  steps = [np.asarray(logits)]
  for t in range(16, 20):
    logits, cache = forward(model, tokens[:, t:t + 1], cache, t)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, atol=2e-5)


def test_window_restarts_from_its_last_half():
  T, keep = 8, decode.keep_length(8)
  starts = [decode.window_start(n, T, keep) for n in range(1, 20)]
  assert starts[:8] == [0] * 8  # up to a full window
  assert starts[8] == 9 - keep  # token 9 restarts the window from the last `keep` tokens
  for n, start in zip(range(1, 20), starts):
    assert keep <= n - start <= T or n < keep
  traced = [int(decode.window_start(np.int32(n), T, keep)) for n in range(1, 20)]
  assert traced == starts


@pytest.mark.slow
def test_sampling_is_seeded_chunking_changes_nothing_and_filters_cut():
  cfg = tiny_config()
  state = _lively(init(cfg))
  prompts = np.full((3, 4), 65, np.int32)
  kwargs = dict(temperature=1.0, top_k=20, top_p=0.9, seed=5)
  whole = decode.generate(state, prompts, 30, **kwargs)
  chunks = list(decode.stream(state, prompts, 30, chunk=7, **kwargs))
  assert [x.shape[1] for x in chunks] == [7, 7, 7, 7, 2]
  np.testing.assert_array_equal(np.concatenate([prompts, *chunks], axis=1), whole)
  other = decode.generate(state, prompts, 30, **{**kwargs, "seed": 6})
  assert not np.array_equal(whole, other)
  # A tiny top_p keeps only the likeliest token: greedy.
  greedy = decode.generate(state, prompts, 12, temperature=0.0)
  sampled = decode.generate(state, prompts, 12, temperature=1.0, top_p=1e-6)
  np.testing.assert_array_equal(sampled, greedy)


def test_pick_top_p_keeps_the_smallest_set_reaching_p():
  logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
  draws = {int(decode.pick(logits, jax.random.PRNGKey(i), 1.0, 0, 0.7)[0]) for i in range(200)}
  assert draws == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
  draws = {int(decode.pick(logits, jax.random.PRNGKey(i), 1.0, 0, 0.81)[0]) for i in range(200)}
  assert draws == {0, 1, 2}
  logits = logits[:, ::-1]  # the likeliest last: top_p=0 keeps it alone, as it keeps the likeliest
  assert {int(decode.pick(logits, jax.random.PRNGKey(i), 1.0, 0, 0.0)[0]) for i in range(50)} == {3}


class _Lowerings:
  """Counts the programs jax lowers (each a jit cache miss, whatever the compile cache holds)."""
  EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

  def __init__(self):
    self.names: list[str] = []

  def __call__(self, event: str, duration: float, **kwargs) -> None:
    if event == self.EVENT:
      self.names.append(kwargs.get("fun_name", "?"))

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_duration_listener(self)


@pytest.mark.slow
def test_prompt_lengths_share_a_few_programs_and_padding_changes_no_token(monkeypatch):
  cfg = tiny_config(**{"model.seq_len": 128, "model.n_layers": 1})
  state = _lively(init(cfg))
  ids = np.random.default_rng(3).integers(0, 256, 128).astype(np.int32)
  lengths = (1, 9, 16, 17, 40, 64, 65, 100, 128)
  assert [decode.prompt_bucket(n, 128) for n in lengths] == [16, 16, 16, 64, 64, 64, 128, 128, 128]
  with _Lowerings() as first:
    bucketed = {n: jt.generate(state, ids[:n], 12, temperature=0.0) for n in (17, 65, 1)}
  assert any("_prefill" in name for name in first.names), first.names  # the counter counts
  with _Lowerings() as later:  # every other length falls in one of those three buckets
    bucketed |= {n: jt.generate(state, ids[:n], 12, temperature=0.0) for n in lengths}
  assert later.names == [], later.names
  monkeypatch.setattr(decode, "prompt_bucket", lambda n, seq_len: n)  # each window its own length
  for n in (1, 16, 17, 40, 65, 128):
    exact = jt.generate(state, ids[:n], 12, temperature=0.0)
    np.testing.assert_array_equal(bucketed[n], exact)
    np.testing.assert_array_equal(bucketed[n], jt.generate(state, ids[:n], 12, temperature=0.0,
                                                           use_cache=False))
  assert len({tuple(x[-12:]) for x in bucketed.values()}) > 3, "a degenerate model proves nothing"
