"""Summarise experiments/opd_scale: base accuracies, per-pair gap recovery, the top-k overlaps (computed here from
the checkpoints: the trainer does not log them), the pre-registered tests (README.md), a PNG of the curves and
one of recovery against overlap and against teacher accuracy.

  python experiments/opd_scale/summarize.py --root=/tmp/opd_scale [--seeds=0,1,2] [--recompute] [--out=DIR]

Overlap (README, "What is measured"): each student samples one response at temperature 1 (the distill stage's)
to each of the first eval.num_examples held-out prompts (the set the runs evaluate on; key derived from the
seed); at every response position the student sampled (its stop token included), with S_k and T_k the k most
likely next tokens of student and teacher on that prefix,

  overlap@k = mean over positions of |S_k ∩ T_k| / k        hit@k = share of positions whose sampled token is in T_k

plus the exact reverse KL(p_S || p_T) per position (the full vocabulary, temperature 1) and the mean sampled
gap log p_T(y) - log p_S(y) (the mean OPD advantage). "initial": the student's SFT checkpoint against the
teacher; "final": the distilled student (the arm's last checkpoint) on its own samples. Cached in
DIR/overlaps.json (--recompute redoes them). The plots, curves.png and recovery.png, go to DIR, or where --out
says.
"""
import argparse
import functools
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.opd_scale import ARMS, STUDENT_WIDTHS, TEACHER_WIDTHS, TEACHERS  # noqa: E402
from experiments.arm_tables import load_with_training, save_figure, summarize  # noqa: E402
from experiments.driver import add_summary_args, last_eval, read_json, spread, summary_path  # noqa: E402
from experiments.opd_scale.run import student_path, teacher_path  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "sample reward (T=1)": "reward", "entropy": "entropy",
           "response length": "eval/response_len"}
KS = (1, 5)
PRIMARY = "overlap@5"           # the pre-registered predictor (README)
MIN_ROOM = 0.10                 # recovery is defined for pairs whose teacher is at least this far above the student
TIE_R, TIE_GAIN, TIE_RHO = 0.10, 0.02, 0.2
SIGN_ROOM = 0.05                # H5: pairs whose |room| is at least this
OVERLAP_STREAM = 0x6F76         # fold_in data of the sampling key (the seed's key, its own stream)


# ----------------------------------------------------------------------------------------------- overlaps

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


def overlaps(root: str, seeds, recompute: bool) -> dict:
  """{(arm, seed): {"initial": metrics, "final": metrics or None}} for every arm workdir that finished."""
  cache_file = os.path.join(root, "overlaps.json")
  cache = {} if recompute or not os.path.exists(cache_file) else read_json(cache_file)
  out = {}
  for seed in seeds:
    for arm, spec in ARMS.items():
      student, teacher = student_path(root, spec["student"], seed), teacher_path(root, spec["teacher"], seed)
      if not (os.path.isdir(teacher) and last_eval(student)):
        continue
      entry = {}
      for when, s_dir in (("initial", student), ("final", os.path.join(root, f"{arm}_s{seed}"))):
        key = f"{when}:{arm}:s{seed}"
        if key not in cache and (when == "initial" or last_eval(s_dir)):
          cache[key] = compare(s_dir, teacher, seed)
        entry[when] = cache.get(key)
      out[(arm, seed)] = entry
  with open(cache_file, "w") as f:
    json.dump(cache, f, indent=1, sort_keys=True)
  return out


# ------------------------------------------------------------------------------------------------ tables

def base_accuracy(root: str, seed: int) -> dict:
  """{"t96sft", "t96rl", ..., "s64", "s128"}: held-out accuracy of each teacher (its stage's last evaluation)
  and student; nan where a run is missing."""
  from rlkit.train.metrics import read_metrics
  out = {}
  for w in TEACHER_WIDTHS:
    path = os.path.join(root, f"teacher_w{w}_s{seed}", "metrics.jsonl")
    rows = [r for r in read_metrics(path) if "eval/accuracy" in r] if os.path.exists(path) else []
    for kind in ("sft", "rl"):
      at = [r["eval/accuracy"] for r in rows if r.get("stage") == kind]
      out[f"t{w}{kind}"] = at[-1] if at else np.nan
  for w in STUDENT_WIDTHS:
    e = last_eval(student_path(root, w, seed))
    out[f"s{w}"] = e["eval/accuracy"] if e else np.nan
  return out


