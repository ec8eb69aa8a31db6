"""lm-evaluation-harness on a jaxtrain run (`--model jaxtrain`, evals/harness.py), offline, on tasks
defined from local files: loglikelihood, loglikelihood_rolling and generation tasks give what
jaxtrain's own scoring gives, and a run's in-training `mc_accuracy` equals lm_eval's `acc_bytes`
for the same checkpoint and items."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

lm_eval = pytest.importorskip("lm_eval", reason="the lm_eval extra (pip install '.[lm_eval]'); "
                              "CI's newest leg (Python 3.12, no torch) leaves it out")

from conftest import with_root_on_path  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_export_check import make_run  # noqa: E402
from test_finetune import FIELDS, KEYS, keyed, pattern, task_config, write_jsonl  # noqa: E402

import jaxtrain as jt  # noqa: E402
from jaxtrain.checkpoints import load  # noqa: E402
from jaxtrain.evals import harness  # noqa: E402, F401  (registers --model jaxtrain)
from jaxtrain.generation import complete  # noqa: E402
from jaxtrain.testing import tiny_config  # noqa: E402

MEAN = "    aggregation: mean\n    higher_is_better: true\n"


def task_yaml(directory: Path, name: str, data: Path, body: str) -> None:
  """A task of lm_eval read from a local .jsonl file: no download."""
  directory.mkdir(exist_ok=True)
  (directory / f"{name}.yaml").write_text(
      f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
      f"test_split: test\n{body}")


MC = ("output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{endings}}\"\n"
      "doc_to_target: \"{{label}}\"\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n" + MEAN
      + "  - metric: acc_bytes\n" + MEAN)


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def evaluate(workdir: Path, tasks_dir: Path, *tasks: str, step: str = "latest") -> dict:
  return lm_eval.simple_evaluate(model="jaxtrain", model_args=f"workdir={workdir},step={step}",
                                 tasks=list(tasks), task_manager=TaskManager(
                                     include_path=str(tasks_dir)), log_samples=False)["results"]


@pytest.mark.slow
def test_loglikelihood_rolling_and_generation_tasks_give_jaxtrains_numbers(tmp_path):
  make_run(tmp_path / "run", tiny_config())
  state, tok = load.load(str(tmp_path / "run"))
  rng = np.random.default_rng(0)
  items = [{"context": f"q{i}:", "endings": [" ab", " hello", " z!"], "label": int(rng.integers(3))}
           for i in range(8)]
  prompts = [{"prompt": f"say {i}", "completion": "x"} for i in range(6)]
  texts = [{"text": "def f(x): return x\n"}, {"text": "héllo wörld"}]
  tasks = tmp_path / "tasks"
  task_yaml(tasks, "jt_mc", write_jsonl(tmp_path / "mc.jsonl", items), MC)
  made = complete.complete(state, tok, [p["prompt"] for p in prompts], 6)
  prompts = [dict(p, completion=m.split("\n")[0] if i % 2 else "no") for i, (p, m) in
             enumerate(zip(prompts, made))]  # half of them what jaxtrain generates
  task_yaml(tasks, "jt_gen", write_jsonl(tmp_path / "gen.jsonl", prompts),
            "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: "
            "\"{{completion}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n"
            "  do_sample: false\nmetric_list:\n  - metric: exact_match\n" + MEAN)
  task_yaml(tasks, "jt_text", write_jsonl(tmp_path / "text.jsonl", texts),
            "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
            "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n"
            "    higher_is_better: false\n")
  results = evaluate(tmp_path / "run", tasks, "jt_mc", "jt_gen", "jt_text")
  # Multiple choice: the ending of highest summed log-likelihood, and per byte.
  lls = [complete.score(state, [(complete.context_ids(state, tok, r["context"]),
                                 np.asarray(tok.encode(e), np.int32)) for e in r["endings"]])
         for r in items]
  sizes = np.array([len(e.encode()) for e in items[0]["endings"]])
  assert results["jt_mc"]["acc,none"] == np.mean([np.argmax(x) == r["label"]
                                                  for x, r in zip(lls, items)])
  assert results["jt_mc"]["acc_bytes,none"] == np.mean([np.argmax(x / sizes) == r["label"]
                                                        for x, r in zip(lls, items)])
  assert results["jt_gen"]["exact_match,none"] == 0.5
  # The texts fit the context: each is scored whole after an end-of-text token.
  nats = sum(-complete.score(state, [(np.array([tok.eot_id], np.int32),
                                      np.asarray(tok.encode(t["text"]), np.int32))])[0]
             for t in texts)
  n_bytes = sum(len(t["text"].encode()) for t in texts)
  assert results["jt_text"]["bits_per_byte,none"] == pytest.approx(nats / n_bytes / np.log(2),
                                                                   rel=1e-6)


@pytest.mark.slow
def test_the_in_training_mc_accuracy_is_lm_evals_acc_bytes(tmp_path):
  """A short run scores 24 multiple-choice records at its evaluation; lm_eval on that
  checkpoint, same records, gives the same accuracy (0.79 here, part way through learning; lm_eval's
  unnormalized `acc` picks the short cut ending: 0.0)."""
  train = write_jsonl(tmp_path / "train.jsonl", keyed(600, seed=0))
  # The right pattern for the key, another key's (which only a model that learned the keys
  # tells apart), and a cut one; the right one at each place in turn.
  items = []
  for i, r in enumerate(keyed(24, seed=2)):
    endings = [pattern((KEYS.index(r["prompt"][3]) + 1) % 8), pattern(0)[:2]]
    endings.insert(i % 3, r["completion"])
    items.append({"context": r["prompt"], "endings": endings, "label": i % 3})
  mc = write_jsonl(tmp_path / "mc.jsonl", items)
  cfg = task_config(train, tmp_path / "run", **FIELDS, **{
      "train.max_steps": 16, "train.eval_every": 16, "train.checkpoint_every": 16,
      "train.eval_tasks": str(mc)})
  jt.run(cfg)
  logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  last = [r for r in logged if "task/mc/mc_accuracy" in r][-1]
  assert last["step"] == 16
  task_yaml(tmp_path / "tasks", "jt_mc", mc, MC)
  results = evaluate(tmp_path / "run", tmp_path / "tasks", "jt_mc", step="16")["jt_mc"]
  assert results["acc_bytes,none"] == last["task/mc/mc_accuracy"], (results, last)
  print(f"in training: mc_accuracy {last['task/mc/mc_accuracy']}; lm_eval: acc_bytes "
        f"{results['acc_bytes,none']}, acc {results['acc,none']}")


@pytest.mark.slow
def test_the_command_runs_lm_evals_command_line_on_a_run(tmp_path):
  make_run(tmp_path / "run", tiny_config())
  items = [{"context": "a", "endings": ["b", "cd"], "label": 0}] * 3
  task_yaml(tmp_path / "tasks", "jt_mc", write_jsonl(tmp_path / "mc.jsonl", items), MC)
  def command(workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxtrain.lm_eval", "--model", "jaxtrain",
                           "--model_args", f"workdir={workdir}", "--include_path",
                           str(tmp_path / "tasks"), "--tasks", "jt_mc"], cwd=tmp_path,
                          env=with_root_on_path(), capture_output=True, text=True, timeout=300)

  proc = command(tmp_path / "run")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "acc_bytes" in proc.stdout and "jt_mc" in proc.stdout
  proc = command(tmp_path / "nothing")
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
      f"error: workdir {tmp_path / 'nothing'} does not exist"), proc.stderr[-2000:]
