"""experiments/trajectory_tree and benchmarks/tree_packing.py: at the --quick sizes the deduplicated tree with exact
weights gives the expanded paths' loss and gradient (to 1e-5) and QwenGyre's weights do not; a synthetic tree packs
the tokens its formula says; the J_max selections are nested and the leaf-only candidates end at the trie's leaves;
the archive keeps what it holds; summarize.py renders results.md with verdicts computed from a synthetic archive;
(slow) the sampled trees branch from their own completions."""
import json
import os

import numpy as np
import pytest

from benchmarks import tree_packing as tp
from experiments.trajectory_tree import run, summarize
from rlkit.rollout.tree import build_tree, pack_tree


def test_exact_weights_equal_the_expanded_paths_and_qwengyres_differ():
  model, params, _ = tp.model_and_params("quick")
  q = tp.QUICK_TREE
  calls = tp.synthetic_calls(q["paths"], q["path_len"], q["shared"], q["prompt_len"], model.cfg.vocab_size,
                             np.random.default_rng(0))
  row = tp.measure(model, params, calls, adv_seed=1, reps=1)
  assert row["loss_rel_scale"] < 1e-5 and row["loss_rel"] < 1e-5 and row["grad_rel_l2"] < 1e-5
  assert row["qwengyre_grad_rel_l2"] > 1e-3 and row["qwengyre_loss_rel_scale"] > 1e-3   # a trained trunk is shared
  assert (row["tokens_packed"], row["tokens_expanded"]) == tp.token_counts(q["paths"], q["path_len"], q["shared"])
  assert row["fwd_bwd_s_dedup"] > 0 and row["fwd_bwd_s_expanded"] > 0


@pytest.mark.parametrize("paths,shared", [(2, 0.0), (3, 0.25), (4, 0.5), (8, 0.9), (5, 1.0)])
def test_a_synthetic_tree_packs_the_tokens_of_its_formula(paths, shared):
  length, prompt = 40, 6
  calls = tp.synthetic_calls(paths, length, shared, prompt, 50, np.random.default_rng(3))
  tree = build_tree(calls)
  packed, expanded = tp.token_counts(paths, length, shared)
  assert pack_tree(tree, range(paths)).tokens.size == tree.tokens.size == packed
  assert expanded == paths * length == sum(c.prompt_ids.size + c.out_ids.size for c in calls)
  s = tp.shared_tokens(length, shared)
  assert abs(packed / expanded - (1 - shared * (paths - 1) / paths)) <= 1 / length + 1e-12 or s == length - 1
  assert tree.trainable.sum() == max(s - prompt, 0) + paths * (length - max(s, prompt))   # prompts never trained


def test_j_max_selections_are_nested_and_leaf_candidates_end_at_leaves():
  calls = run.agent_calls(run.AGENT["quick"], 64, np.random.default_rng([0, 1]))
  assert {c.role for c in calls} == set(run.ROLE_NAMES)
  tree = build_tree(calls)
  leaves = run.leaf_tree(tree)
  parents = set(tree.parent[tree.parent >= 0].tolist())
  assert 0 < leaves.leaves.size < tree.leaves.size and not parents & set(leaves.leaves.tolist())
  for t in (tree, leaves):
    chosen = run.selections(t, 0)
    assert chosen[1] == chosen[2][:1] and chosen[2] == chosen[5][:2] and chosen[5] == chosen[0][:len(chosen[5])]
    assert pack_tree(t, chosen[0]).trainable.sum() == tree.trainable.sum()      # uncapped trains every token


