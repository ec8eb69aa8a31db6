"""`python -m jaxtrain.compare` on hand-made runs: the table, its order, the marks, the plots."""

import json
import subprocess
import sys

import matplotlib.image
import pytest

from jaxtrain.config import defaults, loading
from jaxtrain.system import paths
from jaxtrain.tools import compare, runs

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _make_run(path, lr: float, n_layers: int, val: list[float], max_steps: int = 40,
              status: dict | None = None, bpb: float = 1 / 0.693, **fields):
  path.mkdir(parents=True)
  cfg = loading.override(defaults.default_config(), **{
      "workdir": str(path), "optim.lr": lr, "model.n_layers": n_layers,
      "train.max_steps": max_steps, **fields})
  paths.write_json(path / paths.RUN_FILE, {"jaxtrain_version": "test"})
  paths.write_json(path / "config.json", cfg.to_dict())
  lines = []
  for i, v in enumerate(val, start=1):
    step = 10 * i
    lines.append({"step": step, "loss": v + 0.1, "lr": lr, "tokens_per_sec": 1000.0 * i,
                  "elapsed_s": 2.0 * step})
    lines.append({"step": step, "val_loss": v, "val_bpb": v * bpb, "elapsed_s": 2.0 * step})
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines)
                                      + '{"step": 99, "loss"')  # a line a kill cut short
  if status is not None:
    paths.write_json(path / paths.STATUS_FILE, status)


@pytest.fixture
def sweep_root(tmp_path):
  root = tmp_path / "sweep"
  done = {"state": "finished", "step": 40, "params": 123456}
  _make_run(root / "lr=1e-3", 1e-3, 2, [3.0, 2.5, 2.2, 2.1], status=done)
  _make_run(root / "lr=3e-3", 3e-3, 2, [2.8, 2.2, 1.9, 1.8], status=done)
  _make_run(root / "lr=1e-2", 1e-2, 4, [2.9, 2.4], status={"state": "running", "step": 0})
  (root / "logs").mkdir()  # not a run: left out
  return root


def test_table_lists_differences_best_first_and_marks_unfinished(sweep_root, tmp_path):
  printed = []
  out = tmp_path / "cmp"
  infos = compare.compare([str(sweep_root)], out, printed.append, width=200)
  assert [i.path.name for i in infos] == ["lr=3e-3", "lr=1e-3", "lr=1e-2"]
  table = printed[0].splitlines()
  assert table[0].split() == ["run", "model.n_layers", "optim.lr", "params", "steps", "best",
                              "val", "final", "val", "val", "bpb", "tok/s", "time", "state"]
  best = table[2].split()
  assert best[:6] == ["lr=3e-3", "2", "0.003", "123.46k", "40/40", "1.8000"]
  assert best[-2:] == ["1m20s", "done"]  # elapsed_s of the last line; finished
  assert best[-3] == "2.50k"  # the median tokens/s
  unfinished = table[4].split()
  assert unfinished[0] == "lr=1e-2" and unfinished[-1] == "killed"  # "running", but no lock held
  assert unfinished[4] == "20/40"
  assert printed[1] == ("best: lr=3e-3 (best val_loss 1.8000); ranked by val_loss (nats per token: "
                        "the same tokens in every run)")
  md = (out / "compare.md").read_text().splitlines()
  assert md[0].startswith("| run | model.n_layers | optim.lr |") and len(md) == 5
  for png in ("loss_vs_step.png", "loss_vs_time.png"):
    image = matplotlib.image.imread(out / png)
    assert image.shape[0] > 300 and image.shape[1] > 600


def test_time_is_the_whole_command_start_up_included(tmp_path):
  _make_run(tmp_path / "a", 1e-3, 2, [2.0, 1.9], status={"state": "finished", "step": 20,
                                                          "wall_s": 300.0})  # 40 s trained
  printed = []
  compare.compare([str(tmp_path / "a")], None, printed.append, width=200)
  assert printed[0].splitlines()[2].split()[-2:] == ["5m00s", "done"]


def test_globs_and_single_runs(sweep_root):
  printed = []
  infos = compare.compare([str(sweep_root / "lr=1e-*"), str(sweep_root / "lr=1e-3")],
                          print_fn=printed.append)
  assert sorted(i.path.name for i in infos) == ["lr=1e-2", "lr=1e-3"]  # no run twice


def test_a_finished_run_without_status_file_counts_by_its_steps(tmp_path):
  _make_run(tmp_path / "old", 1e-3, 2, [3.0, 2.0, 1.5, 1.4])
  _make_run(tmp_path / "short", 1e-3, 2, [3.0])
  assert runs.read(tmp_path / "old").state == "finished"
  assert runs.read(tmp_path / "short").state == "unfinished"