def make_load(root: str):
  """`load(path, keys)` for arm_tables.summarize: step 0 is the arm's own student."""
  def load(path: str, keys) -> dict:
    run = load_with_training(path, keys)
    arm, seed = os.path.basename(path).rsplit("_s", 1)
    base = base_accuracy(root, int(seed))[f"s{ARMS[arm]['student']}"]
    run["steps"] = [0] + run["steps"]
    for key in keys:
      run["values"][key] = [base if key == "eval/accuracy" else np.nan] + run["values"][key]
    return run
  return load


def rank(a) -> np.ndarray:
  """Ranks from 0, ties given their average rank."""
  _, inv, counts = np.unique(np.asarray(a, float), return_inverse=True, return_counts=True)
  ends = np.cumsum(counts)
  return ((ends - counts + ends - 1) / 2.0)[inv]


def spearman(x, y) -> float:
  """Spearman's rank correlation (Pearson's of the average ranks); nan for fewer than 3 points or a constant."""
  if len(x) < 3:
    return np.nan
  rx, ry = rank(x), rank(y)
  if rx.std() == 0 or ry.std() == 0:
    return np.nan
  return float(np.corrcoef(rx, ry)[0, 1])


def verdict(x: str, y: str, d: list, tie: float) -> str:
  """"x > y" when the mean of d = value(x) - value(y) is at least `tie` and d has that sign on a majority,
  "tie" when |mean| < tie, else "mixed"; "-" without data."""
  if not d:
    return "-"
  mean = float(np.mean(d))
  if abs(mean) < tie:
    return "tie"
  winner, loser, agree = (x, y, sum(v > 0 for v in d)) if mean > 0 else (y, x, sum(v < 0 for v in d))
  return f"{winner} > {loser}" if 2 * agree > len(d) else "mixed"


def pair_rows(runs: dict, bases: dict, ovs: dict) -> list:
  """One dict per finished (arm, seed): accuracies, room, gain, recovery and the overlaps."""
  rows = []
  for arm, by_seed in runs.items():
    spec = ARMS[arm]
    for seed, run in by_seed.items():
      if not run["done"] or (arm, seed) not in ovs:
        continue
      b = bases[seed]
      acc0, acc_t, acc1 = b[f"s{spec['student']}"], b[spec["teacher"]], run["values"]["eval/accuracy"][-1]
      room = acc_t - acc0
      final = ovs[(arm, seed)]["final"] or {}
      rows.append({"arm": arm, "seed": seed, "student": spec["student"], "teacher": spec["teacher"],
                   "acc_t": acc_t, "acc0": acc0, "acc1": acc1, "room": room, "gain": acc1 - acc0,
                   "recovery": (acc1 - acc0) / room if room >= MIN_ROOM else np.nan,
                   **ovs[(arm, seed)]["initial"], **{f"final {k}": v for k, v in final.items()}})
  return rows


def paired(rows: list, a: str, b: str, key: str, student=None) -> list:
  """value(a) - value(b) of `key` per (student, seed) where both teachers' pairs have a finite value."""
  by = {(r["student"], r["seed"], r["teacher"]): r[key] for r in rows if np.isfinite(r[key])}
  return [by[(s, seed, a)] - by[(s, seed, b)] for (s, seed, t) in sorted(by) if t == a and (s, seed, b) in by
          and (student is None or s == student)]


