"""`train.profile_steps`: a tiny run writes a profiler trace of the steps after the first."""

import gzip
import json
from pathlib import Path

import pytest

from jaxtrain import train
from jaxtrain.config.loading import override
from jaxtrain.trackers import hooks


@pytest.mark.slow
@pytest.mark.parametrize("max_steps,profile_steps", [(4, 2), (3, 5)])  # the second: cut at the end
def test_profile_steps_writes_a_trace_of_steps_after_the_first(tiny, capsys, max_steps,
                                                                profile_steps):
  override(tiny, **{"train.max_steps": max_steps, "train.profile_steps": profile_steps,
                    "train.eval_every": 100, "train.checkpoint_every": 100,
                    "sample.num_samples": 0})
  seen = []

  class Steps(hooks.Hook):
    def on_step(self, step, state):
      seen.append(step)

  train.run(tiny, show_progress=True, hooks=(Steps(),))
  assert seen == list(range(1, max_steps + 1))  # every step reaches the hooks
  profile = tiny.workdir + "/profile"
  assert "profile of steps 2-3: " + profile in capsys.readouterr().out
  xplanes = list(Path(profile).glob("plugins/profile/*/*.xplane.pb"))
  assert len(xplanes) == 1 and xplanes[0].stat().st_size > 0
  perfetto = list(Path(profile).glob("plugins/profile/*/perfetto_trace.json.gz"))
  assert len(perfetto) == 1
  events = json.loads(gzip.decompress(perfetto[0].read_bytes()))["traceEvents"]
  names = {str(e.get("name", "")) for e in events}
  assert any("train_step" in n for n in names), "no train step in the trace"
  assert not any("eval_step" in n for n in names), "the run's final evaluation is in the trace"

