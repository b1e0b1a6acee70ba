"""The measurements of experiments/timestep_modules for one seed, from its finished workdirs (README.md defines
each; rlkit/embodied/analysis.py computes them):

  python experiments/timestep_modules/analyze.py --root=/tmp/timestep_modules --seed=0 [--quick]

writes ROOT/analysis_s<seed>.json. The reference expert theta_0 is ROOT/bc_s<seed>'s; theta_T the final expert of
ROOT/<arm>_<task>_s<seed> for the full fine-tuning arms (adam, sgd). Every success rate is one evaluation of
EVAL_EPISODES first episodes with the deterministic sampler (the stages' sample_steps), its key fixed by (seed,
task), so every expert is scored on the same starts and goals of a task (paired comparisons).
"""
import argparse
import json
import os
import sys

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.timestep_modules import QUICK, TASKS, get_config  # noqa: E402
from rlkit.embodied import analysis as A  # noqa: E402
from rlkit.embodied.bc_stage import env_of, flow_config  # noqa: E402
from rlkit.embodied.episodes import evaluation_row, policy_evaluator  # noqa: E402
from rlkit.embodied.expert_source import saved_expert  # noqa: E402
from rlkit.envs import with_task  # noqa: E402
from rlkit.models.flow import TIMESTEP_MODULES, init_flow, sample  # noqa: E402
from rlkit.train.config import set_dotted  # noqa: E402
from rlkit.train.checkpoint import CheckpointReader  # noqa: E402

FULL_ARMS = ("adam", "sgd")
GROUPS = {"timestep": TIMESTEP_MODULES, "block_mlp": r"(^|/)mlp_\d+_(in|out)/", "input": r"(^|/)(action_in|obs_in)/",
          "output": r"(^|/)action_out/"}
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
TS = ("timestep",)


def run_dir(root: str, arm: str, task: str, seed: int) -> str:
  return os.path.join(root, f"{arm}_{task}_s{seed}")


def second_moments(workdir: str):
  """Adam's second-moment estimate of the expert at the run's final checkpoint (None for an SGD run)."""
  reader = CheckpointReader(os.path.join(workdir, "checkpoints"))
  try:
    state = reader.restore_state(reader.latest_step())
  finally:
    reader.close()
  nu = A.adam_second_moments(state["train"]["opt_state"])
  return None if nu is None else nu["flow"]


def kernel_summary(spectra: dict) -> dict:
  """{path: {group, erank_norm, erank_vs_gaussian, stable_rank_norm, k90_norm, shape}} of `kernel_spectra`."""
  return {path: {"group": s["group"], "erank_norm": s["erank_norm"], "stable_rank_norm": s["stable_rank_norm"],
                 "k90_norm": s["k90_norm"], "erank_vs_gaussian": s["erank"] / s["gaussian_erank"],
                 "max_rank": s["max_rank"]} for path, s in spectra.items()}