def tests(rows: list) -> None:
  """The pre-registered tests (README, "Hypotheses"), in order."""
  ok = [r for r in rows if np.isfinite(r["recovery"])]
  print(f"\n## H1: does the initial overlap predict gap recovery better than teacher accuracy?\n\nEligible "
        f"(student, teacher, seed) triples (room >= {MIN_ROOM:.2f}): n = {len(ok)} of {len(rows)}.\n")
  print("| predictor | rho(recovery, predictor) | rho(recovery, teacher acc) | rho(predictor, teacher acc) | "
        "verdict |\n|---|---|---|---|---|")
  rec, acc = [r["recovery"] for r in ok], [r["acc_t"] for r in ok]
  for pred in (PRIMARY, "overlap@1", "hit@5", "hit@1", "reverse_kl"):
    x = [r[pred] for r in ok]
    r_p, r_a, r_pa = spearman(rec, x), spearman(rec, acc), spearman(x, acc)
    sign = -1 if pred == "reverse_kl" else 1           # a smaller KL is the higher compatibility
    if len(ok) < 10:
      v = "not tested (n < 10)"
    elif abs(r_pa) >= 0.9:
      v = "inconclusive (predictor and teacher accuracy rank the pairs alike)"
    elif sign * r_p - r_a >= TIE_RHO and sign * r_p > 0:
      v = "supported: the predictor does better"
    elif r_a - sign * r_p >= TIE_RHO:
      v = "contradicted: teacher accuracy does better"
    else:
      v = f"no difference (< {TIE_RHO})"
    print(f"| {pred}{' (primary)' if pred == PRIMARY else ''} | {r_p:+.2f} | {r_a:+.2f} | {r_pa:+.2f} | {v} |")
  within = [spearman([r["recovery"] for r in ok if r["seed"] == s and r["student"] == 128],
                     [r[PRIMARY] for r in ok if r["seed"] == s and r["student"] == 128]) for s in
            sorted({r["seed"] for r in ok})]
  within_acc = [spearman([r["recovery"] for r in ok if r["seed"] == s and r["student"] == 128],
                         [r["acc_t"] for r in ok if r["seed"] == s and r["student"] == 128]) for s in
                sorted({r["seed"] for r in ok})]
  print(f"\nWithin seed, student s128 (4 teachers each; secondary): mean rho(recovery, {PRIMARY}) = "
        f"{np.nanmean(within or [np.nan]):+.2f}, mean rho(recovery, teacher acc) = "
        f"{np.nanmean(within_acc or [np.nan]):+.2f} over {sum(np.isfinite(within))} seeds")
  print("\n## H2-H3 and student size: paired within (student, seed)\n\n| comparison | measure | per (student, seed) "
        "| mean | verdict |\n|---|---|---|---|---|")
  for a, b, student in (("t96rl", "t192sft", None), ("t96rl", "t96sft", 128), ("t192rl", "t192sft", 128)):
    for key, tie, scale in (("recovery", TIE_R, 1), ("gain", TIE_GAIN, 100)):
      d = paired(rows, a, b, key, student)
      cells = ", ".join(f"{scale * v:+.2f}" for v in d) or "-"
      print(f"| {a} - {b}{'' if student is None else f' (s{student})'} | {key}{' (points)' if scale > 1 else ''} "
            f"| {cells} | {scale * np.mean(d) if d else np.nan:+.2f} | {verdict(a, b, d, tie)} |")
  for teacher in ("t96rl", "t192sft"):
    by = {(r["student"], r["seed"]): r for r in rows if r["teacher"] == teacher}
    for key, tie, scale in (("recovery", TIE_R, 1), ("gain", TIE_GAIN, 100)):
      d = [by[(128, s)][key] - by[(64, s)][key] for (st, s) in sorted(by) if st == 128 and (64, s) in by
           and np.isfinite(by[(128, s)][key]) and np.isfinite(by[(64, s)][key])]
      print(f"| s128 - s64 from {teacher} | {key}{' (points)' if scale > 1 else ''} | "
            f"{', '.join(f'{scale * v:+.2f}' for v in d) or '-'} | {scale * np.mean(d) if d else np.nan:+.2f} | "
            f"{verdict('s128', 's64', d, tie)} |")
  print("\n## H4: is the most accurate teacher always the best one to distil from? (student s128)\n")
  beaten = []
  for seed in sorted({r["seed"] for r in rows}):
    grid = [r for r in rows if r["seed"] == seed and r["student"] == 128]
    if len(grid) < 4:
      continue
    top = max(grid, key=lambda r: r["acc_t"])
    best_other = max((r for r in grid if r is not top), key=lambda r: r["acc1"])
    beaten.append(best_other["acc1"] >= top["acc1"] + TIE_GAIN)
    print(f"- seed {seed}: most accurate teacher {top['teacher']} ({top['acc_t']:.3f}) -> student {top['acc1']:.3f}; "
          f"best other {best_other['teacher']} ({best_other['acc_t']:.3f}) -> {best_other['acc1']:.3f}")
  if beaten:
    v = ("supported (scores are not sufficient)" if 2 * sum(beaten) > len(beaten) else
         "contradicted (the most accurate teacher was never beaten)" if not any(beaten) else "mixed")
    print(f"\nA less accurate teacher gave a student at least {100 * TIE_GAIN:.0f} points better on "
          f"{sum(beaten)} of {len(beaten)} seeds: {v}")
  signed = [r for r in rows if abs(r["room"]) >= SIGN_ROOM]
  agree = [np.sign(r["gain"]) == np.sign(r["room"]) for r in signed]
  print(f"\n## H5: sign(gain) = sign(room) where |room| >= {SIGN_ROOM}: {sum(agree)} of {len(agree)} triples "
        f"(predicted: at least 80%); teacher below its student: "
        f"{[(r['arm'], r['seed'], round(100 * r['gain'], 1)) for r in signed if r['room'] < 0] or 'none'}")
  moved = [r for r in rows if np.isfinite(r.get(f"final {PRIMARY}", np.nan))]
  up = [r for r in moved if r["gain"] > TIE_GAIN]
  rose = sum(r[f"final {PRIMARY}"] > r[PRIMARY] for r in up)
  rho = spearman([r[f"final {PRIMARY}"] - r[PRIMARY] for r in moved], [r["gain"] for r in moved])
  print(f"\n## H6: {PRIMARY} rose in {rose} of the {len(up)} triples that gained > {100 * TIE_GAIN:.0f} points; "
        f"rho(change of {PRIMARY}, gain) = {rho:+.2f} over {len(moved)} triples")


