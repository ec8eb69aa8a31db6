"""What a run of a config is, worked out without a write to its workdir: the config settled
(validated, init_from's fields taken, the budget's seconds and model.size=auto's corpus handed on)
and the platform set up for it (`settle`), then the tasks, the workdir checked, the data read, the
programs built (nothing compiled) and said, and the step a run would resume from (`resolve`).
A run (train.py) and `--dry_run` (loop/preview.py) both call both, so a check added here refuses
the same config in both; only the run claims the workdir (the `claim` it passes), writes to it and
attaches hooks."""

import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path

import ml_collections

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from, lifecycle, store
from jaxtrain.config import extensions, validate
from jaxtrain.core import components, lora, mesh, optim, programs, registry
from jaxtrain.core import model as model_lib
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenfiles, tokenizer
from jaxtrain.evals import tasks as tasks_lib
from jaxtrain.loop import autosize
from jaxtrain.measure import estimate
from jaxtrain.system import fmt, paths, runtime, stack, startup
from jaxtrain.system.console import Console

MANY_EPOCHS = 30  # more passes over the training split than this: a run warns in its first lines


@dataclasses.dataclass(frozen=True)
class Settled:
  """A config settled for its run, before jax starts (`settle`)."""

  cfg: ml_collections.ConfigDict  # what the run trains
  platform: str
  notes: list[str]  # what was decided, said after the run's first line
  budget_s: float | None  # train.time_budget's seconds (None: train.max_steps is the end)
  corpus: corpus_lib.Corpus | None = None  # read already (model.size=auto's), handed on


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A run of a config, as far as it goes without compiling or writing anything."""

  cfg: ml_collections.ConfigDict  # settled: what the run trains
  budget_s: float | None  # train.time_budget's seconds
  workdir: Path
  tasks: list[tasks_lib.Task]  # train.eval_tasks' records
  corpus: corpus_lib.Corpus
  programs: programs.Programs  # built; nothing compiled yet
  resume_step: int  # the newest complete checkpoint's step in the workdir (0: none)


def settle(cfg: ml_collections.ConfigDict, explicit: Collection[str] = (),
           say: Callable[[str], None] = print, t_start: float | None = None) -> Settled:
  """The config the run trains: `cfg` validated, init_from's model fields taken (`explicit`: the
  fields the user set), the compile cache on, and the process started for it (system/startup.py:
  the platform, the CPU's devices, the processes joined). With model.size=auto, the shape is
  chosen first (its probe's progress on `say`; `t_start`: when the budget's clock started)."""
  cfg = components.validate(cfg)  # extensions loaded: their components are checked too
  cfg, taken = init_from.resolve(cfg, explicit)
  if taken:
    cfg = components.validate(cfg)  # the source run's values, in this config
  budget_s = validate.time_budget_s(cfg)
  cfg, notes, corpus = autosize.resolve(cfg, budget_s, explicit, say, t_start)  # before jax starts
  runtime.enable_compile_cache()
  started = startup.settle(cfg)
  platform, notes = started.started, [*started.notes, *notes]
  components.trace(cfg)  # an extension's component traced once, before any work
  if taken:
    notes.append(f"init_from: from {cfg.init_from}, {', '.join(taken)}")
  if cfg.train.time_budget and "train.max_steps" in explicit:
    notes.append(f"note: train.time_budget={cfg.train.time_budget} sets the steps; the given "
                 "train.max_steps is not used (--config.train.time_budget=\"\" trains it)")
  return Settled(cfg, platform, [note for note in notes if note], budget_s, corpus)


def resolve(settled: Settled, out: Console,
            claim: Callable[[Path, Console], None] | None = None) -> Resolved:
  """The run of the `settled` config, said on `out` as it is worked out. `claim(workdir, out)`:
  the run's hold on the workdir, taken once it is checked and before the data is read (a second
  run into a busy workdir stops there, before its header line); a dry run passes none."""
  cfg, platform = settled.cfg, settled.platform
  eval_tasks = tasks_lib.load(cfg)  # bad records stop the run before anything else is done
  workdir = paths.check_workdir(cfg.workdir)
  if claim is not None:
    claim(workdir, out)
  resume_step = max(store.complete_steps(workdir), default=0)
  if resume_step and (workdir / "config.json").is_file():  # a refused resume: before any data work
    lifecycle.refuse_changes(paths.read_json(workdir / "config.json"), extensions.saved_config(cfg),
                             cfg.workdir)
  devices, allocator = startup.devices(), startup.decision().allocator
  data_axis, fsdp_axis = mesh.mesh_shape(cfg.mesh, len(devices))
  out.print(f"jaxtrain {__version__} | {'dry run | ' * (claim is None)}workdir {workdir} | "
            f"{platform} x{len(devices)} (mesh data={data_axis} fsdp={fsdp_axis}) | "
            f"{stack.line()}" + (f" | {allocator} allocator" if allocator else ""))
  for note in settled.notes:
    out.print(note)
  corpus = settled.corpus if settled.corpus is not None else corpus_lib.prepare(
      cfg.data, show_progress=out.use_bar, log=out.print, vocab_size=cfg.model.vocab_size)
  corpus_lib.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  tokenfiles.check_run(cfg, corpus.tokenizer)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  built = programs.build(cfg, vocab, devices, eot_id=corpus.tokenizer.eot_id)
  describe(out, cfg, corpus, built)
  tasks_lib.describe(eval_tasks, cfg.train.eval_tasks_limit, out.print)
  return Resolved(cfg, settled.budget_s, workdir, eval_tasks, corpus, built, resume_step)


def describe(out: Console, cfg: ml_collections.ConfigDict, corpus: corpus_lib.Corpus,
             built: programs.Programs) -> None:
  """What a run says before its first step: the data, the model, its compute and memory."""
  tok, mc = corpus.tokenizer, built.model_cfg
  where = corpus_lib.describe(cfg.data.mixture or cfg.data.path)
  if corpus.about:  # token files
    out.print(f"data: {where}: {corpus.about}")
  else:
    out.print(f"data: {where}: {corpus.n_files} file(s), {fmt.count(corpus.n_docs)} documents, "
              f"{fmt.count(corpus.n_bytes)}B -> {fmt.count(len(corpus.tokens))} {tok.name} tokens "
              f"(train {fmt.count(len(corpus.train))}, val {fmt.count(len(corpus.val))})")
  if corpus.mask is not None and corpus_lib.is_chat(cfg.data):
    out.print(f"data: chat records ({cfg.data.messages_field!r}): "
              f"{fmt.count(int(corpus.mask.sum()))} of the tokens (assistant turns and their "
              "end-of-turn tokens) count in the loss; records see only themselves")
  elif corpus.mask is not None:
    out.print(f"data: prompt/completion records ({cfg.data.prompt_field!r}, "
              f"{cfg.data.completion_field!r}): {fmt.count(int(corpus.mask.sum()))} of the tokens "
              "(completions and their end-of-text) count in the loss; records see only themselves")
  for note in corpus.notes:
    out.print(f"warning: data: {note.removeprefix('warning: ')}" if note.startswith("warning: ")
              else f"data: {note}")
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  abstract = built.abstract
  n_params, n_trained = lora.count(abstract.params), lora.count(abstract.trainable())
  adapters = abstract.lora
  opt_flops = optim.flops_per_step(built.optimizer, abstract.trainable())
  out.print(f"model: {fmt.count(n_params)} params, "
            + (f"{fmt.count(n_trained)} of them trained (LoRA rank {adapters.rank}, alpha "
               f"{adapters.alpha:g} on {','.join(adapters.targets)}), " if adapters else "") +
            f"{fmt.count(model_lib.flops_per_token(mc))} train FLOPs/token"
            + (f", {fmt.count(opt_flops)} optimizer FLOPs/step" if opt_flops else "")
            + f", vocab {mc.vocab_size}, {B * k * T} tokens/step ({B} x {T} x {k} micro-batches)")
  if line := components_line(cfg, mc):
    out.print(line)
  out.print(f"compute: {mc.dtype} (params and optimizer float32), attention {mc.attention} "
            f"({built.attention_why})"
            + (f"; XLA options {built.compiler_options}" if built.compiler_options else "")
            + ("; one gradient all-reduce" if built.one_allreduce else ""))
  line, warning = estimate.memory_report(mc, B, k, list(built.mesh.devices.flat),
                                         built.mesh.shape["fsdp"], n_params, n_trained)
  out.print(line)
  if warning:
    out.print(f"WARNING: {warning}")
  if not cfg.train.time_budget:  # a budget's steps: said once its plan is made (loop/setup.py)
    say_epochs(out, cfg, len(corpus.train), cfg.train.max_steps)


def components_line(cfg: ml_collections.ConfigDict, mc: model_lib.ModelConfig) -> str | None:
  """What a run says of the components it takes from `extend` (None: it takes none): each with its
  file and line, what its counts leave out, and whether sampling has a key-value cache."""
  ours = components.extension_parts(cfg)
  if not ours:
    return None
  named = ", ".join(f"{registry.KINDS[c.kind].field}={c.name} ({c.where})" for c in ours)
  notes = []
  if any(c.kind in registry.MODEL_KINDS for c in ours):
    notes.append("FLOPs and the memory estimate count them as the built-in parts of their kinds "
                 "(their own compute is not known)")
  if any(c.kind == "optimizer" and c.flops is None for c in ours):
    notes.append(f"the optimizer's own FLOPs are not counted (@jt.optimizer({cfg.optim.name!r}, "
                 "flops=...) counts them)")
  without = model_lib.kv_cache(mc)
  notes.append("sampling runs the whole window for each new token (" + ", ".join(
      f"{registry.KINDS[c.kind].field}={c.name}" for c in without) + " extends no key-value "
      "cache)" if without else "sampling extends a key-value cache")
  return f"components: {named}; {'; '.join(notes)}"


def say_epochs(out: Console, cfg: ml_collections.ConfigDict, train_tokens: int, steps: int) -> None:
  """The warning where `steps` pass over the training split more than MANY_EPOCHS times."""
  epochs = steps * cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len / train_tokens
  if epochs > MANY_EPOCHS:
    fewer = "a shorter budget (--config.train.time_budget)" if cfg.train.time_budget else \
        "fewer steps (--config.train.max_steps)"
    out.print(f"warning: plan: {epochs:.0f} epochs: the model sees each training token that many "
              "times and learns the text by heart (val loss rises again); give it more data "
              f"(--config.data.path) or {fewer}")
