"""launch.py end to end: config errors write nothing; a SIGKILLed run resumes to identical metrics."""
import os
import signal
import subprocess
import sys
import time

import pytest

from rlkit.train.checkpoint import Checkpointer
from rlkit.train.metrics import read_metrics, without_timings
from tests.cli_in_process import launch_in_process
from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_CONFIG = os.path.join(ROOT, "configs", "grpo_arith.py") + ":test"


def _launch(workdir, *overrides, config=TEST_CONFIG, **kw):
  cmd = [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={config}", f"--workdir={workdir}", *overrides]
  # XLA's optimisation passes off: these short runs are mostly compiling, and every comparison here is
  # between runs compiled alike.
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _run(workdir, *overrides, timeout=300, config=TEST_CONFIG):
  proc = _launch(workdir, *overrides, config=config)
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err


@pytest.mark.parametrize("override,needle", [
    ("--config.rl.advantage=grpoo", "rl.advantage='grpoo' is not a known advantage estimator"),
    ("--config.rl.policy_loss=ppo", "choose one of"),
    ("--config.sft.optimizer.name=adamw2", "optimizer"),
    ("--config.rl.lrr=0.1", "lrr"),
    ("--config.rl.steps=abc", "steps"),
    ("--config.mesh.cpu_devices=-1", "mesh.cpu_devices=-1 must be >= 0"),
    ("--config.rl.top_p=0.0", "rl.top_p=0.0 must be in (0, 1]"),          # once ran SFT, then crashed in RL
    ("--config.task.kwargs.max_digits=0", "need 1 <= min_digits <= max_digits"),   # once left config.json
    ("--config.foo=1", "the top level has no key 'foo'"),               # once a 55-line traceback, exit 1
    ("--config.rl.advatnage=group", "Valid keys of rl: advantage,"),    # the closest match first
    ("--config.rl.advantage=grop", "choose one of: group,"),
    ("--config.sft.max_len=5", "raise --config.sft.max_len to at least 11"),   # once a grain traceback
    ("--config.tokenizer.kind=hf", "tokenizer.kind='hf' needs tokenizer.path"),
    ('--config.rl.policy_kwargs={"tau": 1.0}', "policy loss 'ppo_clip' takes no parameter 'tau'"),
    ("--config.rl.correction.rollout_rs=token_k9", "rl.correction.rollout_rs"),
    ("--config.rl.rollout_mismatch.noise_kind=gauss", "noise_kind='gauss'"),
    ("--config.rl.advantage=gea", "choose one of: gar, gae,"),   # the closest names first
    ("--config.models.peer.path=x", "models has no key 'peer'. Valid keys of models: none"),   # was a traceback
])
def test_config_error_is_clear_and_writes_nothing(tmp_path, override, needle):
  """In-process (a process per case cost ~3 s of imports); test_config_errors_exit_the_process_cleanly runs
  some of them as real processes."""
  workdir = tmp_path / "run"
  code, out, err = launch_in_process(f"--config={TEST_CONFIG}", f"--workdir={workdir}", override)
  assert code == 2, (code, err[-2000:])
  assert err.strip().startswith("Config error:") and err.strip().count("\n") == 0, err
  assert needle.lower() in (out + err).lower(), err[-2000:]
  assert not workdir.exists()


@pytest.mark.parametrize("override", ["--config.rl.advantage=grpoo", "--config.foo=1", "--config.models.peer.path=x"])
def test_config_errors_exit_the_process_cleanly(tmp_path, override):
  workdir = tmp_path / "run"
  code, out, err = _run(str(workdir), override, timeout=120)
  assert code == 2, (code, err[-2000:])
  assert "Traceback" not in err and err.strip().startswith("Config error:") and err.strip().count("\n") == 0, err
  assert not workdir.exists()


def test_resuming_with_a_changed_config_names_the_keys_and_stops(tmp_path):
  workdir = tmp_path / "run"
  quick = ("--config.sft.steps=0", "--config.rl.steps=0")
  code, _, err = _run(str(workdir), *quick)
  assert code == 0, err[-3000:]
  before = sorted(os.listdir(workdir))
  code, _, err = _run(str(workdir), *quick, "--config.rl.kl_beta=0.1", "--config.seed=3", timeout=120)
  assert code == 2 and "changed keys: rl.kl_beta, seed" in err, err[-2000:]
  assert sorted(os.listdir(workdir)) == before and '"kl_beta": 0.0' in (workdir / "config.json").read_text()
  code, _, err = _run(str(workdir), *quick, "--config.rl.kl_beta=0.1", "--allow_config_change")
  assert code == 0, err[-3000:]
  assert '"kl_beta": 0.1' in (workdir / "config.json").read_text()


# RL runs longer than the preset so the kill lands mid-stage with several steps left.
# SFT, then RL with stage state beyond the policy: the critic (its own optimizer) and calibrated IS's mismatch
# scale, under simulated engine noise (the sampler's noise stream must resume too). Everything the plain GRPO
# run resumes is resumed here as well.
RESUME = ("--config.rl.steps=6", "--config.checkpoint.every=2", "--config.rl.advantage=gae",
          "--config.rl.correction.name=calibrated", "--config.rl.rollout_mismatch.noise_scale=0.5")
# The asynchronous collector's workers hold partial rollouts across policy versions and a prefetched batch: the
# checkpoint keeps them (its iterator state), so the learner killed mid-stage resumes to the same samples.
RESUME_ASYNC = ("--config.rl.steps=6", "--config.checkpoint.every=2", "--config.rl.collector=async",
                "--config.rl.async_rollout.max_staleness=1", "--config.rl.async_rollout.prefetch=1",
                "--config.rl.async_rollout.chunk_tokens=2")


# An embodied run (configs/embodied.py: flow_bc, then flow_rl with ReinFlow's chain): the environments' states and
# the critic are part of the checkpoint.
EMBODIED = os.path.join(ROOT, "configs", "embodied.py") + ":test"
RESUME_EMBODIED = ("--config.rl.steps=6", "--config.checkpoint.every=2")


@pytest.mark.parametrize("config,args,first,metric", [
    (TEST_CONFIG, RESUME, "sft", "eval/accuracy"),
    # The learner killed while the async collector's workers hold buffered partial rollouts (issue: "resume after
    # SIGKILL of the learner loses no buffered rollout"); ~30 s on 2 cores, so in the default run.
    (TEST_CONFIG, RESUME_ASYNC, "sft", "eval/accuracy"),
    (EMBODIED, RESUME_EMBODIED, "bc", "eval/success")], ids=["gae_calibrated", "async_collector", "embodied"])
def test_sigkill_and_resume_equals_uninterrupted_run(tmp_path, config, args, first, metric):
  ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
  code, _, err = _run(str(ref_dir), *args, config=config)
  assert code == 0, err[-3000:]
  reference = read_metrics(str(ref_dir / "metrics.jsonl"))
  assert (ref_dir / "config.json").exists() and (ref_dir / "metrics.png").exists()
  assert any(metric in r and r["stage"] == first for r in reference)
  assert any(metric in r and r["stage"] == "rl" for r in reference)
  assert all(0.0 <= r[metric] <= 1.0 for r in reference if metric in r)

  proc = _launch(str(cut_dir), *args, config=config)
  target = cut_dir / "checkpoints" / "8"          # 4 SFT (BC) steps + 4 of the 6 RL steps
  deadline = time.time() + 300
  while not target.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  assert target.exists(), "the run ended or timed out before the checkpoint to interrupt after"
  partial = read_metrics(str(cut_dir / "metrics.jsonl"))
  assert max(r["step"] for r in partial) < max(r["step"] for r in reference)

  code, _, err = _run(str(cut_dir), *args, config=config)
  assert code == 0, err[-3000:]
  resumed = read_metrics(str(cut_dir / "metrics.jsonl"))
  assert without_timings(resumed) == without_timings(reference)


def test_half_written_checkpoint_never_replaces_the_good_one(tmp_path):
  import numpy as np
  ckpt = Checkpointer(str(tmp_path / "ckpt"), every=1)
  ckpt.save(2, {"w": np.arange(4.0)}, {"stage_step": 2})
  # What an interrupted Orbax save leaves behind: a temporary folder that was never renamed into place.
  partial = tmp_path / "ckpt" / "4.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_text("half written")
  ckpt.close()
  again = Checkpointer(str(tmp_path / "ckpt"), every=1)
  assert again.latest_step() == 2
  state, meta = again.restore(2, {"w": np.zeros(4)})
  np.testing.assert_array_equal(state["w"], np.arange(4.0))
  assert meta["stage_step"] == 2


def test_the_last_checkpoint_of_each_stage_survives_max_to_keep(tmp_path):
  import numpy as np
  ckpt = Checkpointer(str(tmp_path / "ckpt"), every=1, max_to_keep=2)
  for step in range(1, 6):                     # stage one ends at step 3
    ckpt.save(step, {"w": np.full(2, float(step))}, {"stage_step": step, "done": step == 3})
  assert ckpt.all_steps() == [3, 4, 5]
  ckpt.close()
  again = Checkpointer(str(tmp_path / "ckpt"), every=1, max_to_keep=2)   # the kept set is found on reopening
  for step in range(6, 9):
    again.save(step, {"w": np.full(2, float(step))}, {"stage_step": step, "done": False})
  assert again.all_steps() == [3, 7, 8]
  state, meta = again.restore(3, {"w": np.zeros(2)})
  np.testing.assert_array_equal(state["w"], [3.0, 3.0])
  assert meta["done"]
