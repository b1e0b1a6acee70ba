"""Summarise experiments/drm: the reward heads against the true rating distributions, and the RL arms.

  python experiments/drm/summarize.py --root=experiments/drm/runs [--seeds=0,1,2] [--out=DIR]

Heads (DIR/sft_s<seed>/reward_model/rm_<head>): the reward_model stage logs W1 and CRPS against each held-out
example's 8 observed ratings only, and writes no per-example samples, so experiments/drm/heads.py scores the
heads where they exist (the driver runs it after each seed's SFT: DIR/heads_s<seed>.json, archived, which this
script reads). For each seed it regenerates the run's held-out examples (the task, sizes and seed of its config.json; the
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
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.drm import ARMS, HEADS  # noqa: E402
from experiments.arm_tables import save_figure, summarize  # noqa: E402
from experiments.driver import add_summary_args, read_json, spread, summary_path  # noqa: E402
from experiments.drm.heads import REFERENCES, heads_path  # noqa: E402
from rlkit.data.annotated import mixture_pdf  # noqa: E402

RL_METRICS = {"accuracy": "eval/accuracy", "controversial share": "eval/annotated/controversial",
              "true mean rating": "eval/annotated/true_mean", "true q10 rating": "eval/annotated/true_q10",
              "response length": "eval/response_len"}
HEAD_COLUMNS = ("W1", "W1 controversial", "W1 consensus", "mass between modes", "CRPS", "AUC", "detected",
                "false alarms", "safest picked", "true q10 of pick", "true q10 of mean pick",
                "stage W1 vs 8 ratings")


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
  p.add_argument("--root", default="experiments/drm/runs")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p, one_plot=False)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  by_seed, shown = {}, None
  for seed in seeds:
    if os.path.exists(heads_path(args.root, seed)):        # experiments/drm/heads.py's (the driver runs it)
      scored = read_json(heads_path(args.root, seed))
      by_seed[seed], show = scored["table"], scored["show"]
      shown = shown or (seed, show)
  print("Reward heads on the held-out examples, against the true distributions (mean and min-max over seeds):\n")
  head_table(by_seed)
  if shown:
    plot_densities(shown[1], summary_path(args.out, args.root, "densities.png"), shown[0])
  print("\nRL arms (the sft row: the SFT policy, evaluated at the end of its last reward-model stage):\n")
  summarize(args.root, ARMS, seeds, RL_METRICS, summary_path(args.out, args.root, "curves.png"), "drm")


if __name__ == "__main__":
  main()
