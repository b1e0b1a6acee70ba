"""The top-k overlaps of experiments/opd_scale (README, "What is measured"), computed from the checkpoints (the
trainer logs none of it) into ROOT/overlaps.json, which the gate (run.py) and the summary read and the archive
keeps.

  python experiments/opd_scale/overlaps.py --root=/tmp/opd_scale [--seeds=0,1,2] [--recompute]

Each student samples one response at temperature 1 (the distill stage's) to each of the first eval.num_examples
held-out prompts (the set the runs evaluate on; key derived from the seed); at every response position the
student sampled (its stop token included), with S_k and T_k the k most likely next tokens of student and teacher
on that prefix,

  overlap@k = mean over positions of |S_k ∩ T_k| / k        hit@k = share of positions whose sampled token is in T_k

plus the exact reverse KL(p_S || p_T) per position (the full vocabulary, temperature 1) and the mean sampled
gap log p_T(y) - log p_S(y) (the mean OPD advantage). "initial": the student's SFT checkpoint against the
teacher, as soon as both exist; "final": the distilled student (the arm's last checkpoint) on its own samples,
once the arm finished. Entries already in the file are kept (--recompute redoes them).
"""
import argparse
import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.opd_scale import ARMS  # noqa: E402
from experiments.driver import finished, read_json  # noqa: E402
from experiments.opd_scale.workdirs import arm_path, student_path, teacher_path  # noqa: E402

KS = (1, 5)
OVERLAP_FILE = "overlaps.json"
OVERLAP_STREAM = 0x6F76         # fold_in data of the sampling key (the seed's key, its own stream)


# ----------------------------------------------------------------------------------------------------------- measures

def overlap_metrics(s_logits, t_logits, response, mask, ks=KS) -> dict:
  """The README's overlap metrics from student and teacher logits [N, R, V] at the student's sampled response
  tokens [N, R] (mask [N, R]: the positions it sampled, stop token included)."""
  import jax
  import jax.numpy as jnp
  m = jnp.asarray(mask, jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  mean = lambda x: float((x * m).sum() / n)        # noqa: E731
  out = {}
  for k in ks:
    s_top, t_top = jax.lax.top_k(s_logits, k)[1], jax.lax.top_k(t_logits, k)[1]
    shared = (s_top[..., :, None] == t_top[..., None, :]).any(-1).sum(-1) / k
    out[f"overlap@{k}"] = mean(shared)
    out[f"hit@{k}"] = mean((jnp.asarray(response)[..., None] == t_top).any(-1))
  ls, lt = jax.nn.log_softmax(s_logits, -1), jax.nn.log_softmax(t_logits, -1)
  out["reverse_kl"] = mean((jnp.exp(ls) * (ls - lt)).sum(-1))
  at = lambda lp: jnp.take_along_axis(lp, jnp.asarray(response)[..., None], -1)[..., 0]   # noqa: E731
  out["logp_gap"] = mean(at(lt) - at(ls))
  return out


@functools.lru_cache(maxsize=None)
def _model(path: str):
  from rlkit.train.models import load_model
  return load_model(path)


@functools.lru_cache(maxsize=None)
def _scorer(module, response_len: int):
  """Jitted `(params, tokens, attention_mask) -> logits [N, R, V]` predicting the last `response_len` tokens."""
  import jax
  from rlkit.rollout.scoring import response_forward
  return jax.jit(lambda p, t, a: response_forward(module, p, t, a, response_len)[0].astype("float32"))


@functools.lru_cache(maxsize=None)
def student_states(student_dir: str, seed: int):
  """The student's sampled rollout on the held-out prompts its runs evaluate on (module docstring)."""
  import jax
  from rlkit.data import make_task
  from rlkit.data.pipeline import prompt_batch
  from rlkit.data.splits import generate_splits
  from rlkit.rollout.sampler import SamplingConfig, generate
  config = read_json(os.path.join(student_dir, "config.json"))
  task = make_task(config["task"]["name"], **config["task"]["kwargs"])
  records = generate_splits(task, config["data"]["num_train"], config["data"]["num_test"], seed)["test"]
  records = records[:config["eval"]["num_examples"]]
  module, params, tok = _model(student_dir)
  batch = prompt_batch(records, tok, config["data"]["max_prompt_len"])
  cfg = SamplingConfig(max_new_tokens=config["eval"]["max_new_tokens"], temperature=1.0, stop_ids=tok.stop_ids,
                       pad_id=tok.pad_id)
  key = jax.random.fold_in(jax.random.key(seed), OVERLAP_STREAM)
  return generate(module, params, batch["prompt_tokens"], batch["prompt_mask"], key, cfg)


def compare(student_dir: str, teacher_dir: str, seed: int) -> dict:
  """overlap_metrics of the teacher against the student on the student's own samples."""
  ro = student_states(student_dir, seed)
  r = ro.response.shape[1]
  (s_mod, s_par, s_tok), (t_mod, t_par, t_tok) = _model(student_dir), _model(teacher_dir)
  if s_tok.get_vocab() != t_tok.get_vocab():
    raise ValueError(f"{teacher_dir} has another tokenizer than {student_dir}: overlaps compare one vocabulary.")
  return overlap_metrics(_scorer(s_mod, r)(s_par, ro.tokens, ro.attention_mask),
                         _scorer(t_mod, r)(t_par, ro.tokens, ro.attention_mask), ro.response, ro.response_mask)


def read_overlaps(root: str) -> dict:
  """{(arm, seed): {"initial": metrics or None, "final": metrics or None}} from ROOT/overlaps.json (empty if none)."""
  path = os.path.join(root, OVERLAP_FILE)
  cache = read_json(path) if os.path.exists(path) else {}
  out = {}
  for key, metrics in cache.items():
    when, arm, seed = key.split(":")
    out.setdefault((arm, int(seed[1:])), {"initial": None, "final": None})[when] = metrics
  return out


def compute_overlaps(root: str, seeds, recompute: bool = False) -> dict:
  """Adds to ROOT/overlaps.json every initial overlap whose student and teacher exist and every final one whose
  arm finished (module docstring); returns `read_overlaps`."""
  path = os.path.join(root, OVERLAP_FILE)
  cache = {} if recompute or not os.path.exists(path) else read_json(path)
  for seed in seeds:
    for arm, spec in ARMS.items():
      student, teacher = student_path(root, spec["student"], seed), teacher_path(root, spec["teacher"], seed)
      if not (os.path.isdir(teacher) and finished(student)):
        continue
      for when, s_dir in (("initial", student), ("final", arm_path(root, arm, seed))):
        key = f"{when}:{arm}:s{seed}"
        if key not in cache and (when == "initial" or finished(s_dir)):
          cache[key] = compare(s_dir, teacher, seed)
  with open(path + ".tmp", "w") as f:
    json.dump(cache, f, indent=1, sort_keys=True)
  os.replace(path + ".tmp", path)
  return read_overlaps(root)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/opd_scale")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--recompute", action="store_true", help="recompute every entry of ROOT/overlaps.json")
  args = p.parse_args(argv)
  done = compute_overlaps(args.root, [int(s) for s in args.seeds.split(",")], args.recompute)
  print(f"overlaps: {sum(v['initial'] is not None for v in done.values())} initial, "
        f"{sum(v['final'] is not None for v in done.values())} final in {os.path.join(args.root, OVERLAP_FILE)}")


if __name__ == "__main__":
  main()
