"""SFT's `stop_at_loss`: the stage ends at the first step whose loss average is below the threshold, later
stages still start at the offset `steps` reserves, and a run resumed from the stopped stage matches."""
import numpy as np

from configs.grpo_arith import get_config
from rlkit.train.metrics import read_metrics, without_timings
from rlkit.train.run import run
from rlkit.train.stages import LOSS_EMA_DECAY
from tests.fast_compile import fast_compile

STEPS = 8


def _config(stages, stop_at_loss):
  c = get_config("test")
  c.stages = stages
  c.sft.steps = STEPS
  c.sft.stop_at_loss = stop_at_loss
  c.rl.steps = 2
  return c


def _train_rows(rows, stage):
  return [r for r in rows if r["stage"] == stage and "loss" in r]


@fast_compile()   # four short runs, mostly compiling; what they compare does not depend on XLA's fusions
def test_stop_at_loss_ends_sft_early_and_resumes_into_the_next_stage(tmp_path, capsys):
  run(_config(("sft",), 0.0), str(tmp_path / "full"))
  losses = [r["loss"] for r in _train_rows(read_metrics(str(tmp_path / "full" / "metrics.jsonl")), "sft")]
  assert len(losses) == STEPS
  ema = [losses[0]]
  for loss in losses[1:]:
    ema.append(LOSS_EMA_DECAY * ema[-1] + (1 - LOSS_EMA_DECAY) * loss)
  stop = int(np.argmin(ema))
  assert stop > 0, f"the test needs a falling loss average, got {ema}"
  threshold = (ema[stop] + min(ema[:stop])) / 2    # step `stop` is the first one below it

  capsys.readouterr()
  run(_config(("sft", "rl"), threshold), str(tmp_path / "stopped"))
  out = capsys.readouterr().out
  assert f"stage sft: ended at step {stop + 1} of {STEPS}: the loss average" in out, out
  assert f"stage rl (rl): 2 steps (global steps {STEPS + 1}..{STEPS + 2})" in out
  rows = read_metrics(str(tmp_path / "stopped" / "metrics.jsonl"))
  sft = _train_rows(rows, "sft")
  assert [r["step"] for r in sft] == list(range(1, stop + 2))
  np.testing.assert_allclose(sft[-1]["loss_ema"], ema[stop], rtol=1e-6)
  assert any(r["stage"] == "sft" and r["step"] == stop + 1 and "eval/accuracy" in r for r in rows)
  assert [r["step"] for r in _train_rows(rows, "rl")] == [STEPS + 1, STEPS + 2]

  # The same run in two commands: SFT alone, then both stages on that workdir. The second command must
  # find SFT finished (not resume it to `steps`) and produce exactly the rows of the one-command run.
  two = str(tmp_path / "two")
  run(_config(("sft",), threshold), two)
  capsys.readouterr()
  run(_config(("sft", "rl"), threshold), two)
  out = capsys.readouterr().out
  assert f"from its checkpoint at global step {stop + 1} (stage sft finished)" in out and "stage sft: already finished" in out
  assert without_timings(read_metrics(two + "/metrics.jsonl")) == without_timings(rows)
