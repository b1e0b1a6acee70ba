"""Gradient error of off-policy corrections under a persistent engine mismatch, from the pretrained base: the
sampler on its own bf16, fp8 or FP4 weight copy (rl.sync) against the float32 master the trainer scores with
(calibrated IS: OUR DESIGN, methods/llm.md §9; the published rule: kzhao5/CIS-RL; the pre-registration, the
gate and the decision rules are README.md's).

  python experiments/calibrated_is/run.py --root=/tmp/calibrated_is              # gate, seeds 0-2, archive
  python experiments/calibrated_is/run.py --root=DIR --part=gate                 # the calibration gate only
  python experiments/calibrated_is/run.py --root=DIR --part=grad --seeds=1 [--copies=fp8]
  python experiments/calibrated_is/run.py --root=DIR --quick --model=PATH        # smoke sizes, no archive

Parts:
  gate  two launch.py runs of configs/calibrated_is.py (presets bf16 and fp8, seed 0, 3 GRPO iterations) into
        ROOT/gate_<copy>; mismatch_gate.py evaluates their metrics (capability; the trainer's mismatch/mean per
        copy) and experiments/gate.py records the outcome in ROOT/gate.json. The arms run only on the copies
        that pass; when none does, the driver stops here, saying so (exit status GATE_FAILED, 2).
  grad  per seed: g* (the uncorrected estimator on the master's own rollouts, M batches), then, per copy that
        passed the gate, W warm-up batches (calibrated's sigma) and K measured batches, every arm's gradient on
        the same batch. One JSON line per measurement in ROOT/results.jsonl (summarize.py keeps the last line of
        each key, so a rerun part replaces its rows); g* is cached in ROOT/target_s<seed>.npy.
After each part the driver archives what summarize.py reads into --archive (experiments/calibrated_is/runs;
off for --quick): the gate runs' workdirs cut to mismatch_gate.KEYS, gate.json and results.jsonl
(experiments/gate.py's archive_with_gate).

The estimator is the trainer's own, phase by phase: collect (from the copy), the verifier reward, train_batch +
score (old_logp: the float32 master's log-probs), the correction's apply, GRPO group advantages, and the gradient
of `make_rl_loss` (PPO-clip at ratio 1, times the stop-gradient weights, token-mean over loss_mask & keep). Every
random draw derives from the seed: prompts and sampler keys are the same for both copies (paired), and a part
gives the same lines when rerun.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.calibrated_is import ARMS, BASE, COPIES, get_config  # noqa: E402
from experiments.calibrated_is import mismatch_gate  # noqa: E402
from experiments.driver import launch  # noqa: E402
from experiments.gate import GATE_FAILED, archive_with_gate, read_gate, record_gate  # noqa: E402

SIZES = {   # measured batches K per copy, g* batches M, calibrated's warm-up batches W, seeds
    "full": dict(batches=40, target_batches=256, warmup=4, seeds=(0, 1, 2)),
    "quick": dict(batches=3, target_batches=4, warmup=1, seeds=(0,)),
}
PROMPT_LEN = 9           # BOS + "999-999=": byte-level BPE never splits a character, so no prompt is longer
ARCHIVE = os.path.join("experiments", "calibrated_is", "runs")


class Log:
  def __init__(self, root: str):
    self.path = os.path.join(root, "results.jsonl")

  def __call__(self, **row):
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------------------------ gate

def part_gate(root: str, model: str, lock: str = "") -> dict:
  """The gate's runs (skipped when finished) and its outcome, recorded in ROOT/gate.json and printed."""
  rows = {}
  for copy in COPIES:
    path = os.path.join(root, f"gate_{copy}")
    rc = launch(root, path, f"configs/calibrated_is.py:{copy}", ["--config.seed=0", f"--config.model.path={model}"],
                lock, False, "calibrated_is", name=f"gate_{copy}", seed=0)
    if rc:
      raise SystemExit(f"gate: the run of the {copy} copy failed (exit {rc}); see {path}")
    rows[copy] = mismatch_gate.read_rows(path)
  outcome = mismatch_gate.evaluate(rows)
  with open(os.path.join(model, "model.safetensors"), "rb") as f:   # which base the gate and the arms measured
    base = {"path": model, "model_safetensors_sha256": hashlib.sha256(f.read()).hexdigest()}
  record_gate(root, "calibrated_is", mismatch_gate.checks(outcome), passed=outcome["passed"],
              arms_copies=outcome["arms_copies"], copies=outcome["copies"], capability=outcome["capability"],
              rule=outcome["rule"], base=base)
  print(f"[calibrated_is] the arms run on: {', '.join(outcome['arms_copies']) or 'no copy'}", flush=True)
  return read_gate(root)


