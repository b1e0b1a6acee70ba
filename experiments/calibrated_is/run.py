"""Gradient error of off-policy corrections under a simulated inference-engine mismatch (calibrated IS, OUR
DESIGN, methods/llm.md §9; the pre-registered claim and its decision rules are in README.md).

  python experiments/calibrated_is/run.py --workdir=/tmp/calibrated_is            # all parts, seeds 0-2
  python experiments/calibrated_is/run.py --workdir=/tmp/calibrated_is --quick    # ~2 minutes, seed 0
  python experiments/calibrated_is/run.py --workdir=DIR --part=sft|grad|curves|diagnose [--seed=S] [--settings=...]

Parts: `sft` trains the policy (the SFT stage of configs/grpo_arith.py, through launch.py) into DIR/sft;
`grad` measures, for one seed, the target gradient g* (unperturbed rollouts, no correction, M batches) and
then, per engine setting and batch, every arm's corrected gradient g on the same perturbed batch; `curves`
runs short GRPO trainings per arm through launch.py; `diagnose` (post-hoc, not pre-registered) splits each
noise setting's mismatch into the shift of the sampling distribution and per-step noise in the reported
log-probs. Each measurement is one JSON line of DIR/results.jsonl (summarize.py keeps the last line of each
key, so a part can be rerun). Every random draw derives from --seed: a part gives the same lines when rerun.

The estimator is the trainer's own, phase by phase: collect (the perturbed sampler), verifier reward,
train_batch + score (old_logp = the trainer's log-probs), the correction's apply, GRPO group advantages, and
the gradient of `make_rl_loss` (PPO-clip at ratio 1, times the stop-gradient weights, token-mean over
loss_mask & keep).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from rlkit.data.pipeline import prompt_batch  # noqa: E402
from rlkit.data.tasks import make_task  # noqa: E402
from rlkit.objectives.correction import CORRECTIONS, correction_defaults  # noqa: E402
from rlkit.rewards import REWARDS, VerifierExecutor  # noqa: E402
from rlkit.rollout.mismatch import Mismatch, sampling_model  # noqa: E402
from rlkit.rollout.sampler import processed_logprobs  # noqa: E402
from rlkit.rollout.scoring import make_scorer, response_forward  # noqa: E402
from rlkit.train.rl_config import rl_defaults  # noqa: E402
from rlkit.train.models import load_model  # noqa: E402
from rlkit.train.phases.advantages import with_advantages  # noqa: E402
from rlkit.train.phases.collect import collect  # noqa: E402
from rlkit.train.phases.reward import compute_rewards  # noqa: E402
from rlkit.train.phases.score import score, train_batch  # noqa: E402
from rlkit.train.phases.collect import sampling_config  # noqa: E402
from rlkit.train.steps import default_step_inputs, make_rl_loss, rl_counts  # noqa: E402

# The arms, pre-registered in README.md: library defaults or the peers' presets, never tuned here.
ARMS = {
    "none": {"name": "none"},
    "token_tis": {"name": "rollout_correction", "rollout_is": "token", "rollout_is_threshold": "2.0"},
    "seq_tis": {"name": "rollout_correction", "rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "seq_mis": {"name": "rollout_correction", "rollout_is": "sequence", "rollout_is_threshold": "2.0",
                "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "2.0"},     # verl decoupled_seq_is_rs()
    "geo_mis": {"name": "rollout_correction", "rollout_rs": "seq_mean_k1",
                "rollout_rs_threshold": "0.999_1.001",                           # verl decoupled_geo_rs()
                # the bounds as measured (on r; verl 0.9.1 bounds 1/r, which differs for asymmetric bounds)
                "rollout_rs_k1_bounds": "ratio"},
    "icepop": {"name": "icepop"},
    "calibrated": {"name": "calibrated"},
}
# (kind, noise scale): kind is the noise kind, or on_policy / bf16 (no noise, sampler in bfloat16).
SETTINGS = [("on_policy", 0.0)] + [(k, s) for k in ("uniform", "tail") for s in (0.1, 0.3, 1.0)] + [("bf16", 0.0)]
CURVE_SETTINGS = [("uniform", 1.0), ("tail", 1.0)]
SIZES = {   # prompts x group rows per batch, perturbed batches K, g* batches M, calibrated warm-up W, RL steps
    "full": dict(prompts=16, group=8, batches=20, target_batches=256, warmup=4, rl_steps=30, seeds=(0, 1, 2)),
    "quick": dict(prompts=16, group=8, batches=4, target_batches=32, warmup=2, rl_steps=0, seeds=(0,)),
}
SFT_CONFIG = "configs/grpo_arith.py"
MAX_PROMPT_LEN = 8
MAX_NEW_TOKENS = 5


def mismatch_of(kind: str, scale: float) -> Mismatch:
  if kind == "on_policy":
    return Mismatch()
  if kind == "bf16":
    return Mismatch(dtype="bfloat16")
  return Mismatch(noise_scale=scale, noise_kind=kind)


def correction_cfg(arm: str):
  c = correction_defaults()
  c.update(ARMS[arm])
  return c


class Env:
  """The policy, the trainer's pieces (sampling, scorer, reward, loss) and the jitted per-arm gradient."""

  def __init__(self, sft_dir: str, sizes: dict):
    self.model, self.params, self.tok = load_model(sft_dir)
    self.task = make_task("arithmetic", ops="+", min_digits=1, max_digits=2)
    self.cfg = rl_defaults()
    self.cfg.max_new_tokens, self.cfg.group_size = MAX_NEW_TOKENS, sizes["group"]
    self.cfg.aggregation = "token-mean"
    self.sampling = sampling_config(self.cfg, self.tok)
    self.scorer = make_scorer(self.model, self.sampling)
    self.executor = VerifierExecutor(timeout_s=0.0)   # inline: the arithmetic verifier cannot hang
    self.reward_fn = REWARDS.get("verifier")(self.task, self.executor)
    self.sizes = sizes
    loss_fn = make_rl_loss(self.model, self.cfg, self.sampling)
    step_inputs = default_step_inputs(self.cfg)

    def one_arm(params, batch, weights, keep):
      b = batch.replace(token_weights=weights, loss_mask=keep)
      inputs = dict(step_inputs, **rl_counts(b))
      grads = jax.grad(lambda p: loss_fn(p, b, inputs)[0])(params)
      return ravel_pytree(grads)[0]

    # Arms differ only in (weights, keep): one vmapped gradient over the stacked arms.
    self.grads = jax.jit(jax.vmap(one_arm, in_axes=(None, None, 0, 0)))

  def batch(self, mismatch: Mismatch, seed: int, stream: int, index: int):
    """(scored TrainBatch with group advantages, rewards [N]) of one batch from the engine `mismatch`."""
    rng = np.random.default_rng([seed, stream, index])
    records = [self.task.make_example(rng) for _ in range(self.sizes["prompts"])]
    prompts = prompt_batch(records, self.tok, MAX_PROMPT_LEN)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), stream), index)
    put = lambda d: {k: jnp.asarray(v) for k, v in d.items()}  # noqa: E731  one process, one device
    samples = collect(sampling_model(self.model, mismatch), self.params, prompts, key, self.sampling,
                      self.sizes["group"], put, perturb=mismatch.logits_hook(self.sampling))
    rewards = compute_rewards(self.reward_fn, samples, self.tok, self.cfg)
    batch = score(train_batch(samples, None, put), {"policy": (self.scorer, self.params)})
    # Group advantages do not read the loss mask, so computing them before the corrections (the trainer
    # corrects first) gives the same numbers.
    return with_advantages(batch, rewards, self.cfg, self.sizes["group"], put), rewards.rewards


