"""What a calibration gate (experiments/gate.py) reads of a finished run besides its metrics: its model sampled at
temperature 1 on the held-out prompts its own evaluation scored (which the greedy evaluation does not show), and
its first and last evaluations (experiments/prorubric and experiments/calif use them).
"""
import json
import os

from experiments.driver import read_json


def held_out(workdir: str):
  """(task, examples) of a run: its task and the held-out examples its evaluation scored (the first
  eval.num_examples of its test split), each with its fields as the task made them."""
  import rlkit.data  # noqa: F401  (registers the tasks)
  from rlkit.data.splits import generate_test_split
  from rlkit.data.tasks import make_task
  from rlkit.train.evaluate import evaluated_records
  config = read_json(os.path.join(workdir, "config.json"))
  task = make_task(config["task"]["name"], **config["task"]["kwargs"])
  test = generate_test_split(task, config["data"]["num_test"], config["seed"])
  records = evaluated_records(task, test, config["eval"]["num_examples"])
  return task, [{**json.loads(r["fields"]), "prompt": r["prompt"], "answer": r["answer"]} for r in records]


def sample_held_out(workdir: str, max_new_tokens: int, samples: int = 1, seed: int = 0,
                    temperatures=(1.0,)) -> tuple:
  """(task, examples, {temperature: completions}) with completions[s][i] the s-th completion at that temperature
  of held-out example i by the model of `workdir` (its newest checkpoint, loaded once): what a gate reads of a
  policy's sampling, which its greedy evaluation does not show."""
  import jax

  from rlkit.rollout.texts import sample_texts
  from rlkit.train.models import Model, load_model
  task, records = held_out(workdir)
  model = Model(*load_model(workdir), trainable=False)
  prompts = [r["prompt"] for r in records]
  key = jax.random.key(seed)
  return task, records, {t: [sample_texts(model, prompts, jax.random.fold_in(key, s), max_new_tokens=max_new_tokens,
                                          temperature=t) for s in range(samples)] for t in temperatures}


def start_and_end(workdir: str) -> tuple[dict, dict]:
  """A run's evaluation before its first step (of the model it loaded; {} without one) and its last."""
  from rlkit.train.metrics import read_metrics
  evals = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if "eval/accuracy" in r]
  return (evals[0] if evals[0].get("at_stage_start") else {}), evals[-1]
