"""Multi-host for real: two processes on localhost (`jax.distributed`, CPU collectives over gloo) run the
`test` preset and log exactly the metrics of one process over two devices (`mesh.cpu_devices=2`, which
splits the host and the batch); only process 0 writes them."""
import os
import socket
import subprocess
import sys

from rlkit.train.metrics import read_metrics, without_timings
from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "grpo_arith.py") + ":test"
# Rewards with variance (the format bonus), a KL reference and two minibatches: every phase does real work.
OVERRIDES = ("--config.rl.reward.name=verifier_format", "--config.rl.kl_beta=0.1", "--config.rl.minibatches=2",
             "--config.rl.steps=2", "--config.sft.steps=2")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cmd(workdir, *extra):
  return [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={CONFIG}", f"--workdir={workdir}",
          *OVERRIDES, *extra]


def _env(**kw):
  # XLA's optimisation passes off (compiling is most of these short runs): both sides alike, so the
  # comparison is unchanged.
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  env.pop("RLKIT_DISTRIBUTED", None)
  env.update(kw)
  return env


def test_two_processes_equal_one_process_over_two_devices(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  port = _free_port()
  procs = [subprocess.Popen(_cmd(two), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                     JAX_PROCESS_ID=str(i)))
           for i in range(2)]
  outs = [p.communicate(timeout=400)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  assert "in 2 processes" in outs[0]
  single = subprocess.run(_cmd(one, "--config.mesh.cpu_devices=2"), cwd=ROOT, capture_output=True, text=True,
                          env=_env(), timeout=400)
  assert single.returncode == 0, single.stderr[-3000:]
  assert "mesh {'data': 2, 'fsdp': 1, 'tensor': 1} over 2 cpu device(s)\n" in single.stdout
  reference = without_timings(read_metrics(str(one / "metrics.jsonl")))
  rows = without_timings(read_metrics(str(two / "metrics.jsonl")))
  assert any(r["stage"] == "rl" and r.get("reward", 0) > 0 for r in reference), "rewards must vary"
  assert any("eval/accuracy" in r for r in reference)
  assert rows == reference
  # Process 1 wrote no metrics of its own and started no wandb; both saved the checkpoints together.
  assert sorted(os.listdir(two / "checkpoints")) == sorted(os.listdir(one / "checkpoints"))