def scatter(rows: list, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ok = [r for r in rows if np.isfinite(r["recovery"])]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for ax, key, label in ((axes[0], PRIMARY, f"initial {PRIMARY}"), (axes[1], "acc_t", "teacher accuracy")):
    for student, marker in zip(STUDENT_WIDTHS, "os"):
      for i, teacher in enumerate(TEACHERS):
        pts = [(r[key], r["recovery"]) for r in ok if r["student"] == student and r["teacher"] == teacher]
        if pts:
          ax.scatter(*zip(*pts), marker=marker, color=f"C{i}", label=f"s{student} from {teacher}")
    ax.set(xlabel=label, title=f"gap recovery vs {label}")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("gap recovery")
  axes[0].legend(fontsize=7)
  save_figure(fig, out)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/opd_scale")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p, one_plot=False)
  p.add_argument("--recompute", action="store_true", help="recompute the overlaps (DIR/overlaps.json)")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  bases = {s: base_accuracy(args.root, s) for s in seeds}
  names = list(TEACHERS) + [f"s{w}" for w in STUDENT_WIDTHS]
  print("| seed | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
  for s, b in bases.items():
    print(f"| {s} | " + " | ".join(f"{b[n]:.3f}" for n in names) + " |")
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "opd_scale",
                   base="", load=make_load(args.root))
  rows = pair_rows(runs, bases, overlaps(args.root, seeds, args.recompute))
  cols = ("acc_t", "acc0", "room", "acc1", "gain", "recovery", "overlap@1", "overlap@5", "hit@1", "hit@5",
          "reverse_kl", f"final {PRIMARY}")
  print("\nPer pair (mean and min-max over seeds; recovery over the seeds with room >= "
        f"{MIN_ROOM:.2f}):\n\n| pair | seeds | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols))
  for arm in ARMS:
    mine = [r for r in rows if r["arm"] == arm]
    if mine:
      cells = [spread([r[c] for r in mine if np.isfinite(r.get(c, np.nan))] or [np.nan]) for c in cols]
      print(f"| {arm} | {','.join(str(r['seed']) for r in mine)} | " + " | ".join(cells) + " |")
  tests(rows)
  if rows:
    scatter(rows, summary_path(args.out, args.root, "recovery.png"))


if __name__ == "__main__":
  main()
