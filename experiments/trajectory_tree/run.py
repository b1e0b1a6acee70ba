"""Trajectory trees (QwenGyre, methods/systems.md §5; the pre-registration is README.md): dedup packing against
expanded paths over shared-prefix fraction and branching, on sampled trees, and the J_max ablation of bounded dedup
sampling. Every measurement runs in this process through benchmarks/tree_packing.py's functions.

  python experiments/trajectory_tree/run.py --root=/tmp/trajectory_tree [--lock=/tmp/cpu.lock]     # all, archive
  python experiments/trajectory_tree/run.py --root=DIR --part=grid|sampled|jmax [--seeds=0]
  python experiments/trajectory_tree/run.py --root=DIR --quick                # smoke sizes, seed 0, no archive
  python experiments/trajectory_tree/summarize.py --root=experiments/trajectory_tree/runs

Parts (seeds 0-2 draw the random trees, advantages and leaf selections; the model's random weights are key 0):
  grid     synthetic star trees (benchmarks/tree_packing.synthetic_calls): B leaves of L tokens sharing a trunk of
           round(f L), f in SHARED x B in BRANCHING; one `measure` each (tokens, fwd+bwd time, equality).
  sampled  trees the pretrained base samples itself (experiments/base/model; skipped, with a row saying so, where
           it is absent): G completions of one prompt of its worked_steps skill, plus K branches resampled from
           random cut points of those completions (rlkit.rollout.resumable: prefill the cut context, decode_until),
           measured with the base's own weights; the calls are kept in ROOT/sampled_calls_s<seed>.json.
  jmax     a multi-role agent execution (`agent_calls`: main calls with retries and one compaction, the main
           summary, sub-agents and their summaries, prefixes shared as a harness shares them), select_leaves at
           each J_MAX (the same rng, so the selections are nested) over two candidate sets (SELECTIONS: every
           call, as rlkit's select_leaves draws, or the trie's leaves only, `leaf_tree`): coverage, fwd+bwd time
           relative to uncapped (all arms timed in the same rounds), and the gradient of QwenGyre's objective
           (the execution's advantage on every trained token once, averaged per token) and of ours (exact
           weights, sequence-mean): norm, cosine with uncapped.

One JSON line per measurement in ROOT/results.jsonl, each with a `type` and a unique `key`; a key already there is
skipped, so a rerun resumes (the summary keeps the last line of each key). After the run the lines (and the sampled
calls) are archived into --archive (experiments/trajectory_tree/runs; nowhere for --quick), experiments/archive.py's
conventions for a JSON-lines experiment: a key already archived is left as it is.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from rlkit.rollout.tree import TITOCall, build_tree, select_leaves  # noqa: E402

ARCHIVE = os.path.join("experiments", "trajectory_tree", "runs")
BASE = os.path.join("experiments", "base", "model")
RESULTS = "results.jsonl"
MAIN, MAIN_SUMMARY, SUB, SUB_SUMMARY = 0, 1, 2, 3             # select_leaves' role priority (0 first)
ROLE_NAMES = {MAIN: "main", MAIN_SUMMARY: "main summary", SUB: "sub-agent", SUB_SUMMARY: "sub-agent summary"}
J_MAX = (1, 2, 5, 0)                                          # 0: uncapped
SELECTIONS = ("calls", "leaves")       # select_leaves' candidates: every call's end (rlkit) | the trie's leaves only

# An agent execution, in tokens (`agent_calls`).
AGENT = {
    "full": dict(prompt=64, turns=12, out=24, obs=32, retry=0.25, compact_at=6, instruction=8, summary=48,
                 spawn_at=(3, 9), subagents=2, sub_prompt=48, task=16, sub_turns=3, sub_obs=24, sub_summary=32),
    "quick": dict(prompt=6, turns=4, out=4, obs=4, retry=0.25, compact_at=2, instruction=2, summary=4,
                  spawn_at=(1,), subagents=2, sub_prompt=4, task=2, sub_turns=2, sub_obs=3, sub_summary=3),
}
SIZES = {
    "full": dict(size="base", path_len=256, prompt_len=16, shared=(0.0, 0.25, 0.5, 0.75, 0.9), branching=(2, 4, 8),
                 reps=5, seeds=(0, 1, 2), group=8, branches=8, max_new_tokens=64, agent=AGENT["full"]),
    "quick": dict(size="quick", path_len=24, prompt_len=4, shared=(0.0, 0.5, 0.9), branching=(2, 4), reps=2,
                  seeds=(0,), group=3, branches=3, max_new_tokens=8, agent=AGENT["quick"]),
}


# ------------------------------------------------------------------------------------------------ results

class Log:
  """ROOT/results.jsonl: `done(key)` says whether a line has that key; calling appends one."""

  def __init__(self, root: str, quick: bool):
    self.path, self.quick = os.path.join(root, RESULTS), quick
    self.keys = {r["key"] for r in read_rows(self.path)}

  def done(self, key: str) -> bool:
    if key in self.keys:
      print(f"[trajectory_tree] {key}: measured, skipped", flush=True)
    return key in self.keys

  def __call__(self, **row):
    row = {**row, "quick": self.quick, "time": time.time()}
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    self.keys.add(row["key"])
    print(f"[trajectory_tree] {row['key']}: " + ", ".join(
        f"{k} {row[k]:.4g}" for k in ("token_ratio", "time_ratio", "grad_rel_l2", "qwengyre_grad_rel_l2",
                                      "coverage", "time_rel", "cos") if isinstance(row.get(k), float)), flush=True)


def read_rows(path: str) -> list:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def archive(root: str, dest: str) -> int:
  """Appends ROOT's result lines whose key DEST does not hold yet to DEST/results.jsonl (written whole, then
  renamed: never half), and copies the sampled calls not there yet; returns the lines archived."""
  os.makedirs(dest, exist_ok=True)
  path = os.path.join(dest, RESULTS)
  kept = read_rows(path)
  have = {r["key"] for r in kept}
  new = [r for r in read_rows(os.path.join(root, RESULTS)) if r["key"] not in have and not r.get("quick")]
  if new:
    with open(path + ".tmp", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept + new)
    os.replace(path + ".tmp", path)
  for name in sorted(os.listdir(root)):
    if name.startswith("sampled_calls_") and not os.path.exists(os.path.join(dest, name)):
      shutil.copy(os.path.join(root, name), os.path.join(dest, name))
  return len(new)


# ------------------------------------------------------------------------------------------------ grid

def part_grid(root: str, sizes: dict, seeds, log: Log) -> None:
  from benchmarks import tree_packing as tp
  model, params, what = tp.model_and_params(sizes["size"])
  for seed in seeds:
    for b in sizes["branching"]:
      for f in sizes["shared"]:
        key = f"grid/b{b}/f{f:.2f}/s{seed}"
        if log.done(key):
          continue
        calls = tp.synthetic_calls(b, sizes["path_len"], f, sizes["prompt_len"], model.cfg.vocab_size,
                                   np.random.default_rng(seed))
        row = tp.measure(model, params, calls, 1000 + seed, sizes["reps"])
        packed, _ = tp.token_counts(b, sizes["path_len"], f)
        log(type="grid", key=key, seed=seed, branching=b, shared=f, path_len=sizes["path_len"],
            prompt_len=sizes["prompt_len"], shared_tokens=tp.shared_tokens(sizes["path_len"], f),
            tokens_packed_formula=packed, token_ratio_formula=1 - f * (b - 1) / b, **_env(what, params, sizes), **row)


def _env(what: str, params, sizes: dict) -> dict:
  from benchmarks._common import commit, cpu_info
  import jax
  from rlkit.models.transformer import num_params
  return {"size": what, "params": num_params(params), "reps": sizes["reps"], "commit": commit(),
          "jax": jax.__version__, **cpu_info()}


# ------------------------------------------------------------------------------------------------ sampled

def sampled_calls(model, params, prompt_ids, stop_ids, group: int, branches: int, max_new_tokens: int,
                  seed: int, pad_id: int = 0) -> list:
  """`group` completions of `prompt_ids` and `branches` continuations resampled from random cut points of them
  (a completion drawn uniformly, a cut uniform in 1..its length - 1), as TITO calls: a branch's context is the
  prompt + the completion's first tokens, its output what was sampled after them. Temperature 1, stop at
  `stop_ids`, at most `max_new_tokens` per call. Keys: fold_in(key(seed), 0) for the completions, 1 for the
  branches; the choices of completion and cut from default_rng(seed)."""
  import jax
  import jax.numpy as jnp

  from rlkit.rollout.resumable import decode_until, prefill
  from rlkit.rollout.sampler import SamplingConfig
  cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0, stop_ids=tuple(stop_ids), pad_id=pad_id)
  key = jax.random.key(seed)

  def sample(contexts, k):
    width = max(len(c) for c in contexts)
    toks = np.full((len(contexts), width), pad_id, np.int32)
    mask = np.zeros((len(contexts), width), bool)
    for i, c in enumerate(contexts):                       # left-padded
      toks[i, width - len(c):], mask[i, width - len(c):] = c, True
    state = prefill(model, params, jnp.asarray(toks), jnp.asarray(mask), jax.random.fold_in(key, k), max_new_tokens,
                    pad_id)
    state = decode_until(model, params, state, cfg)
    out, lp, m = (np.asarray(x) for x in (state.tokens, state.logprobs, state.sampled_mask))
    return [(out[i][m[i]], lp[i][m[i]]) for i in range(len(contexts))]

  prompt = [int(t) for t in prompt_ids]
  calls = [TITOCall(np.asarray(prompt, np.int32), o, lp, 0) for o, lp in sample([prompt] * group, 0)]
  rng = np.random.default_rng(seed)
  trunks = [c for c in calls if c.out_ids.size >= 2]
  if not trunks:
    return calls
  contexts = []
  for _ in range(branches):
    trunk = trunks[int(rng.integers(len(trunks)))]
    cut = int(rng.integers(1, trunk.out_ids.size))
    contexts.append(prompt + trunk.out_ids[:cut].tolist())
  calls += [TITOCall(np.asarray(c, np.int32), o, lp, 0) for c, (o, lp) in zip(contexts, sample(contexts, 1))
            if o.size]
  return calls


def base_prompt(tokenizer, seed: int) -> list:
  """A prompt of the base's worked_steps skill (experiments/base/config.py), drawn with `seed`."""
  from experiments.base.config import SKILLS
  from rlkit.data.tasks import make_task
  skill = SKILLS["worked_steps"]
  text = make_task(skill["task"], **skill["kwargs"]).make_example(np.random.default_rng(seed))["prompt"]
  return tokenizer.encode(text, add_bos=tokenizer.bos_id is not None)


