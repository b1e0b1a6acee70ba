"""Summarise experiments/drm: the reward heads against the true rating distributions, and the RL arms.

  python experiments/drm/summarize.py --root=/tmp/drm [--seeds=0,1,2] [--out=DIR]

Heads (DIR/sft_s<seed>/reward_model/rm_<head>): the reward_model stage logs W1 and CRPS against each held-out
example's 8 observed ratings only, and writes no per-example samples, so this script scores the heads itself.
For each seed it regenerates the run's held-out examples (the task, sizes and seed of its config.json; the
first eval.num_examples of the test split, the set the stage evaluated), embeds them with the workdir's frozen
decoder (the newest checkpoint: the SFT policy; rlkit/rewards/reward_model.py `embed`), draws SAMPLES samples
per example from each head, and compares them with the example's exact true distribution (its `mixture`,
discretised at TRUTH_POINTS midpoint quantiles, rlkit/data/annotated.py):

  W1            wasserstein1(head samples, truth), overall and on controversial / consensus examples
  between       on controversial examples, the share of samples between the two modes, more than GAP_STDS
                noise stds inside both (where a head that averages the groups puts mass; truth: about 2%)
  CRPS          crps(head samples, truth points): the CRPS averaged over ratings drawn from the truth
  AUC           bimodality_auc(Sarle's coefficient of the samples, controversial)
  detected      share of controversial examples whose samples pass Sarle's rule (BC > 5/9); false alarms:
                the share of consensus examples that do
  safe pick     for each held-out prompt, the four responses (right / near miss x terse / verbose), each
                embedded and sampled: the one with the highest head 10% quantile; reported are the share of
                prompts where that is the truly safest response (highest true 10% quantile: right and terse)
                and the true 10% quantile of the picks; "mean pick" picks by the head's sample mean instead

Reference rows, from the truth alone: `8 ratings` scores the observed ratings themselves as the prediction
(the data's own noise); `truth` the truth's own SAMPLES-point discretisation (W1 near 0: a check of the
pipeline); `best point` the true mean (the best a scalar head can do in W1 up to the median's small gain);
`best gaussian` the moment-matched Gaussian (what a Gaussian head at its NLL optimum predicts).

RL arms (experiments/arm_tables.py): accuracy, the share of controversial (verbose) greedy answers, their true
mean and 10% quantile rating, the response length.
Writes curves.png (RL) and densities.png (each head's samples on one controversial and one consensus example)
into DIR, or into --out.
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
from configs.drm import ARMS, HEADS, RISK_LEVEL  # noqa: E402
from experiments.arm_tables import save_figure, summarize  # noqa: E402
from experiments.driver import add_summary_args, read_json, spread, summary_path  # noqa: E402
from rlkit.data import make_task  # noqa: E402
from rlkit.data.annotated import midpoint_levels, mixture_pdf, mixture_quantiles  # noqa: E402
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
RL_METRICS = {"accuracy": "eval/accuracy", "controversial share": "eval/annotated/controversial",
              "true mean rating": "eval/annotated/true_mean", "true q10 rating": "eval/annotated/true_q10",
              "response length": "eval/response_len"}
REFERENCES = ("8 ratings", "truth", "best point", "best gaussian")
HEAD_COLUMNS = ("W1", "W1 controversial", "W1 consensus", "mass between modes", "CRPS", "AUC", "detected",
                "false alarms", "safest picked", "true q10 of pick", "true q10 of mean pick",
                "stage W1 vs 8 ratings")


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


# ----------------------------------------------------------------------------------------------- output

def head_table(by_seed: dict) -> None:
  rows = [r for r in REFERENCES + HEADS if any(r in t for t in by_seed.values())]
  print("| head | seeds | " + " | ".join(HEAD_COLUMNS) + " |\n|---|---|" + "---|" * len(HEAD_COLUMNS))
  for row in rows:
    seeds = [s for s, t in by_seed.items() if row in t]
    cells = [spread([by_seed[s][row].get(c, np.nan) for s in seeds]) for c in HEAD_COLUMNS]
    print(f"| {row} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")


def plot_densities(show: dict, out: str, seed: int) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  heads = [h for h in HEADS if h in show]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
  for col, ax in enumerate(axes[0]):
    mixture = show["mixtures"][col]
    grid = np.linspace(min(m - 4 * s for _, m, s in mixture), max(m + 4 * s for _, m, s in mixture), 400)
    density = mixture_pdf(mixture, grid)
    ax.plot(grid, density, color="black", lw=2, label="truth")
    ax.set_ylim(0, 1.6 * density.max())       # a point head's samples are one spike: clipped, not rescaling all
    for head in heads:
      ax.hist(show[head][col], bins=40, range=(grid[0], grid[-1]), density=True, histtype="step", label=head)
    ax.set(title=f"{'controversial' if col == 0 else 'consensus'}: {show['responses'][col]!r}", xlabel="rating")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.suptitle(f"drm: head samples vs the true rating density (seed {seed}, held-out examples)")
  save_figure(fig, out)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/drm")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p, one_plot=False)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  by_seed, shown = {}, None
  for seed in seeds:
    workdir = os.path.join(args.root, f"sft_s{seed}")
    if os.path.exists(os.path.join(workdir, "config.json")):
      by_seed[seed], show = score_seed(workdir, seed)
      shown = shown or (seed, show)
  print("Reward heads on the held-out examples, against the true distributions (mean and min-max over seeds):\n")
  head_table(by_seed)
  if shown:
    plot_densities(shown[1], summary_path(args.out, args.root, "densities.png"), shown[0])
  print("\nRL arms (the sft row: the SFT policy, evaluated at the end of its last reward-model stage):\n")
  summarize(args.root, ARMS, seeds, RL_METRICS, summary_path(args.out, args.root, "curves.png"), "drm")


if __name__ == "__main__":
  main()
