"""What outcome-only RL has to learn from at its start: a policy's verdicts on the arms' chains, sampled as the
`outcome` arm samples them (RL_PROMPTS held-out chains x RL_GROUP verdicts at temperature 1), scored by the
`tips_outcome` reward. Prints one JSON line: the share of verdicts well formed (one verdict per step), the share
paid, and the share of groups whose rewards differ (the only groups GRPO learns from).

  python experiments/tips/start_signal.py --policy=/tmp/tips/start_s0 --chains=/tmp/tips/supervised_s0 [--groups=8]

--policy: the workdir (or model folder) whose model samples; --chains: a workdir of the arms whose task, split
and held-out chains are used (its own model is not).
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.tips import MAX_NEW_TOKENS, RL_GROUP, RL_PROMPTS  # noqa: E402
from experiments.held_out import held_out  # noqa: E402


def score_groups(records: list, texts: list) -> tuple[list, list, list]:
  """(well formed, paid) per verdict and (rewards differ) per group: `texts` holds RL_GROUP verdicts of each of
  `records` in turn, scored by the `tips_outcome` reward's row function."""
  from rlkit.rewards.prm import parse_answer, score_verdict
  formed, paid, informative = [], [], []
  for i, r in enumerate(records):
    label, n_steps = parse_answer(r["answer"])
    rows = [score_verdict(t, label, n_steps, not r["final_answer_correct"])
            for t in texts[i * RL_GROUP:(i + 1) * RL_GROUP]]
    formed += [row[0] for row in rows]
    paid += [row[1] for row in rows]
    informative.append(float(len({row[1] for row in rows}) > 1))
  return formed, paid, informative


def sampled_signal(policy: str, chains: str, groups: int, seed: int = 0) -> dict:
  """`groups` batches of RL_PROMPTS held-out chains of `chains`, RL_GROUP verdicts each by `policy`'s model at
  temperature 1: the shares of verdicts well formed and paid, and of groups informative."""
  import jax

  from rlkit.rollout.texts import sample_texts
  from rlkit.train.models import Model, load_model
  _, records = held_out(chains)
  model = Model(*load_model(policy), trainable=False)
  key = jax.random.key(seed)
  formed, paid, informative = [], [], []
  for g in range(groups):
    batch = records[g * RL_PROMPTS:(g + 1) * RL_PROMPTS]
    prompts = [r["prompt"] for r in batch for _ in range(RL_GROUP)]
    texts = sample_texts(model, prompts, jax.random.fold_in(key, g), max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
    for total, part in zip((formed, paid, informative), score_groups(batch, texts)):
      total += part
  return {"policy": policy, "chains": chains, "verdicts": len(formed), "well_formed": float(np.mean(formed)),
          "paid": float(np.mean(paid)), "informative_groups": float(np.mean(informative))}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--policy", required=True)
  parser.add_argument("--chains", required=True)
  parser.add_argument("--groups", type=int, default=8, help=f"batches of {RL_PROMPTS} chains x {RL_GROUP} verdicts")
  args = parser.parse_args(argv)
  print(json.dumps(sampled_signal(args.policy, args.chains, args.groups)))


if __name__ == "__main__":
  main()