# ------------------------------------------------------------------------------------------------ gradients

class Env:
  """The master, its sampler copies, the trainer's pieces (sampling, scorer, reward, loss) and the jitted
  per-arm gradient."""

  def __init__(self, model: str, sizes: dict):
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    from rlkit.data.tasks import make_task
    from rlkit.rewards import REWARDS, VerifierExecutor
    from rlkit.rollout.scoring import make_scorer
    from rlkit.train.models import load_model
    from rlkit.train.phases.collect import sampling_config
    from rlkit.train.steps import default_step_inputs, make_rl_loss, rl_counts

    self.model, self.params, self.tok = load_model(model, dtype="float32", param_dtype="float32")
    c = get_config(COPIES[0])       # the presets differ in rl.sync.quantizer only
    self.cfg, self.sizes = c.rl, sizes
    self.task = make_task(c.task.name, **c.task.kwargs.to_dict())
    self.sampling = sampling_config(self.cfg, self.tok)
    self.scorer = make_scorer(self.model, self.sampling)
    self.executor = VerifierExecutor(timeout_s=0.0)   # inline: the arithmetic verifier cannot hang
    self.reward_fn = REWARDS.get(self.cfg.reward.name)(self.task, self.executor)
    loss_fn = make_rl_loss(self.model, self.cfg, self.sampling)
    step_inputs = default_step_inputs(self.cfg)

    def one_arm(params, batch, weights, keep):
      b = batch.replace(token_weights=weights, loss_mask=keep)
      inputs = dict(step_inputs, **rl_counts(b))
      return ravel_pytree(jax.grad(lambda p: loss_fn(p, b, inputs)[0])(params))[0]

    # Arms differ only in (weights, keep): one vmapped gradient over the stacked arms.
    self.grads = jax.jit(jax.vmap(one_arm, in_axes=(None, None, 0, 0)))
    self.jnp = jnp

  def sampler(self, copy: str):
    """(module, params) of the sampler's copy `copy`, made as rl.sync makes it (weight_sync.build + start)."""
    from rlkit.train import weight_sync
    c = get_config(copy)
    sync = weight_sync.build(c.rl.sync, self.params, self.model, c.model.lora)
    return sync.model, weight_sync.start(sync, self.params).params

  def batch(self, sampler, seed: int, stream: int, index: int):
    """(scored TrainBatch with group advantages, rewards [N]) of one batch sampled by `sampler` (module,
    params). Prompts and the sampling key depend on (seed, stream, index) only."""
    import jax
    from rlkit.data.pipeline import prompt_batch
    from rlkit.train.phases.advantages import with_advantages
    from rlkit.train.phases.collect import collect
    from rlkit.train.phases.reward import compute_rewards
    from rlkit.train.phases.score import score, train_batch

    rng = np.random.default_rng([seed, stream, index])
    records = [self.task.make_example(rng) for _ in range(self.cfg.prompts_per_step)]
    prompts = prompt_batch(records, self.tok, PROMPT_LEN)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), stream), index)
    put = lambda d: {k: self.jnp.asarray(v) for k, v in d.items()}  # noqa: E731  one process, one device
    samples = collect(sampler[0], sampler[1], prompts, key, self.sampling, self.cfg.group_size, put)
    rewards = compute_rewards(self.reward_fn, samples, self.tok, self.cfg)
    batch = score(train_batch(samples, None, put), {"policy": (self.scorer, self.params)})
    # Group advantages do not read the loss mask: computed before the corrections (the trainer corrects first),
    # they are the same numbers.
    return with_advantages(batch, rewards, self.cfg, self.cfg.group_size, put), rewards.rewards


def batch_stats(batch, rewards, group_size: int) -> dict:
  """The mismatch of one batch, as the trainer measures it (|old_logp - rollout_logp| over the policy's response
  tokens, and split by the trainer's p: > 0.9, < 0.3), its k3 KL estimate, reward and informative groups."""
  m = np.asarray(batch.loss_mask)
  lr = np.asarray(batch.old_logp, np.float64) - np.asarray(batch.rollout_logp, np.float64)
  p = np.exp(np.asarray(batch.old_logp, np.float64))
  conf, unconf = m & (p > 0.9), m & (p < 0.3)
  mean = lambda x, mask: float(x[mask].mean()) if mask.any() else float("nan")  # noqa: E731
  r = np.asarray(rewards).reshape(-1, group_size)
  return {"lr_abs": mean(np.abs(lr), m), "lr_abs_conf": mean(np.abs(lr), conf),
          "lr_abs_unconf": mean(np.abs(lr), unconf), "k3_kl": mean(np.expm1(lr) - lr, m),
          "frac_conf": float(conf.sum() / max(m.sum(), 1)), "frac_unconf": float(unconf.sum() / max(m.sum(), 1)),
          "reward": float(r.mean()), "informative": float((r.std(axis=1) > 0).mean())}


