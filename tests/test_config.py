"""Every config field is validated up front, with a message naming the field and the fix."""

import functools
import importlib.util
import os
import subprocess
from pathlib import Path

import jax
import pytest

from jaxtrain.config import defaults, loading, validate
from jaxtrain.core import components, mesh
from jaxtrain.data import tokenizer
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config

BAD = [
    # A recipe whose data is the user's: what the file holds, and where the text recipes' comes from.
    ({"data.path": "<required>"}, "data.path", "trains on text of yours); pass "
     "--config.data.path=input.txt, any UTF-8 text (Tiny Shakespeare: curl -o input.txt https://"
     "raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt)"),
    ({"data.path": "<required>", "data.prompt_field": "q", "data.completion_field": "a"},
     "data.path", "pass --config.data.path=train.jsonl, .jsonl or .parquet records with 'q' and 'a'"),
    ({"data.path": "<required>", "data.messages_field": "turns"}, "data.path",
     "trains on chat records of yours); pass --config.data.path=chats.jsonl"),
    ({"model.d_model": 30, "model.n_heads": 4}, "model.d_model", "not divisible"),
    ({"model.d_model": 36, "model.n_heads": 12}, "model.d_model", "even head size"),
    ({"model.n_layers": 0}, "model.n_layers", "integer >= 1"),
    ({"model.seq_len": -5}, "model.seq_len", "integer >= 1"),
    ({"model.norm": "batchnorm"}, "model.norm", "names no norm here (built-in: rmsnorm, layernorm;"),
    ({"model.pos": "alibi"}, "model.pos", "names no positions here (built-in: rope, learned, none;"),
    ({"model.mlp": "relu"}, "model.mlp", "names no mlp here (built-in: swiglu, gelu, relu2;"),
    ({"model.attention_variant": "window"}, "model.attention_variant", "registered: none)"),
    ({"optim.name": "lion"}, "optim.name", "names no optimizer here (built-in: adamw, muon;"),
    ({"optim.schedule": "linear"}, "optim.schedule", "(built-in: cosine, wsd, constant;"),
    ({"optim.loss_term": "entropy"}, "optim.loss_term", "built-in: none; registered: none"),
    ({"model.dtype": "float64"}, "model.dtype", "not one of"),
    ({"model.dropout": 1.0}, "model.dropout", "[0, 1)"),
    ({"model.canon": -1}, "model.canon", "integer >= 0"),
    ({"model.canon": 65}, "model.canon", "at most 64"),
    ({"train.max_steps": 0}, "train.max_steps", "integer >= 1"),
    ({"train.batch_size": 0}, "train.batch_size", "integer >= 1"),
    ({"train.grad_accum": 0}, "train.grad_accum", "integer >= 1"),
    ({"train.eval_every": -1}, "train.eval_every", "integer >= 1"),
    ({"train.checkpoint_every": 0}, "train.checkpoint_every", "integer >= 1"),
    ({"train.keep_checkpoints": 0}, "train.keep_checkpoints", "integer >= 1"),
    ({"optim.lr": 0.0}, "optim.lr", "must be > 0"),
    ({"optim.lr": -1e-3}, "optim.lr", "must be > 0"),
    ({"optim.warmup_steps": -1}, "optim.warmup_steps", "integer >= 0"),
    ({"optim.weight_decay": -0.1}, "optim.weight_decay", ">= 0"),
    ({"optim.clip_norm": -1.0}, "optim.clip_norm", ">= 0"),
    ({"optim.z_loss": -1e-4}, "optim.z_loss", "in [0, 1]"),
    ({"model.fused_loss": True, "model.loss_chunk": 64}, "model.fused_loss", "pick one"),
    ({"optim.b2": 1.0}, "optim.b2", "[0, 1)"),
    ({"data.tokenizer": "wordpiece"}, "data.tokenizer",
     "is not byte, char, bpe, gpt2 or a tokenizer.json file"),
    ({"data.val_fraction": 0.0}, "data.val_fraction", "(0, 1)"),
    ({"data.val_fraction": 1.0}, "data.val_fraction", "(0, 1)"),
    ({"data.val_fraction": 1e-31}, "data.val_fraction", "at least 1e-30"),
    ({"model.rope_theta": 0.0}, "model.rope_theta", "must be > 0"),
    ({"model.rope_theta": -1.0}, "model.rope_theta", "must be > 0"),
    ({"sample.temperature": -1.0}, "sample.temperature", ">= 0"),
    ({"mesh.data": 0}, "mesh.data", "-1 (all devices) or >= 1"),
    ({"mesh.data": -1, "mesh.fsdp": -1}, "mesh.fsdp", "only one mesh axis"),
    ({"workdir": " "}, "workdir", "is empty"),
    ({"log.group_stats": "layer"}, "log.group_stats", "not one of groups, layers, none"),
    ({"log.wandb_mode": "disabled"}, "log.wandb_mode", "not one of online, offline"),
    ({"log.wandb_project": "team/proj"}, "log.wandb_project", "not a W&B project name"),
    ({"log.wandb_project": ""}, "log.wandb_project", "not a W&B project name"),
]


