"""The README's main job end to end: RL must lift held-out greedy accuracy over the SFT checkpoint.

`test_main_job_seed_0_improves_on_sft` runs the README's command literally (slow: 2 to 6 minutes), as
experiments/grpo_arith/results.md records for seed 0 (+29.0 points in the archived run; five seeds +26.8 to +36.6).
`test_ci_preset_rl_improves_on_sft` checks the same claim in about a minute on every test run, with the `ci`
preset of configs/grpo_arith.py (two seeds).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _final_accuracies(workdir, *flags, env=(), timeout):
  """{stage: held-out greedy accuracy of its last evaluation} of `python launch.py *flags --workdir=...`."""
  proc = subprocess.run([sys.executable, "launch.py", *flags, f"--workdir={workdir}"], cwd=ROOT,
                        env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", **dict(env)),
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return {r["stage"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}


@pytest.mark.slow
def test_main_job_seed_0_improves_on_sft(tmp_path):
  final = _final_accuracies(tmp_path, "--config=configs/grpo_arith.py", "--config.wandb.mode=disabled", timeout=1800)
  assert final["rl"] - final["sft"] >= 0.15, final   # the smallest gain of the five recorded seeds is +17
  assert (tmp_path / "metrics.png").stat().st_size > 10_000


def test_ci_preset_rl_improves_on_sft(tmp_path):
  """`configs/grpo_arith.py:ci`, seeds 0 and 1: RL gains on average at least 5 points of held-out greedy accuracy
  over the SFT checkpoint, and each seed gains, on 256 held-out prompts (one prompt is 0.4 points).

  Measured (JAX_DISABLE_MOST_OPTIMIZATIONS=1, as here), on an AMD EPYC: seed 0 SFT 0.195 -> RL 0.312, +11.7
  points (every 30 iterations: +5.9, +8.6, +12.1, +11.7; with rl.optimizer.lr 3e-4 +10.6), seeds 1-4 +5.4, +6.7,
  +16.1, +13.3; 41 s wall and 56 s CPU a command on the 2-core box. On an Intel Xeon (session 26): seeds 0-4
  +4.7, +6.3, +3.5, +9.0, +7.4 (seed 0: SFT 0.148 -> RL 0.195, the same at the commit before that session's
  changes). With XLA's optimizations on (EPYC), seed 0 gains only +2.0 (seeds 1-4: +5.9, +6.3, +3.5, +5.5). RL's
  sampled trajectory follows the last bits of the arithmetic, so a CPU whose compiled code rounds differently is
  in effect another draw of that spread: one seed's gain moved from +11.7 to +4.7 between two CPUs, so the test
  reads two seeds' mean (EPYC +8.6, Xeon +5.5). Check the sign and those seeds before suspecting the trainer if
  this fails on new hardware.
  """
  gains = {}
  for seed in (0, 1):
    final = _final_accuracies(tmp_path / f"s{seed}", "--config=configs/grpo_arith.py:ci", f"--config.seed={seed}",
                              env={"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}, timeout=600)
    gains[seed] = final["rl"] - final["sft"]
    print(f"seed {seed}: held-out greedy accuracy SFT {final['sft']:.3f}, RL {final['rl']:.3f}")
  assert all(g > 0 for g in gains.values()) and sum(gains.values()) / len(gains) >= 0.05, gains