def compare(g: np.ndarray, target: np.ndarray) -> dict:
  g, target = g.astype(np.float64), target.astype(np.float64)
  norm2, gn = float(target @ target), float(np.linalg.norm(g))
  cos = float(g @ target) / (gn * np.sqrt(norm2)) if gn > 0 else 0.0
  return {"cos": cos, "nmse": float(np.sum((g - target) ** 2)) / norm2, "g_norm_rel": gn / np.sqrt(norm2)}


def target_gradient(env: Env, seed: int, root: str, log: Log) -> np.ndarray:
  """g*: the uncorrected estimator on the master's own rollouts, mean of M batches (cached per seed)."""
  path = os.path.join(root, f"target_s{seed}.npy")
  if os.path.exists(path):
    return np.load(path)
  t0, m = time.time(), env.sizes["target_batches"]
  master, ones, halves, stats = (env.model, env.params), None, [0.0, 0.0], []
  for b in range(m):
    batch, r = env.batch(master, seed, 1, b)
    if ones is None:
      ones = (env.jnp.ones((1,) + batch.loss_mask.shape, env.jnp.float32), batch.loss_mask[None])
    halves[b % 2] = halves[b % 2] + np.asarray(env.grads(env.params, batch, *ones)[0], np.float64)
    stats.append(batch_stats(batch, r, env.cfg.group_size))
  h1, h2 = halves[0] / (m // 2), halves[1] / (m - m // 2)
  target = (halves[0] + halves[1]) / m
  norm2 = float(target @ target)
  if norm2 == 0:
    raise SystemExit(f"g* of seed {seed} is 0: no group of its {m} batches had rewards that differ (mean reward "
                     f"{np.mean([s['reward'] for s in stats]):.3f}); the capability gate exists to catch this.")
  log(type="target", key=f"target/{seed}", seed=seed, batches=m, rows_per_batch=env.cfg.prompts_per_step *
      env.cfg.group_size, half_cos=float(h1 @ h2 / np.sqrt((h1 @ h1) * (h2 @ h2))),
      floor_nmse=float(np.sum((h1 - h2) ** 2)) / (4 * norm2), norm=float(np.sqrt(norm2)),
      reward=float(np.mean([s["reward"] for s in stats])),
      informative=float(np.mean([s["informative"] for s in stats])),
      lr_abs=float(np.mean([s["lr_abs"] for s in stats])), wall_s=time.time() - t0)
  np.save(path, target.astype(np.float32))
  return target.astype(np.float32)


def arm_specs() -> dict:
  """{arm: (its correction, its rl.correction fields)} (configs/calibrated_is.py ARMS over rlkit's defaults)."""
  from rlkit.objectives.correction import CORRECTIONS, correction_defaults
  specs = {}
  for arm, fields in ARMS.items():
    cfg = correction_defaults()
    cfg.update(fields)
    specs[arm] = (CORRECTIONS.get(cfg.name), cfg)
  return specs


def arm_inputs(env: Env, batch, outs: dict) -> tuple:
  """(token weights [arms, ...], kept tokens [arms, ...]) of every arm's correction output `outs`, stacked in
  ARMS order for `env.grads`."""
  return (env.jnp.stack([batch.token_weights * outs[a].weights for a in ARMS]),
          env.jnp.stack([batch.loss_mask & outs[a].keep for a in ARMS]))


def part_grad(root: str, model: str, seed: int, sizes: dict, copies) -> None:
  env, log = Env(model, sizes), Log(root)
  target = target_gradient(env, seed, root, log)
  specs = arm_specs()
  for copy in copies:
    t0 = time.time()
    sampler = env.sampler(copy)
    states = {a: spec.init(cfg) for a, (spec, cfg) in specs.items()}
    for w in range(sizes["warmup"]):          # calibrated's sigma, warmed as the trainer's first iterations
      batch, _ = env.batch(sampler, seed, 3, w)
      for a, (spec, cfg) in specs.items():
        if states[a]:
          states[a] = spec.apply(batch, cfg, states[a]).state
    sums = {a: 0.0 for a in ARMS}
    for b in range(sizes["batches"]):
      batch, rewards = env.batch(sampler, seed, 2, b)
      outs = {}
      for a, (spec, cfg) in specs.items():
        outs[a] = spec.apply(batch, cfg, states[a])
        states[a] = outs[a].state
      weights, keep = arm_inputs(env, batch, outs)
      grads = np.asarray(env.grads(env.params, batch, weights, keep))
      log(type="batch", key=f"batch/{seed}/{copy}/{b}", seed=seed, copy=copy, batch=b,
          **batch_stats(batch, rewards, env.cfg.group_size))
      for i, a in enumerate(ARMS):
        m = outs[a].metrics
        kept = int(np.asarray(keep[i]).sum())
        sums[a] = sums[a] + grads[i].astype(np.float64)
        log(type="grad", key=f"grad/{seed}/{copy}/{a}/{b}", seed=seed, copy=copy, arm=a, batch=b,
            **compare(grads[i], target), kept_tokens=kept, empty=kept == 0,
            ess=m.get("rollout_corr/rollout_is_eff_sample_size", 1.0),
            masked_frac=m.get("rollout_corr/rollout_rs_masked_fraction", 0.0),
            truncated_frac=m.get("rollout_corr/rollout_is_ratio_fraction_high", 0.0),
            weight_mean=m.get("rollout_corr/weight_mean", 1.0), sigma=m.get("rollout_corr/sigma"))
    for a in ARMS:
      log(type="mean_grad", key=f"mean_grad/{seed}/{copy}/{a}", seed=seed, copy=copy, arm=a,
          batches=sizes["batches"], **compare((sums[a] / sizes["batches"]).astype(np.float32), target))
    print(f"seed {seed} {copy}: {time.time() - t0:.1f}s", flush=True)
  env.executor.close()


# ------------------------------------------------------------------------------------------------ driver

def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", required=True, help="the run's folder: gate workdirs, gate.json, results.jsonl")
  p.add_argument("--model", default=BASE, help="the base (a Hugging Face folder); a tiny stand-in for smoke runs")
  p.add_argument("--part", default="all", choices=("all", "gate", "grad"))
  p.add_argument("--seeds", default="", help="grad: comma-separated seeds (default: the sizes' seeds)")
  p.add_argument("--copies", default="", help="grad: comma-separated copies among those that passed the gate")
  p.add_argument("--quick", action="store_true", help="smoke sizes (seed 0; its verdicts read 'smoke run')")
  p.add_argument("--archive", default=None, help=f"where to archive (default {ARCHIVE}; '' or --quick: nowhere)")
  p.add_argument("--lock", default="", help="run the gate's launch.py under `flock LOCK`")
  a = p.parse_args(argv)
  a.root = os.path.abspath(a.root)
  os.chdir(ROOT)      # launch.py's, the model's and the archive's relative paths are the repository's
  sizes = SIZES["quick" if a.quick else "full"]
  dest = ("" if a.quick else ARCHIVE) if a.archive is None else a.archive
  os.makedirs(a.root, exist_ok=True)
  t0 = time.time()
  status = 0
  outcome = part_gate(a.root, a.model, a.lock) if a.part in ("all", "gate") else read_gate(a.root)
  if a.part in ("all", "grad"):
    if outcome is None:
      raise SystemExit(f"{a.root} has no gate.json: run --part=gate first (README: the gate runs before the arms)")
    chosen = [c for c in a.copies.split(",") if c] or outcome["arms_copies"]
    refused = [c for c in chosen if c not in outcome["arms_copies"]]
    if not outcome["passed"] or refused:
      print(f"STOP: the calibration gate {'failed' if not outcome['passed'] else 'refused ' + ', '.join(refused)};"
            " the arms do not run (README: report the gate and stop).", flush=True)
      status = GATE_FAILED
    else:
      for seed in ([int(s) for s in a.seeds.split(",")] if a.seeds else sizes["seeds"]):
        part_grad(a.root, a.model, seed, sizes, chosen)
  Log(a.root)(type="wall", key=f"wall/{a.part}/{a.seeds}/{a.copies}/{time.time():.0f}", part=a.part, seeds=a.seeds,
              quick=a.quick, wall_s=time.time() - t0)
  if dest:
    names = archive_with_gate(a.root, dest, mismatch_gate.KEYS, files=("results.jsonl",))
    print(f"[calibrated_is] archived {a.root} into {dest} ({len(names)} new workdir(s))", flush=True)
  print(f"done in {time.time() - t0:.0f}s: {os.path.join(a.root, 'results.jsonl')}")
  return status


if __name__ == "__main__":
  sys.exit(main())
