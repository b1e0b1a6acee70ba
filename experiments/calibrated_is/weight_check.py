"""A check run after amendment 2's arms (not pre-registered): how far does each arm's gradient move from the
uncorrected one on one batch, against how far its weights are from 1? With the master itself as the sampler
every weight is 1 and every arm's gradient must equal `none`'s (the harness adds nothing of its own); with a
copy, the relative change of the gradient shows how strongly per-token weights near 1 act on it.

  python experiments/calibrated_is/weight_check.py              # seed 0, batch 0 of stream 2 (the arms' first)

Prints one line per (sampler, arm): the mean |log rho| of the batch, the arm's weight range on the policy's
tokens, and ||g_arm - g_none|| / ||g_none||.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.calibrated_is import ARMS, BASE  # noqa: E402
from experiments.calibrated_is import run  # noqa: E402

SAMPLERS = ("master", "bf16", "nvfp4_w4a4", "mxfp4_w4a4")


def main() -> None:
  env, specs = run.Env(BASE, run.SIZES["quick"]), run.arm_specs()
  print("| sampler | mean abs log rho | arm | weights, min-max | gradient change vs none |\n|---|---|---|---|---|")
  for name in SAMPLERS:
    sampler = (env.model, env.params) if name == "master" else env.sampler(name)
    batch, _ = env.batch(sampler, 0, 2, 0)
    outs = {a: spec.apply(batch, cfg, spec.init(cfg)) for a, (spec, cfg) in specs.items()}
    weights, keep = run.arm_inputs(env, batch, outs)
    g = np.asarray(env.grads(env.params, batch, weights, keep), np.float64)
    mask = np.asarray(batch.loss_mask)
    lr = np.abs(np.asarray(batch.old_logp, np.float64) - np.asarray(batch.rollout_logp, np.float64))[mask].mean()
    none = g[list(ARMS).index("none")]
    for i, arm in enumerate(ARMS):
      w = np.asarray(weights[i])[mask & np.asarray(keep[i])]
      change = np.linalg.norm(g[i] - none) / np.linalg.norm(none)
      print(f"| {name} | {lr:.4f} | {arm} | {w.min():.3f}-{w.max():.3f} | {change:.3f} |")
  env.executor.close()


if __name__ == "__main__":
  main()