class Scorer:
  """A seed's reference expert theta_0 and `success(params, task)`: the paired evaluation (module docstring)."""

  def __init__(self, root: str, seed: int, quick: bool = False):
    config = get_config("bc")
    for key, value in (QUICK.items() if quick else ()):
      set_dotted(config, key, value)
    section = config.bc
    env, base_task = env_of(section)
    self.fc = fc = flow_config(section, env)
    self.fresh = init_flow(fc, env.obs_dim, jax.random.key(0))
    self.theta0 = saved_expert(os.path.join(root, f"bc_s{seed}"), self.fresh)
    self.params = {**{task: with_task(base_task, **TASKS[task]) for task in TASKS}, "drift_free": base_task}
    self.evaluator = policy_evaluator(env, lambda p, obs, k: sample(p, fc, obs, k, section.sample_steps),
                                      section.eval_episodes, fc.horizon, -(-int(base_task.max_steps) // fc.horizon))
    self.keys = {task: jax.random.fold_in(jax.random.key(7_000 + seed), i) for i, task in enumerate(self.params)}
    self.sample_steps, self.eval_episodes = section.sample_steps, section.eval_episodes

  def success(self, p, task: str) -> float:
    return evaluation_row(*self.evaluator(p, self.params[task], self.keys[task]))["eval/success"]

  def expert(self, workdir: str):
    return saved_expert(workdir, self.fresh)


def pilot_measure(root: str, seed: int, pilot: tuple, quick: bool = False) -> dict:
  """The gate's numbers (README G1-G3): theta_0's success on every task and the drift-free one, and the pilot
  run's gain on its task."""
  scorer = Scorer(root, seed, quick)
  s0 = {task: scorer.success(scorer.theta0, task) for task in scorer.params}
  arm, task = pilot
  gain = scorer.success(scorer.expert(run_dir(root, arm, task, seed)), task) - s0[task]
  return {"s0": s0, "pilot_gain": gain}


def analyze(root: str, seed: int, quick: bool = False) -> dict:
  scorer = Scorer(root, seed, quick)
  success, theta0, fc, tasks = scorer.success, scorer.theta0, scorer.fc, list(TASKS)
  out = {"seed": seed, "tasks": tasks, "groups": GROUPS, "alphas": list(ALPHAS), "eval_episodes": scorer.eval_episodes,
         "s0": {task: success(theta0, task) for task in scorer.params}, "arms": {}}
  grid = np.arange(scorer.sample_steps) / scorer.sample_steps         # the flow times the sampler visits
  probe = lambda p: A.timestep_outputs(fc, p, grid)                    # noqa: E731
  for arm in FULL_ARMS:
    experts = {task: scorer.expert(run_dir(root, arm, task, seed)) for task in tasks}
    rows = {}
    for i, task in enumerate(tasks):
      theta = experts[task]
      nu = second_moments(run_dir(root, arm, task, seed))
      rows[task] = {
          "full": success(theta, task),
          "graft_timestep": success(A.graft(theta0, theta, GROUPS, TS), task),
          "graft_rest": success(A.graft(theta0, theta, GROUPS, TS, complement=True), task),
          "random_timestep": success(A.random_direction(theta0, theta, GROUPS, TS, seed=100 * seed + i), task),
          "steer": {str(a): success(A.graft(theta0, theta, GROUPS, TS, alpha=a), task) for a in ALPHAS},
          "shares": A.update_shares(theta0, theta, GROUPS),
          "gradient_shares": A.gradient_shares(theta0, nu, GROUPS) if nu is not None else None,
          "kernels": kernel_summary(A.kernel_spectra(theta0, theta, GROUPS)),
          "free_full": success(theta, "drift_free"),
      }
    transfer = {i: {j: success(A.graft(theta0, experts[i], GROUPS, TS), j) - out["s0"][j] for j in tasks if j != i}
                for i in tasks}
    weight = [A.shift_vector(theta0, experts[t], GROUPS, "timestep") for t in tasks]
    function = [A.function_shift(probe, theta0, experts[t]) for t in tasks]
    out["arms"][arm] = {"tasks": rows, "transfer": transfer,
                        "cosine_weight": A.cosine_matrix(weight).tolist(),
                        "cosine_function": A.cosine_matrix(function).tolist()}
  return out


def transfer_correlation(arm: dict, tasks: list, which: str = "cosine_weight") -> float:
  """Spearman's rho of cos(s_i, s_j) with T_{i->j} over the ordered pairs i != j (README H4)."""
  cos, xs, ys = np.asarray(arm[which]), [], []
  for a, i in enumerate(tasks):
    for b, j in enumerate(tasks):
      if i != j:
        xs.append(cos[a, b])
        ys.append(arm["transfer"][i][j])
  return A.spearman(xs, ys)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--quick", action="store_true")
  args = p.parse_args(argv)
  result = analyze(args.root, args.seed, args.quick)
  path = os.path.join(args.root, f"analysis_s{args.seed}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(result, f, indent=1)
  os.replace(path + ".tmp", path)
  print(f"[timestep_modules] wrote {path}", flush=True)


if __name__ == "__main__":
  main()