def log_ratio_split(batch) -> dict:
  """Mean |log rho| over the policy tokens, all and split by the trainer's probability of the token."""
  m = np.asarray(batch.loss_mask)
  lr = np.abs(np.asarray(batch.old_logp) - np.asarray(batch.rollout_logp))
  p = np.exp(np.asarray(batch.old_logp))
  conf, unconf = m & (p > 0.9), m & (p < 0.3)
  mean = lambda mask: float(lr[mask].mean()) if mask.any() else float("nan")  # noqa: E731
  return {"lr_abs": mean(m), "lr_abs_conf": mean(conf), "lr_abs_unconf": mean(unconf),
          "frac_conf": float(conf.sum() / max(m.sum(), 1)), "frac_unconf": float(unconf.sum() / max(m.sum(), 1))}


def compare(g: np.ndarray, target: np.ndarray) -> dict:
  g, target = g.astype(np.float64), target.astype(np.float64)
  norm2, gn = float(target @ target), float(np.linalg.norm(g))
  cos = float(g @ target) / (gn * np.sqrt(norm2)) if gn > 0 else 0.0
  return {"cos": cos, "nmse": float(np.sum((g - target) ** 2)) / norm2, "g_norm_rel": gn / np.sqrt(norm2)}


class Log:
  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "results.jsonl")

  def __call__(self, **row):
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------------------------ parts

