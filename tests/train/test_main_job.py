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
  """`configs/grpo_arith.py:ci`, seeds 0 and 1: RL gains on average at least 2 points of held-out greedy accuracy
  over the SFT checkpoint, on 256 held-out prompts a seed (10 of the 512 prompt evaluations). A no-op RL stage
  gains exactly 0 (greedy evaluation of the same weights), a sign error loses accuracy: either fails.

  RL's sampled trajectory follows the last bits of the arithmetic, so each CPU is in effect another draw of the
  gains' spread. Measured (JAX_DISABLE_MOST_OPTIMIZATIONS=1, as here), seeds 0-4, points:
    AMD EPYC (earlier sessions): +11.7, +5.4, +6.7, +16.1, +13.3   (seed 0: SFT 0.195 -> RL 0.312)
    Intel Xeon (session 26):     +4.7, +6.3, +3.5, +9.0, +7.4      (seed 0: SFT 0.148 -> RL 0.195)
    AMD EPYC without AVX2 (5 Dec 2026): +4.7, +0.8, +1.6, +3.5, +10.5 (seed 0: SFT 0.152 -> RL 0.199; the same at
      commit 8e95933, where the first row was measured: the CPU, not the code); with 240 iterations instead of
      120 they plateau at +4.7, +5.5, +4.3, +4.3, +11.3.
  Every one of the 15 gains is positive; the two-seed means are +8.6, +5.5 and +2.7 (the earlier bound, 5 points,
  failed on the third CPU). With XLA's optimizations on (first EPYC), seed 0 gains only +2.0. The README's own
  command (test_main_job_seed_0_improves_on_sft, slow) checks the real claim, >= 15 points.
  """
  gains = {}
  for seed in (0, 1):
    final = _final_accuracies(tmp_path / f"s{seed}", "--config=configs/grpo_arith.py:ci", f"--config.seed={seed}",
                              env={"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}, timeout=600)
    gains[seed] = final["rl"] - final["sft"]
    print(f"seed {seed}: held-out greedy accuracy SFT {final['sft']:.3f}, RL {final['rl']:.3f}")
  assert sum(gains.values()) / len(gains) >= 0.02, gains