def test_the_archive_keeps_what_it_holds_and_never_takes_quick_lines(tmp_path):
  root, dest = tmp_path / "root", tmp_path / "dest"
  root.mkdir()
  lines = [{"key": "a", "v": 1}, {"key": "b", "v": 2}, {"key": "q", "v": 3, "quick": True}]
  (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  (root / "sampled_calls_s0.json").write_text("{}")
  assert run.archive(str(root), str(dest)) == 2
  (root / "results.jsonl").write_text(json.dumps({"key": "a", "v": 9}) + "\n" + json.dumps({"key": "c", "v": 4}) + "\n")
  assert run.archive(str(root), str(dest)) == 1
  assert [json.loads(x) for x in (dest / "results.jsonl").read_text().splitlines()] == [
      {"key": "a", "v": 1}, {"key": "b", "v": 2}, {"key": "c", "v": 4}]
  assert (dest / "sampled_calls_s0.json").exists()
  assert run.without_lock(["--root=x", "--lock", "/l", "--quick", "--lock=/m"]) == ["--root=x", "--quick"]


ENV = {"size": "base", "params": 4_900_000, "reps": 5, "commit": "abc1234", "jax": "0.10.2", "cpu": "AMD EPYC",
       "cpu_isa": "avx2", "cpu_cores": 2}


def _grid_row(b, f, seed, time_ratio, qwengyre, grad_rel=1e-7):
  length, prompt = 256, 16
  s = tp.shared_tokens(length, f)
  packed, expanded = tp.token_counts(b, length, f)
  return {"type": "grid", "key": f"grid/b{b}/f{f:.2f}/s{seed}", "seed": seed, "branching": b, "shared": f,
          "path_len": length, "prompt_len": prompt, "shared_tokens": s, "tokens_packed_formula": packed,
          "token_ratio_formula": 1 - f * (b - 1) / b, "paths": b, "tokens_packed": packed, "tokens_expanded": expanded,
          "token_ratio": packed / expanded, "fwd_bwd_s_dedup": 0.1 * time_ratio, "fwd_bwd_s_expanded": 0.1,
          "time_ratio": time_ratio, "loss_rel_scale": 1e-7, "loss_rel": 2e-7, "grad_rel_l2": grad_rel,
          "grad_max_abs": 1e-8, "qwengyre_loss_rel_scale": qwengyre, "qwengyre_grad_rel_l2": qwengyre, **ENV}


def _jmax_row(sel, j, seed, coverage, time_rel, norm, cos):
  return {"type": "jmax", "key": f"jmax/{sel}/J{j or 'all'}/s{seed}", "seed": seed, "selection": sel, "j_max": j,
          "calls": 30, "tree_tokens": 1700, "trainable_total": 800,
          "role_tokens": {"main": 400, "main summary": 48, "sub-agent": 288, "sub-agent summary": 128},
          "leaves": j or 9, "tokens_packed": int(1700 * time_rel), "coverage": coverage, "time_rel": time_rel,
          "grad_norm_rel": norm, "cos": cos, "exact_grad_norm_rel": norm, "exact_cos": cos, **ENV}


def _archive(path, grad_rel=1e-7, quick=False):
  rows = []
  for seed in (0, 1):
    for b in (2, 4):
      for f, t in ((0.0, 1.3), (0.5, 0.9), (0.9, 0.7)):
        rows.append(_grid_row(b, f, seed, t, 0.0 if f == 0 else f / 2, grad_rel if (b, f) == (4, 0.9) else 1e-7))
    for sel in ("calls", "leaves"):
      for j, cov, t, norm, cos in ((1, 0.1, 0.3, 2.0, 0.4), (2, 0.2, 0.5, 1.5, 0.6), (5, 0.4, 0.7, 1.1, 0.9),
                                   (0, 1.0, 1.0, 1.0, 1.0)):
        rows.append(_jmax_row(sel, j, seed, cov, t, norm, cos))
  rows += [{"type": "sampled_skipped", "key": "sampled/skipped", "reason": "experiments/base/model does not exist"},
           {"type": "wall", "key": "wall/all/0,1/1", "part": "all", "seeds": [0, 1], "wall_s": 1234.0}]
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "results.jsonl"), "w") as f:
    f.writelines(json.dumps({**r, "quick": quick}) + "\n" for r in rows)


def _verdicts(text):
  return {line.split("|")[1].strip(): line.split("|")[3].strip() for line in text.splitlines()
          if line.startswith("| H")}


def test_summarize_renders_results_md_with_verdicts_from_the_numbers(tmp_path, capsys):
  root, out = str(tmp_path / "runs"), str(tmp_path / "out")
  _archive(root)
  assert summarize.main([f"--root={root}", f"--out={out}"]) == 0
  text = open(os.path.join(out, "results.md")).read()
  assert text == capsys.readouterr().out.split("\nresults: ")[0]              # printed as written
  assert os.path.getsize(os.path.join(out, "trajectory_tree.png")) > 0
  assert not os.path.exists(os.path.join(root, "results.md"))              # --out given: nothing into the archive
  v = _verdicts(text)
  assert v["H1"] == v["H2a"] == v["H2b"] == v["H2c"] == v["H3"] == v["H4"] == "supported"
  assert v["H5a (calls)"] == v["H5b (leaves)"] == "supported"
  assert "`abc1234`" in text and "1234 s" in text and "experiments/base/model does not exist" in text
  assert "| 4 | 0.90 | 230 | 334 | 1024 | 0.3262 | 0.3250 | 334 |" in text
  assert f"summarize.py --root={root}" in text

  _archive(root, grad_rel=3e-5)                                            # one point breaks equality
  summarize.main([f"--root={root}", f"--out={out}"])
  assert _verdicts(open(os.path.join(out, "results.md")).read())["H3"] == "not supported"

  _archive(root, quick=True)
  summarize.main([f"--root={root}", f"--out={out}"])
  assert set(_verdicts(open(os.path.join(out, "results.md")).read()).values()) == {"smoke run"}


@pytest.mark.slow
def test_sampled_branches_continue_a_prefix_of_a_completion_and_pack_exactly():
  """run.py's sampled trees on a random toy model (the base's stand-in): each branch's context is the prompt plus
  the start of one of the completions, and the tree trains like its expanded paths."""
  model, params, _ = tp.model_and_params("quick")
  prompt = [1, 5, 7, 9]
  calls = run.sampled_calls(model, params, prompt, (2,), group=3, branches=3, max_new_tokens=8, seed=0)
  completions, branches = calls[:3], calls[3:]
  assert branches and all(c.prompt_ids.tolist() == prompt for c in completions)
  for c in branches:
    cut = c.prompt_ids.size - len(prompt)
    assert cut >= 1 and any(t.out_ids[:cut].tolist() == c.prompt_ids[len(prompt):].tolist() for t in completions)
  row = tp.measure(model, params, calls, adv_seed=1, reps=1)
  assert row["grad_rel_l2"] < 1e-5 and row["tokens_packed"] < row["tokens_expanded"]