def part_sampled(root: str, sizes: dict, seeds, log: Log, model_path: str) -> None:
  if not os.path.exists(os.path.join(model_path, "config.json")):
    if not log.done("sampled/skipped"):
      log(type="sampled_skipped", key="sampled/skipped",
          reason=f"{model_path} does not exist (the pretrained base is not built yet)")
    return
  from benchmarks import tree_packing as tp
  model, params, what = tp.model_and_params(model_path=model_path)
  from rlkit.train.models import load_model
  tokenizer = load_model(model_path)[2]
  for seed in seeds:
    key = f"sampled/s{seed}"
    if log.done(key):
      continue
    file = os.path.join(root, f"sampled_calls_s{seed}.json")
    if not os.path.exists(file):
      calls = sampled_calls(model, params, base_prompt(tokenizer, seed), tokenizer.stop_ids, sizes["group"],
                            sizes["branches"], sizes["max_new_tokens"], seed, tokenizer.pad_id)
      tp.save_calls(calls, file + ".tmp")
      os.replace(file + ".tmp", file)
    calls = tp.load_calls(file)
    row = tp.measure(model, params, calls, 1000 + seed, sizes["reps"])
    log(type="sampled", key=key, seed=seed, calls_file=os.path.basename(file), group=sizes["group"],
        branches=sizes["branches"], **_env(what, params, sizes), **row)