@pytest.mark.slow
def test_cli_says_what_is_wrong_in_one_line(tmp_path):
  res = subprocess.run([sys.executable, "-m", "jaxtrain.compare", str(tmp_path / "nothing*")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert res.returncode == 2
  assert res.stderr.count("\n") == 1 and "no jaxtrain run at" in res.stderr


def test_runs_with_other_tokens_rank_by_bits_per_byte_and_irrelevant_fields_stay_out(tmp_path):
  done = {"state": "finished", "step": 40, "params": 1000}
  # The char run has the lower loss per token, the BPE run the lower bits per byte: BPE wins.
  _make_run(tmp_path / "char", 1e-3, 2, [1.5], status=done, bpb=1.0,
            **{"data.tokenizer": "char", "data.vocab_size": 512, "headless": True,
               "sample.num_samples": 1})
  _make_run(tmp_path / "bpe", 1e-3, 2, [3.0], status=done, bpb=0.4,
            **{"data.tokenizer": "bpe", "data.vocab_size": 4096})
  _make_run(tmp_path / "byte", 1e-3, 2, [1.4], status=done, bpb=1.2,
            **{"data.tokenizer": "byte", "data.vocab_size": 4096})
  printed = []
  infos = compare.compare([str(tmp_path)], print_fn=printed.append, width=200)
  assert [i.path.name for i in infos] == ["bpe", "char", "byte"]
  table = printed[0].splitlines()
  # Only what differs and has an effect: vocab_size counts for the BPE run alone.
  assert table[0].split()[:4] == ["run", "data.tokenizer", "data.vocab_size", "params"]
  assert [r.split()[:3] for r in table[2:]] == [["bpe", "bpe", "4096"], ["char", "char", "-"],
                                                ["byte", "byte", "-"]]
  assert printed[1] == ("best: bpe (best val_bpb 1.2000); ranked by val_bpb (bits per byte: the "
                        "runs' tokenizers or data differ, so their losses per token do not compare)")
  assert compare.differences(infos[1:]) == ["data.tokenizer"]  # byte vs char: vocab_size moot


def test_a_table_wider_than_the_terminal_becomes_a_block_a_run(sweep_root):
  printed = []
  compare.compare([str(sweep_root)], print_fn=printed.append, width=50)
  lines = printed[0].splitlines()
  assert all(len(line) <= 50 for line in lines), lines
  assert lines[0] == "1. lr=3e-3" and lines[1] == "   model.n_layers=2  optim.lr=0.003"
  assert lines[2:5] == ["   params 123.46k  steps 40/40  best val 1.8000",  # a label and its
                        "   final val 1.8000  val bpb 2.5974  tok/s 2.50k",  # value together
                        "   time 1m20s  state done"]
  assert "best val 1.8000" in printed[0] and "state done" in printed[0]
  assert [line for line in lines if not line.startswith("   ")] == ["1. lr=3e-3", "2. lr=1e-3",
                                                                    "3. lr=1e-2"]


def test_runs_whose_val_loss_counts_other_tokens_are_ranked_apart(tmp_path):
  done = {"state": "finished", "step": 40, "params": 1000}
  # The prompt/completion run's loss counts only its completions: lowest, but not comparable.
  _make_run(tmp_path / "text_a", 1e-3, 2, [1.6], status=done, bpb=1.0)
  _make_run(tmp_path / "text_b", 3e-3, 2, [1.5], status=done, bpb=1.0)
  _make_run(tmp_path / "task", 1e-3, 2, [0.2], status=done, bpb=1.0,
            **{"data.prompt_field": "prompt", "data.completion_field": "completion",
               "data.path": "task.jsonl"})
  _make_run(tmp_path / "chat", 1e-3, 2, [0.1], status=done, bpb=1.0,
            **{"data.messages_field": "messages", "data.path": "chats.jsonl"})
  printed = []
  infos = compare.compare([str(tmp_path)], print_fn=printed.append, width=400)
  assert [i.path.name for i in infos] == ["text_b", "text_a", "task", "chat"]
  table = printed[0].splitlines()
  assert table[0].endswith("val loss on")
  assert [r.rsplit("  ", 1)[1].strip() for r in table[2:]] == ["every token", "every token",
                                                                "completions", "assistant turns"]
  assert printed[1] == ("note: 2 runs on every token, 1 run on completions, 1 run on assistant "
                        "turns: validation losses that count other tokens do not compare (per "
                        "token or per byte), so each kind is ranked on its own (column 'val loss "
                        "on')")
  assert printed[2].startswith("best on every token: text_b (best val_loss 1.5000); ranked by "
                               "val_loss")
  assert printed[3].startswith("best on completions: task (best val_loss 0.2000); ranked by")
  assert printed[4].startswith("best on assistant turns: chat (best val_loss 0.1000); ranked by")
  # A task score compares across them: one ranking.
  assert compare.groups(infos, "task/held/exact_match") == [infos]


def test_a_baseline_gets_each_runs_difference_and_seeds_their_spread(tmp_path):
  root = tmp_path / "sweep"
  done = {"state": "finished", "step": 20}
  for mlp, vals in (("swiglu", [1.80, 1.82, 1.81]), ("gelu", [1.85, 1.84, 1.86])):
    for seed, v in enumerate(vals):
      _make_run(root / f"mlp={mlp}_seed={seed}", 1e-3, 2, [2.0, v], status=done,
                **{"model.mlp": mlp, "seed": seed})
  printed = []
  compare.compare([str(root)], None, printed.append, width=400, baseline="mlp=gelu_seed=0")
  table = [line.split() for line in printed[0].splitlines()]
  assert table[0][-3:] == ["Δ", "to", "mlp=gelu_seed=0"]
  assert [(row[0], row[-1]) for row in table[2:]] == [
      ("mlp=swiglu_seed=0", "-0.0500"), ("mlp=swiglu_seed=2", "-0.0400"),
      ("mlp=swiglu_seed=1", "-0.0300"), ("mlp=gelu_seed=1", "-0.0100"),
      ("mlp=gelu_seed=0", "baseline"), ("mlp=gelu_seed=2", "+0.0100")]
  at = printed.index("across seeds (runs alike but for their seed; Δ mean to the baseline's group, "
                     "± its standard error):")
  spread = [line.split() for line in printed[at + 1].splitlines()]
  assert spread[0] == ["model.mlp", "runs", "mean", "best", "val_loss", "std", "min", "max", "Δ",
                       "mean"]
  # the means differ by 0.04; each group's std is 0.01: the standard error sqrt(2 x 0.01^2 / 3)
  assert spread[2] == ["swiglu", "3", "1.8100", "0.0100", "1.8000", "1.8200", "-0.0400", "±",
                       "0.0082"]
  assert spread[3] == ["gelu", "3", "1.8500", "0.0100", "1.8400", "1.8600", "baseline"]
  assert not any(line.startswith("warning:") for line in printed)  # the same steps, no compiles


def test_compile_times_matter_only_under_a_time_budget(tmp_path):
  """Runs of fixed steps train the same whatever their compiles cost: no warning then."""
  for name, compiled in (("a", 5.0), ("b", 40.0)):
    _make_run(tmp_path / name, 1e-3, 2, [2.0, 1.9], status={"state": "finished", "step": 20,
                                                            "compile_s": compiled})
  printed = []
  compare.compare([str(tmp_path / "a"), str(tmp_path / "b")], None, printed.append, width=300)
  assert not any(line.startswith(("warning:", "at equal steps:")) for line in printed), printed


def test_runs_of_unequal_steps_or_compile_times_are_flagged_and_met_at_equal_steps(tmp_path):
  """The misleading ablation of issue 60: under one time budget, the variant whose compile was
  cached trained more steps, and its lower final loss was no win at equal steps."""
  root = tmp_path / "sweep"
  budget = {"train.time_budget": "75s"}
  _make_run(root / "mlp=swiglu", 1e-3, 2, [2.2, 2.0, 1.95, 1.80], max_steps=40, **budget,
            **{"model.mlp": "swiglu"}, status={"state": "finished", "step": 40, "compile_s": 6.3})
  _make_run(root / "mlp=gelu", 1e-3, 2, [2.2, 1.98, 1.90], max_steps=30, **budget,
            **{"model.mlp": "gelu"}, status={"state": "finished", "step": 30, "compile_s": 21.3})
  printed = []
  compare.compare([str(root)], None, printed.append, width=400)
  assert printed[2] == (
      "warning: these runs trained different steps (30 to 40), different tokens (61.44k to "
      "81.92k), paid different compile times (6.3s to 21.3s): their final and best losses do not "
      "compare as they stand; under a time budget a run whose compile was cached trains longer "
      "(jaxtrain-sweep compiles every variant before its timed runs); the line below compares "
      "them at equal steps")
  assert printed[3] == ("at equal steps: val_loss at step 30 (the last step every run evaluated): "
                        "mlp=gelu 1.9000, mlp=swiglu 1.9500; each at its own point of a schedule "
                        "that decays to its own end, so the fair test is runs of equal steps")


def test_an_extensions_option_counts_only_where_its_component_is_chosen(tmp_path):
  for name, variant in (("causal", "causal"), ("window", "window")):
    path = tmp_path / name
    _make_run(path, 1e-3, 2, [2.0, 1.9], status={"state": "finished", "step": 20},
              **{"model.attention_variant": variant})
    saved = json.loads((path / "config.json").read_text())
    saved["ext"] = {"window": {"size": 32}}  # both loaded the file; one chose its component
    paths.write_json(path / "config.json", saved)
  infos = [runs.read(tmp_path / "causal"), runs.read(tmp_path / "window")]
  assert compare.effective(infos[0], "ext.window.size") is compare._MISSING
  assert compare.effective(infos[1], "ext.window.size") == 32
  assert compare.differences(infos) == ["ext.window.size", "model.attention_variant"]  # config order
