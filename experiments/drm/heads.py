"""The reward heads of experiments/drm scored against the true rating distributions, for one seed: what
summarize.py reports (its docstring defines every measure), computed where the heads and the SFT decoder exist,
so the archive keeps the numbers and not the checkpoints.

  python experiments/drm/heads.py --root=/tmp/drm --seed=0

reads ROOT/sft_s<seed> (its config.json, newest checkpoint and reward_model/rm_<head> folders) and writes
ROOT/heads_s<seed>.json: {"table": {row: {measure: value}}, "show": the densities plot's examples and samples}.
"""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.drm import HEADS, RISK_LEVEL  # noqa: E402
from experiments.driver import read_json  # noqa: E402
from rlkit.data import make_task  # noqa: E402
from rlkit.data.annotated import midpoint_levels, mixture_quantiles  # noqa: E402
from rlkit.data.splits import generate_splits  # noqa: E402
from rlkit.rewards import reward_metrics as M  # noqa: E402
from rlkit.rewards.head_catalog import head_spec  # noqa: E402
from rlkit.rewards.reward_model import embed, load_head  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402
from rlkit.train.models import Model, load_model  # noqa: E402

SAMPLES = 128          # head samples per held-out example (distribution metrics)
PICK_SAMPLES = 64      # head samples per candidate response (safe pick)
TRUTH_POINTS = 1000    # midpoint quantiles of each true distribution
CHUNK = 500            # rows per sampler call
GAP_STDS = 2.0         # "between the modes": more than this many noise stds inside both (truth: about 2% there)
REFERENCES = ("8 ratings", "truth", "best point", "best gaussian")


# ----------------------------------------------------------------------------------------------- data

def held_out(config: dict) -> tuple[object, list[dict]]:
  """(task, the examples the stage evaluated on: prompt, answer and every field) from a run's config.json."""
  task = make_task(config["task"]["name"], **config["task"]["kwargs"])
  test = generate_splits(task, config["data"]["num_train"], config["data"]["num_test"], config["seed"])["test"]
  rows = test[:config["eval"]["num_examples"]]
  return task, [{"prompt": r["prompt"], "answer": r["answer"], **json.loads(r["fields"])} for r in rows]


def truth_points(mixtures, m: int = TRUTH_POINTS) -> np.ndarray:
  """[N, m] midpoint quantiles of each true distribution."""
  levels = midpoint_levels(m)
  return np.stack([mixture_quantiles(m, levels) for m in mixtures]).astype(np.float32)


def draw(folder: str, cond: np.ndarray, n: int, seed: int) -> np.ndarray:
  """[N, n] samples of the head in `folder` at cond [N, D], in chunks of CHUNK rows (one key per chunk)."""
  name, _, module, params = load_head(folder, cond.shape[1])
  sample = jax.jit(lambda k, c: head_spec(name).samples(params, module.apply, k, c, n))
  key = jax.random.key(seed)
  parts = []
  for i, start in enumerate(range(0, len(cond), CHUNK)):
    chunk = cond[start:start + CHUNK]
    padded = np.concatenate([chunk, np.repeat(chunk[-1:], CHUNK - len(chunk), 0)]) if len(chunk) < CHUNK else chunk
    parts.append(np.asarray(sample(jax.random.fold_in(key, i), jnp.asarray(padded)))[:len(chunk)])
  return np.concatenate(parts)


# ----------------------------------------------------------------------------------------------- metrics

def gap_bounds(mixtures) -> np.ndarray:
  """[N, 2] the open interval between two modes, GAP_STDS component stds inside each (NaN for one mode)."""
  out = np.full((len(mixtures), 2), np.nan)
  for i, m in enumerate(mixtures):
    if len(m) == 2:
      (_, lo, s_lo), (_, hi, s_hi) = sorted(m, key=lambda c: c[1])
      out[i] = lo + GAP_STDS * s_lo, hi - GAP_STDS * s_hi
  return out


def distribution_metrics(samples: np.ndarray, truth: np.ndarray, controversial: np.ndarray,
                         gap: np.ndarray) -> dict:
  """W1 / CRPS against the truth points, the mass between the modes and the bimodality detection scores of
  samples [N, S]."""
  w1 = np.asarray(M.wasserstein1(samples, truth))
  bc = np.asarray(M.bimodality_coefficient(samples))
  bimodal = bc > M.BIMODAL_THRESHOLD
  between = (samples > gap[:, :1]) & (samples < gap[:, 1:])
  return {"W1": float(w1.mean()), "W1 controversial": float(w1[controversial].mean()),
          "W1 consensus": float(w1[~controversial].mean()),
          "mass between modes": float(between[controversial].mean()),
          "CRPS": float(np.mean(np.asarray(M.crps(samples, truth)))),
          "AUC": M.bimodality_auc(bc, controversial), "detected": float(bimodal[controversial].mean()),
          "false alarms": float(bimodal[~controversial].mean())}