# ------------------------------------------------------------------------------------------------ J_max

def agent_calls(spec: dict, vocab: int, rng: np.random.Generator) -> list:
  """The TITO calls of one synthetic agent execution (token counts from `spec`, ids random):

  main     `turns` calls on one growing context (the prompt, then each call's output and its observation); a call
           is retried with probability `retry` (the discarded attempt is a sibling leaf with the same context)
  compact  before turn `compact_at` a main-summary call (the context + an instruction) writes a summary, and the
           main agent continues from prompt + summary (a new branch at the prompt; the summary is context there)
  spawn    after turns `spawn_at` the main output's first `task` tokens go to `subagents` sub-agents, each from a
           shared sub-agent prompt: `sub_turns` calls with observations, then a sub-agent-summary call; the
           summaries are that turn's observation of the main agent
  """
  draw = lambda n: rng.integers(1, vocab, n).astype(np.int32)             # noqa: E731
  calls = []

  def call(context, n_out, role):
    out = draw(n_out)
    calls.append(TITOCall(np.asarray(context, np.int32), out, -rng.exponential(1.0, n_out).astype(np.float32), role))
    return out.tolist()

  prompt, sub_prompt, instruction = draw(spec["prompt"]).tolist(), draw(spec["sub_prompt"]).tolist(), \
      draw(spec["instruction"]).tolist()
  context = list(prompt)
  for turn in range(spec["turns"]):
    if turn == spec["compact_at"]:
      context = prompt + call(context + instruction, spec["summary"], MAIN_SUMMARY)
    if rng.random() < spec["retry"]:
      call(context, spec["out"], MAIN)
    out = call(context, spec["out"], MAIN)
    context += out
    if turn in spec["spawn_at"]:
      obs = []
      for _ in range(spec["subagents"]):
        sub = sub_prompt + out[:spec["task"]]
        for _ in range(spec["sub_turns"]):
          sub += call(sub, spec["out"], SUB) + draw(spec["sub_obs"]).tolist()
        obs += call(sub + instruction, spec["sub_summary"], SUB_SUMMARY)
    else:
      obs = draw(spec["obs"]).tolist()
    context += obs
  return calls