@pytest.mark.parametrize("overrides,field,words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_field_is_named_with_a_fix(overrides, field, words):
  cfg = tiny_config(**overrides)
  with pytest.raises(ConfigError) as e:
    components.validate(cfg)  # jt.validate: the fields, then the components they name
  message = str(e.value)
  assert e.value.field == field and message.startswith(f"config.{field}: ")
  assert words in message and "\n" not in message
  assert "pass" in message or "make" in message or "point" in message or "change" in message


def test_the_shipped_configs_are_valid(corpus_file):
  """Each recipe trains on Python's standard library (data.path "") or on a file the user gives
  ("<required>": stopped before any work until then), never on a path a checkout lacks."""
  for path in sorted(Path(__file__).parents[1].glob("configs/*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config()
    assert cfg.data.path in ("", defaults.REQUIRED), f"{path.name}: data.path={cfg.data.path!r}"
    if cfg.data.path == defaults.REQUIRED:
      with pytest.raises(ConfigError, match="^config.data.path: is not given"):
        validate.validate(cfg)
      cfg.data.path = str(corpus_file)
    validate.validate(cfg)


def test_a_mixture_stands_for_the_required_data_path(corpus_file):
  validate.validate(tiny_config(**{"data.path": "<required>", "data.mixture": f"{corpus_file}:1"}))


def test_batch_must_split_over_devices_and_processes():
  cfg = tiny_config(**{"train.batch_size": 6})
  cpu = jax.devices()[0]
  mesh.check_devices(cfg.mesh, 6, [cpu] * 2, "float32")
  with pytest.raises(ConfigError, match="train.batch_size: 6 does not split evenly over 4 devices"):
    mesh.check_devices(cfg.mesh, 6, [cpu] * 4, "float32")
  with pytest.raises(ConfigError, match="mesh.data"):
    mesh.check_devices(tiny_config(**{"mesh.data": 3}).mesh, 8, [cpu] * 4, "float32")


def test_vocab_smaller_than_the_tokenizer_is_rejected():
  with pytest.raises(ConfigError, match="model.vocab_size: 100 is smaller"):
    tokenizer.model_vocab_size(100, tokenizer.ByteTokenizer())


@pytest.mark.parametrize("overrides", [
    {"data.val_fraction": 0.9}, {"data.val_fraction": 1 - 2**-53}, {"data.val_fraction": 1e-30},
    {"model.rope_theta": 0.5}, {"model.rope_theta": 1e-30},
    # The validation set is sharded over the devices: no global limit on its tokens.
    {"train.eval_steps": 4096, "train.batch_size": 4096, "model.seq_len": 1024},
], ids=str)
def test_edges_that_work_are_accepted(overrides):
  validate.validate(tiny_config(**overrides))


def test_a_saved_run_that_used_a_removed_field_is_refused_naming_its_patch():
  """A field that left the tree (the config gate) cannot be dropped silently from a run trained
  with it; a run that left it as today's behaviour reads as before."""
  saved = tiny_config().to_dict()
  saved["model"]["value_embeds"] = True
  with pytest.raises(UserError, match=r"^this run was trained with model\.value_embeds=True, "
                     r"which jaxtrain no longer has; in jaxtrain's repository, `git checkout "
                     r"0a4fec37da && git apply benchmarks/results/.*value_embeds\.diff` brings"):
    loading.from_saved(saved)
  saved["model"]["value_embeds"] = False
  assert loading.from_saved(saved).to_dict() == tiny_config().to_dict()
  root = Path(__file__).resolve().parents[1]
  assert [patch for _, patch, _ in loading.REMOVED.values() if not (root / patch).is_file()] == []


def test_each_removed_fields_patch_applies_at_the_commit_it_names(tmp_path):
  """The refusal's command works: each patch applies to the tree of the commit named beside it
  (a temporary index; nothing is checked out)."""
  root = Path(__file__).resolve().parents[1]
  git = functools.partial(subprocess.run, cwd=root, capture_output=True, text=True)
  if git(["git", "cat-file", "-e", "0a4fec37da^{commit}"]).returncode != 0:
    pytest.skip("needs jaxtrain's git history (a checkout with its commits)")
  env = dict(os.environ, GIT_INDEX_FILE=str(tmp_path / "index"))
  for field, (_, patch, commit) in loading.REMOVED.items():
    assert git(["git", "read-tree", commit], env=env).returncode == 0, field
    check = git(["git", "apply", "--cached", "--check", patch], env=env)
    assert check.returncode == 0, (field, check.stderr)