def part_sft(workdir: str) -> None:
  sft = os.path.join(workdir, "sft")
  if os.path.isdir(os.path.join(sft, "checkpoints")):
    print(f"sft: {sft} already has a checkpoint; reusing it")
    return
  t0 = time.time()
  with open(os.path.join(workdir, "sft.log"), "w") as out:
    subprocess.run([sys.executable, "launch.py", f"--config={SFT_CONFIG}", f"--workdir={sft}",
                    "--config.stages=('sft',)", "--config.seed=0", "--config.wandb.mode=disabled",
                    "--config.progress=False"], cwd=ROOT, check=True, stdout=out)
  rows = [json.loads(x) for x in open(os.path.join(sft, "metrics.jsonl"))]
  final = [r for r in rows if "eval/accuracy" in r][-1]
  Log(workdir)(type="sft", key="sft", step=final["step"], accuracy=final["eval/accuracy"],
               pass4=final.get("eval/pass@4"), wall_s=time.time() - t0)


def target_gradient(env: Env, seed: int, workdir: str, log: Log) -> np.ndarray:
  """g*: the uncorrected estimator on unperturbed rollouts, mean of M batches (cached per seed)."""
  path = os.path.join(workdir, f"target_s{seed}.npy")
  if os.path.exists(path):
    return np.load(path)
  t0 = time.time()
  m = env.sizes["target_batches"]
  ones = None
  halves, rewards = [0.0, 0.0], []
  for b in range(m):
    batch, r = env.batch(Mismatch(), seed, 1, b)
    if ones is None:
      ones = (jnp.ones((1,) + batch.loss_mask.shape, jnp.float32), batch.loss_mask[None])
    halves[b % 2] = halves[b % 2] + np.asarray(env.grads(env.params, batch, *ones)[0], np.float64)
    rewards.append(float(np.mean(r)))
  h1, h2 = halves[0] / (m // 2), halves[1] / (m - m // 2)
  target = (halves[0] + halves[1]) / m
  norm2 = float(target @ target)
  log(type="target", key=f"target/{seed}", seed=seed, batches=m, rows_per_batch=env.sizes["prompts"] *
      env.sizes["group"], half_cos=float(h1 @ h2 / np.sqrt((h1 @ h1) * (h2 @ h2))),
      floor_nmse=float(np.sum((h1 - h2) ** 2)) / (4 * norm2), norm=float(np.sqrt(norm2)),
      reward=float(np.mean(rewards)), wall_s=time.time() - t0)
  np.save(path, target.astype(np.float32))
  return target.astype(np.float32)


def part_grad(workdir: str, seed: int, sizes: dict, settings) -> None:
  env = Env(os.path.join(workdir, "sft"), sizes)
  log = Log(workdir)
  target = target_gradient(env, seed, workdir, log)
  specs = {a: (CORRECTIONS.get(ARMS[a]["name"]), correction_cfg(a)) for a in ARMS}
  for kind, scale in settings:
    t0 = time.time()
    engine = mismatch_of(kind, scale)
    states = {a: spec.init(cfg) for a, (spec, cfg) in specs.items()}
    for w in range(sizes["warmup"]):          # calibrated's sigma, warmed as the trainer's first iterations
      batch, _ = env.batch(engine, seed, 3, w)
      for a, (spec, cfg) in specs.items():
        if states[a]:
          states[a] = spec.apply(batch, cfg, states[a]).state
    sums = {a: 0.0 for a in ARMS}
    for b in range(sizes["batches"]):
      batch, rewards = env.batch(engine, seed, 2, b)
      outs = {}
      for a, (spec, cfg) in specs.items():
        outs[a] = spec.apply(batch, cfg, states[a])
        states[a] = outs[a].state
      weights = jnp.stack([batch.token_weights * outs[a].weights for a in ARMS])
      keep = jnp.stack([batch.loss_mask & outs[a].keep for a in ARMS])
      grads = np.asarray(env.grads(env.params, batch, weights, keep))
      split = log_ratio_split(batch)
      log(type="batch", key=f"batch/{seed}/{kind}/{scale}/{b}", seed=seed, kind=kind, scale=scale, batch=b,
          reward=float(np.mean(rewards)), **split)
      for i, a in enumerate(ARMS):
        m = outs[a].metrics
        kept = int(np.asarray(keep[i]).sum())
        sums[a] = sums[a] + grads[i].astype(np.float64)
        log(type="grad", key=f"grad/{seed}/{kind}/{scale}/{a}/{b}", seed=seed, kind=kind, scale=scale, arm=a,
            batch=b, **compare(grads[i], target), kept_tokens=kept, empty=kept == 0,
            ess=m.get("rollout_corr/rollout_is_eff_sample_size", 1.0),
            masked_frac=m.get("rollout_corr/rollout_rs_masked_fraction", 0.0),
            seq_masked_frac=m.get("rollout_corr/rollout_rs_seq_masked_fraction", 0.0),
            sigma=m.get("rollout_corr/sigma"), log_ratio_abs_mean=m.get("rollout_corr/log_ratio_abs_mean"))
    for a in ARMS:
      log(type="mean_grad", key=f"mean_grad/{seed}/{kind}/{scale}/{a}", seed=seed, kind=kind, scale=scale, arm=a,
          batches=sizes["batches"], **compare((sums[a] / sizes["batches"]).astype(np.float32), target))
    print(f"seed {seed} {kind} {scale}: {time.time() - t0:.1f}s", flush=True)
  env.executor.close()


def part_diagnose(workdir: str, sizes: dict, settings) -> None:
  """POST-HOC (not pre-registered): how much of a setting's mismatch shifts the distribution tokens are drawn
  from, and how much is per-step noise in the log-probs the engine reports.

  At every response position of a few on-policy batches (seed 0), with the trainer's processed distribution
  pi and Z noise draws of the engine's own `LogitNoise` (fresh per decode step, as in the sampler):
    realized  E_z sum_y q_z(y) |log pi(y) - log q_z(y)|    the |log rho| the corrections see (drawn from q_z)
    marginal  sum_y qbar(y) |log pi(y) - log qbar(y)|      qbar = E_z q_z: the per-step sampling distribution
  with KL(q_z || pi) and KL(qbar || pi) beside them. A correction built from q_z is exact importance sampling
  (the sampler does draw from q_z), but the samples' actual distribution is qbar: where marginal << realized,
  the uncorrected estimator is nearly unbiased and a correction mostly adds variance.
  """
  env = Env(os.path.join(workdir, "sft"), sizes)
  log = Log(workdir)
  draws, n_batches = 256, 2
  logits = []
  for b in range(n_batches):
    batch, _ = env.batch(Mismatch(), 0, 4, b)
    x, _ = response_forward(env.model, env.params, batch.tokens, batch.attention_mask, batch.response_len)
    logits.append(np.asarray(x)[np.asarray(batch.loss_mask)])
  x = jnp.asarray(np.concatenate(logits))                       # [positions, V] at the policy tokens
  logpi = processed_logprobs(x, env.sampling)
  for kind, scale in settings:
    engine = mismatch_of(kind, scale)
    hook = engine.logits_hook(env.sampling)
    if hook is None:
      continue
    keys = jax.random.split(jax.random.key(17), draws)
    logq = jax.vmap(lambda k: processed_logprobs(hook(x, k), env.sampling))(keys)   # [Z, positions, V]
    q = jnp.exp(logq)
    qbar = q.mean(0)
    logqbar = jnp.log(jnp.maximum(qbar, 1e-30))
    ok = jnp.isfinite(logpi)
    diff = lambda a, b: jnp.where(ok, jnp.abs(a - b), 0.0)  # noqa: E731
    kl = lambda p, logp: jnp.sum(jnp.where(p > 0, p * (logp - jnp.where(ok, logpi, 0.0)), 0.0), -1)  # noqa: E731
    log(type="diagnose", key=f"diagnose/{kind}/{scale}", kind=kind, scale=scale, positions=int(x.shape[0]),
        draws=draws, realized_abs_lr=float(jnp.mean(jnp.sum(q * diff(logq, logpi), -1))),
        marginal_abs_lr=float(jnp.mean(jnp.sum(qbar * diff(logqbar, logpi), -1))),
        realized_kl=float(jnp.mean(kl(q, logq))), marginal_kl=float(jnp.mean(kl(qbar, logqbar))))
  env.executor.close()


def part_curves(workdir: str, sizes: dict, settings) -> None:
  """Short GRPO runs from the SFT checkpoint, per arm and engine setting, through launch.py."""
  sft = os.path.join(workdir, "sft")
  log = Log(workdir)
  for kind, scale in settings:
    for arm, fields in ARMS.items():
      out = os.path.join(workdir, "curves", f"{kind}_{scale}_{arm}")
      if not os.path.exists(os.path.join(out, "metrics.jsonl")) or not any(
          "eval/accuracy" in line for line in open(os.path.join(out, "metrics.jsonl"))):
        t0 = time.time()
        flags = [f"--config.rl.correction.{k}={v}" for k, v in fields.items()]
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".log", "w") as text:
          subprocess.run([sys.executable, "launch.py", f"--config={SFT_CONFIG}", f"--workdir={out}",
                          "--config.stages=('rl',)", "--config.seed=0", f"--config.model.path={sft}",
                          f"--config.data.dir={os.path.join(sft, 'data')}", f"--config.rl.steps={sizes['rl_steps']}",
                          "--config.rl.eval_every=0", "--config.checkpoint.every=100000",
                          "--config.wandb.mode=disabled", "--config.progress=False",
                          f"--config.rl.rollout_mismatch.noise_kind={kind}",
                          f"--config.rl.rollout_mismatch.noise_scale={scale}", *flags],
                         cwd=ROOT, check=True, stdout=text)
        print(f"curve {kind} {scale} {arm}: {time.time() - t0:.1f}s", flush=True)
      rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
      train = [r for r in rows if r.get("stage") == "rl" and "reward" in r]
      final = [r for r in rows if "eval/accuracy" in r][-1]
      log(type="curve", key=f"curve/{kind}/{scale}/{arm}", kind=kind, scale=scale, arm=arm,
          reward=[r["reward"] for r in train], accuracy=final["eval/accuracy"],
          lr_abs=float(np.mean([r["mismatch/mean"] for r in train])),
          skipped=sum(r.get("skipped_updates", 0) for r in train))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--quick", action="store_true", help="smoke sizes (~2 minutes, seed 0, no reward curves)")
  p.add_argument("--part", default="all", choices=("all", "sft", "grad", "curves", "diagnose"))
  p.add_argument("--seed", type=int, default=None, help="grad: the seed (default: every seed of the sizes)")
  p.add_argument("--settings", default="", help="grad / curves: comma list of kind:scale (default: all of the "
                 "part's settings), e.g. uniform:0.3,bf16:0")
  a = p.parse_args()
  sizes = SIZES["quick" if a.quick else "full"]
  os.makedirs(a.workdir, exist_ok=True)
  chosen = [(s.split(":")[0], float(s.split(":")[1])) for s in a.settings.split(",")] if a.settings else None
  t0 = time.time()
  if a.part in ("all", "sft"):
    part_sft(a.workdir)
  if a.part in ("all", "grad"):
    for seed in ([a.seed] if a.seed is not None else sizes["seeds"]):
      part_grad(a.workdir, seed, sizes, chosen or SETTINGS)
  if a.part in ("all", "curves") and sizes["rl_steps"]:
    part_curves(a.workdir, sizes, chosen or CURVE_SETTINGS)
  if a.part in ("all", "diagnose"):
    part_diagnose(a.workdir, sizes, chosen or SETTINGS)
  Log(a.workdir)(type="wall", key=f"wall/{a.part}/{a.seed}/{a.settings}/{time.time():.0f}", part=a.part,
                 seed=a.seed, quick=a.quick, wall_s=time.time() - t0)
  print(f"done in {time.time() - t0:.0f}s: {os.path.join(a.workdir, 'results.jsonl')}")


if __name__ == "__main__":
  main()