def pick_metrics(samples: np.ndarray, true_q10: np.ndarray) -> dict:
  """samples [N, C, S] of C candidate responses per prompt, true_q10 [N, C]: the safe pick's scores."""
  q10 = np.quantile(samples, RISK_LEVEL, axis=-1)
  rows = np.arange(len(samples))
  safe, by_mean = q10.argmax(-1), samples.mean(-1).argmax(-1)
  best = true_q10.max(-1)
  return {"safest picked": float(np.mean(true_q10[rows, safe] >= best - 1e-9)),
          "true q10 of pick": float(true_q10[rows, safe].mean()),
          "true q10 of mean pick": float(true_q10[rows, by_mean].mean())}


def first(mask: np.ndarray, prefer: np.ndarray) -> int:
  """The first index where `mask` holds, preferring one where `prefer` holds too."""
  both = np.flatnonzero(mask & prefer)
  return int(both[0] if len(both) else np.flatnonzero(mask)[0])


def stage_w1(workdir: str, stage: str) -> float:
  rows = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if r.get("stage") == stage
          and "eval/rm/w1" in r]
  return rows[-1]["eval/rm/w1"] if rows else np.nan


def score_seed(workdir: str, seed: int) -> tuple[dict, dict]:
  """{row: metrics} for every head in the workdir plus the reference rows, and the densities plot's data."""
  config = read_json(os.path.join(workdir, "config.json"))
  task, examples = held_out(config)
  decoder = Model(*load_model(workdir), False)
  prompts = [e["prompt"] for e in examples]
  cond = embed(decoder, prompts, [e["response"] for e in examples])
  truth = truth_points([e["mixture"] for e in examples])
  controversial = np.array([e["controversial"] for e in examples])
  variants = [task.variants(e) for e in examples]
  var_cond = embed(decoder, [p for p in prompts for _ in range(4)], [v["response"] for vs in variants for v in vs])
  var_q10 = np.array([[mixture_quantiles(v["mixture"], [RISK_LEVEL])[0] for v in vs] for vs in variants])
  ratings = np.array([e["ratings"] for e in examples], np.float32)
  mean = truth.mean(1, keepdims=True)
  gaussian = mean + truth.std(1, keepdims=True) * np.asarray(
      mixture_quantiles(((1.0, 0.0, 1.0),), midpoint_levels(SAMPLES)), np.float32)[None]
  gap = gap_bounds([e["mixture"] for e in examples])
  score = lambda samples: distribution_metrics(samples, truth, controversial, gap)     # noqa: E731
  table = {"8 ratings": score(ratings), "truth": score(truth_points([e["mixture"] for e in examples], SAMPLES)),
           "best point": score(np.repeat(mean, SAMPLES, 1)), "best gaussian": score(gaussian)}
  correct = np.array([e["correct"] for e in examples])
  show = {"examples": [first(controversial, correct), first(~controversial, correct)]}
  show["mixtures"] = [examples[i]["mixture"] for i in show["examples"]]
  show["responses"] = [examples[i]["response"] for i in show["examples"]]
  for h, head in enumerate(HEADS):
    folder = os.path.join(workdir, "reward_model", f"rm_{head}")
    if not os.path.exists(os.path.join(folder, "head.json")):
      continue
    samples = draw(folder, cond, SAMPLES, 100 * seed + h)
    picks = draw(folder, var_cond, PICK_SAMPLES, 100 * seed + 50 + h).reshape(len(examples), 4, PICK_SAMPLES)
    table[head] = {**score(samples), **pick_metrics(picks, var_q10),
                   "stage W1 vs 8 ratings": stage_w1(workdir, f"rm_{head}")}
    show[head] = samples[show["examples"]]
  return table, show


def heads_path(root: str, seed: int) -> str:
  return os.path.join(root, f"heads_s{seed}.json")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  table, show = score_seed(os.path.join(args.root, f"sft_s{args.seed}"), args.seed)
  show = {k: np.asarray(v).tolist() if k in HEADS else v for k, v in show.items()}
  path = heads_path(args.root, args.seed)
  with open(path + ".tmp", "w") as f:
    json.dump({"table": table, "show": show}, f, default=float)       # numpy scalars as floats
  os.replace(path + ".tmp", path)
  print(f"[drm] wrote {path}", flush=True)


if __name__ == "__main__":
  main()