def leaf_tree(tree):
  """`tree` with its candidate leaves cut to the calls that end at a leaf of the trie (a node without children):
  QwenGyre's wording ("a leaf is drawn"), where select_leaves on `tree` draws from every call, also one whose last
  token is inside another call's path (a main call that the next main call extends)."""
  has_child = np.zeros(tree.tokens.shape, bool)
  has_child[tree.parent[tree.parent >= 0]] = True
  keep = ~has_child[tree.leaves]
  return tree._replace(leaves=tree.leaves[keep], roles=tree.roles[keep])


def selections(tree, seed: int, j_values=J_MAX) -> dict:
  """{J: the candidates select_leaves chooses with j_max J (0: uncapped)}, each from default_rng([seed, 2]): the
  draws are the same sequence, so a smaller J's choice is the start of a larger one's."""
  return {j: select_leaves(tree, j or len(tree.leaves), np.random.default_rng([seed, 2])) for j in j_values}


def part_jmax(root: str, sizes: dict, seeds, log: Log) -> None:
  import jax
  import jax.numpy as jnp

  from benchmarks import tree_packing as tp
  from benchmarks._common import interleaved_median_times
  from rlkit.rollout.tree import node_weights
  model, params, what = tp.model_and_params(sizes["size"])
  f_dedup = tp.dedup_fn(model)
  for seed in seeds:
    keys = {(sel, j): f"jmax/{sel}/J{j or 'all'}/s{seed}" for sel in SELECTIONS for j in J_MAX}
    if all(log.done(k) for k in keys.values()):
      continue
    calls = agent_calls(sizes["agent"], model.cfg.vocab_size, np.random.default_rng([seed, 1]))
    full = build_tree(calls)
    total = int(full.trainable.sum())
    role_tokens = {ROLE_NAMES[r]: int(sum(c.out_ids.size for c in calls if c.role == r)) for r in ROLE_NAMES}
    arms, fns = {}, {}
    for sel in SELECTIONS:
      tree = full if sel == "calls" else leaf_tree(full)
      for j, picked in selections(tree, seed).items():
        packed, inputs = tp.packed_inputs(tree, picked)
        ones = np.ones(len(picked))
        n = max(int(packed.trainable.sum()), 1)
        # QwenGyre: each trained token once with the execution's advantage (1 here), averaged over the trained tokens
        w_gyre = jnp.asarray(node_weights(tree, packed, picked, ones, "token_sum", "qwengyre") / n)
        w_exact = jnp.asarray(node_weights(tree, packed, picked, ones, "seq_mean", "exact"))
        t0 = time.perf_counter()
        _, g_gyre = jax.block_until_ready(f_dedup(params, *inputs, w_gyre))
        first = time.perf_counter() - t0
        _, g_exact = f_dedup(params, *inputs, w_exact)
        arms[sel, j] = {"candidates": len(tree.leaves), "leaves": len(picked),
                        "roles": [int(tree.roles[c]) for c in picked], "tokens_packed": int(packed.tokens.size),
                        "trained_tokens": int(packed.trainable.sum()),
                        "coverage": float(packed.trainable.sum() / total), "first_call_s": first,
                        "g_gyre": tp.flat(g_gyre), "g_exact": tp.flat(g_exact)}
        fns[sel, j] = (lambda inputs=inputs, w=w_gyre: jax.block_until_ready(f_dedup(params, *inputs, w)))
    times = interleaved_median_times(fns, sizes["reps"])
    for (sel, j), arm in arms.items():
      ref, ref_t = arms[sel, 0], times[sel, 0]
      g, ge = arm["g_gyre"], arm["g_exact"]
      log(type="jmax", key=keys[sel, j], seed=seed, selection=sel, j_max=j, calls=len(calls),
          tree_tokens=int(full.tokens.size), trainable_total=total, role_tokens=role_tokens,
          **{k: v for k, v in arm.items() if not k.startswith("g_")}, fwd_bwd_s=times[sel, j],
          time_rel=times[sel, j] / ref_t, tokens_rel=arm["tokens_packed"] / ref["tokens_packed"],
          grad_norm=float(np.linalg.norm(g)), grad_norm_rel=float(np.linalg.norm(g) / np.linalg.norm(ref["g_gyre"])),
          cos=_cos(g, ref["g_gyre"]),
          exact_grad_norm_rel=float(np.linalg.norm(ge) / np.linalg.norm(ref["g_exact"])),
          exact_cos=_cos(ge, ref["g_exact"]), **_env(what, params, sizes))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
  return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


# ------------------------------------------------------------------------------------------------ main

def without_lock(argv: list) -> list:
  """The command line without its --lock option (`--lock=X` or `--lock X`)."""
  out, skip = [], False
  for x in argv:
    if skip or x.startswith("--lock="):
      skip = False
    elif x == "--lock":
      skip = True
    else:
      out.append(x)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True, help="the run's folder: results.jsonl and the sampled calls")
  p.add_argument("--part", default="all", choices=("all", "grid", "sampled", "jmax"))
  p.add_argument("--seeds", default="", help="comma-separated seeds (default: 0,1,2; --quick: 0)")
  p.add_argument("--model", default=BASE, help="the pretrained base for the sampled trees (an HF folder)")
  p.add_argument("--quick", action="store_true", help="smoke sizes (its summary reads 'smoke run')")
  p.add_argument("--archive", default=None, help=f"where to archive (default {ARCHIVE}; '' or --quick: nowhere)")
  p.add_argument("--lock", default="", help="run everything under `flock LOCK`")
  a = p.parse_args(argv)
  a.root = os.path.abspath(a.root)
  if a.lock and not os.environ.get("TRAJECTORY_TREE_LOCKED"):
    cmd = ["flock", a.lock, sys.executable, os.path.abspath(__file__), *without_lock(argv or sys.argv[1:])]
    return subprocess.call(cmd, env=dict(os.environ, TRAJECTORY_TREE_LOCKED="1"))
  os.chdir(ROOT)      # the model's and the archive's relative paths are the repository's
  sizes = SIZES["quick" if a.quick else "full"]
  seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(sizes["seeds"])
  dest = ("" if a.quick else ARCHIVE) if a.archive is None else a.archive
  os.makedirs(a.root, exist_ok=True)
  log = Log(a.root, a.quick)
  t0 = time.time()
  if a.part in ("all", "grid"):
    part_grid(a.root, sizes, seeds, log)
  if a.part in ("all", "sampled"):
    part_sampled(a.root, sizes, seeds, log, a.model)
  if a.part in ("all", "jmax"):
    part_jmax(a.root, sizes, seeds, log)
  log(type="wall", key=f"wall/{a.part}/{','.join(map(str, seeds))}/{time.time():.0f}", part=a.part, seeds=seeds,
      wall_s=time.time() - t0)
  if dest:
    print(f"[trajectory_tree] archived {archive(a.root, dest)} new line(s) into {dest}", flush=True)
  print(f"done in {time.time() - t0:.0f}s: {log.path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
