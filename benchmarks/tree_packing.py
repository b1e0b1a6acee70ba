"""Trajectory-tree packing (QwenGyre, methods/systems.md §5): one tree of model calls trained once as a packed trie
(`rlkit.rollout.tree`: tree attention, depth positions, exact per-token weights) against the same calls trained
as expanded root-to-leaf rows, side by side in one process.

For one model and one tree (synthetic: `--paths` B leaves of `--path_len` L tokens sharing a trunk of
round(`--shared` f * L) tokens, the first `--prompt_len` tokens of each path its untrained prompt; or the calls of
`--calls_json`, e.g. sampled by experiments/trajectory_tree/run.py) prints one JSON line:

  tokens      packed (the trie's nodes on the chosen paths) vs expanded (the sum of the path lengths; `padded`: the
              right-padded batch the expanded side runs); a synthetic tree packs s + B(L - s) of B*L, s = round(fL),
              i.e. a ratio of 1 - f(B-1)/B
  time        median wall seconds of one jitted loss value_and_grad of each side, `--reps` rounds taking turns
              (benchmarks/_common.interleaved_median_times) after a compile warm-up
  equality    the linear objective sum_l c_l A_l sum_{t in path(l)} log p_t (A_l from a seeded rng, c_l = 1/|path's
              trainable tokens| for `--norm seq_mean`, 1 for token_sum): dedup with exact `node_weights` against the
              expanded rows, relative loss difference (to |L| and to the objective's scale sum |w||log p|, which
              cannot cancel) and gradient difference (L2 relative, max abs); the same for QwenGyre's weights
              (`weights="qwengyre"`: each path's new tokens once), which differ wherever a trained token is shared

  python benchmarks/tree_packing.py [--size base] [--paths 4 --path_len 256 --shared 0.5] [--reps 5] [--seed 0]
  python benchmarks/tree_packing.py --calls_json CALLS.json [--model HF_FOLDER]
  python benchmarks/tree_packing.py --quick            # smoke: tiny model and tree, 2 reps

Sizes: `base` is the pretrained base's shape (experiments/base/config.py "7m": vocabulary 588, hidden 256, 6
layers, 4 / 2 heads of 64, MLP 768, tied; 4.9M parameters, random weights here), S and M those of
benchmarks/sampler.py, `quick` a one-layer toy. float32 throughout; attention "xla" (the tree mask is an input).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from benchmarks._common import SIZES, commit, cpu_info, interleaved_median_times  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig, init_params, num_params  # noqa: E402
from rlkit.rollout.tree import (TITOCall, Tree, build_tree, node_weights, pack_tree, path,  # noqa: E402
                                tree_logprobs, tree_mask)

TREE_SIZES = {
    **SIZES,
    "base": TransformerConfig(vocab_size=588, hidden_size=256, intermediate_size=768, num_layers=6, num_heads=4,
                              num_kv_heads=2, head_dim=64, rope_theta=10_000.0, tie_word_embeddings=True),
    "quick": TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                               num_kv_heads=1, head_dim=16, rope_theta=10_000.0, tie_word_embeddings=True),
}
QUICK_TREE = dict(paths=3, path_len=24, shared=0.5, prompt_len=4)


# ------------------------------------------------------------------------------------------------ trees

def shared_tokens(path_len: int, shared: float) -> int:
  """s = round(f L), at most L - 1: every path keeps a token of its own (its branch)."""
  return min(int(round(shared * path_len)), path_len - 1)


def token_counts(paths: int, path_len: int, shared: float) -> tuple[int, int]:
  """(packed, expanded) tokens of a synthetic star tree: s + B(L - s) and B L."""
  s = shared_tokens(path_len, shared)
  return s + paths * (path_len - s), paths * path_len


def synthetic_calls(paths: int, path_len: int, shared: float, prompt_len: int, vocab: int,
                    rng: np.random.Generator) -> list[TITOCall]:
  """B calls whose paths (prompt + output, L tokens each) share a trunk of s = round(f L) tokens and then branch
  (a star; f = 0 is a forest of B unrelated paths). The branches' first tokens are distinct, so the trie splits
  exactly at s. Each call's first `prompt_len` tokens are its prompt (attended, never trained), the rest the
  policy's output: a trunk token past the prompt is trained on every path through it."""
  if paths < 1 or not 0 <= shared <= 1 or not 0 <= prompt_len < path_len or paths >= vocab:
    raise ValueError(f"synthetic_calls: paths={paths} (1..vocab-1), shared={shared} (0..1), prompt_len={prompt_len} "
                     f"(0..path_len-1={path_len - 1}).")
  s = shared_tokens(path_len, shared)
  trunk = rng.integers(1, vocab, s)
  firsts = rng.choice(np.arange(1, vocab), paths, replace=False)
  calls = []
  for i in range(paths):
    seq = np.concatenate([trunk, [firsts[i]], rng.integers(1, vocab, path_len - s - 1)]).astype(np.int32)
    out = seq[prompt_len:]
    calls.append(TITOCall(seq[:prompt_len], out, -rng.exponential(1.0, out.size).astype(np.float32), 0))
  return calls


def save_calls(calls: Sequence[TITOCall], file: str) -> None:
  with open(file, "w") as f:
    json.dump({"calls": [{"prompt_ids": np.asarray(c.prompt_ids).tolist(), "out_ids": np.asarray(c.out_ids).tolist(),
                          "out_logp": np.asarray(c.out_logp, np.float64).tolist(), "role": int(c.role)}
                         for c in calls]}, f)


def load_calls(file: str) -> list[TITOCall]:
  """The calls of a JSON file: {"calls": [{prompt_ids, out_ids, out_logp, role}, ...]} (or the bare list)."""
  with open(file) as f:
    data = json.load(f)
  rows = data["calls"] if isinstance(data, dict) else data
  return [TITOCall(np.asarray(r["prompt_ids"], np.int32), np.asarray(r["out_ids"], np.int32),
                   np.asarray(r.get("out_logp", np.zeros(len(r["out_ids"]))), np.float32), int(r.get("role", 0)))
          for r in rows]


# ------------------------------------------------------------------------------------------------ the two sides

@functools.lru_cache(maxsize=None)       # one jitted function per model: measurements of one shape share a compile
def dedup_fn(model: Transformer):
  """jitted value_and_grad of sum_t w_t log p_t over a packed tree [1, L]; aux: the scale sum_t |w_t| |log p_t|."""
  def loss(params, tokens, positions, mask, parent, w):
    logits = model.apply({"params": params}, tokens, positions, method=Transformer.forward, tree_mask=mask).logits
    lp = tree_logprobs(logits, tokens, parent)[0]
    return jnp.sum(w * lp), jnp.sum(jnp.abs(w) * jnp.abs(lp))
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


@functools.lru_cache(maxsize=None)
def expanded_fn(model: Transformer):
  """jitted value_and_grad of sum_l scale_l sum_t train[l, t] log p(row l, t) over right-padded rows [N, W]
  (padding after a path's end is never attended by its tokens, so no mask is needed)."""
  def loss(params, seqs, train, scale):
    positions = jnp.broadcast_to(jnp.arange(seqs.shape[1]), seqs.shape)
    logits = model.apply({"params": params}, seqs, positions, method=Transformer.forward).logits
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1), seqs[:, 1:, None], -1)[..., 0]
    return jnp.sum(scale * jnp.sum(jnp.where(train, lp, 0.0), 1))
  return jax.jit(jax.value_and_grad(loss))


def packed_inputs(tree: Tree, chosen: Sequence[int]):
  """(Packed, device inputs tokens, positions, mask, parent) of the chosen calls' paths."""
  packed = pack_tree(tree, chosen)
  return packed, (jnp.asarray(packed.tokens)[None], jnp.asarray(packed.positions)[None],
                  jnp.asarray(tree_mask(packed.parent))[None], jnp.asarray(packed.parent)[None])


def expanded_inputs(tree: Tree, chosen: Sequence[int], advantages, norm: str):
  """Each chosen path as a right-padded row: (seqs [N, W], train [N, W-1] of the predicted tokens, scale c_l A_l),
  and the path lengths."""
  paths = [path(tree, int(tree.leaves[c])) for c in chosen]
  width = max(p.size for p in paths)
  seqs, train = np.zeros((len(paths), width), np.int32), np.zeros((len(paths), width), bool)
  for i, nodes in enumerate(paths):
    seqs[i, :nodes.size], train[i, :nodes.size] = tree.tokens[nodes], tree.trainable[nodes]
  count = np.maximum(train.sum(1), 1)
  scale = np.asarray(advantages, np.float64) * (1.0 / count if norm == "seq_mean" else 1.0)
  return (jnp.asarray(seqs), jnp.asarray(train[:, 1:]), jnp.asarray(scale, jnp.float32)), [p.size for p in paths]


def flat(grads) -> np.ndarray:
  return np.asarray(ravel_pytree(grads)[0], np.float64)


def differences(loss_a, scale_a, grad_a, loss_b, grad_b) -> dict:
  """How far (loss_a, grad_a) is from (loss_b, grad_b): relative to |loss_b|, to the objective's scale, L2 relative
  and max abs of the flattened gradients."""
  da = abs(float(loss_a) - float(loss_b))
  ga, gb = flat(grad_a), flat(grad_b)
  return {"loss_abs": da, "loss_rel": da / max(abs(float(loss_b)), 1e-30),
          "loss_rel_scale": da / max(float(scale_a), 1e-30),
          "grad_rel_l2": float(np.linalg.norm(ga - gb) / max(np.linalg.norm(gb), 1e-30)),
          "grad_max_abs": float(np.max(np.abs(ga - gb)))}


def measure(model: Transformer, params, calls: Sequence[TITOCall], adv_seed: int, reps: int,
            norm: str = "seq_mean", chosen: Optional[Sequence[int]] = None) -> dict:
  """Tokens, fwd+bwd time and loss / gradient equality of the dedup tree against the expanded rows (module
  docstring), for `chosen` calls (default all of them). Advantages: standard normal, one per chosen call, from
  `default_rng(adv_seed)`."""
  tree = build_tree(calls)
  chosen = list(range(len(calls))) if chosen is None else list(chosen)
  adv = np.random.default_rng(adv_seed).normal(size=len(chosen))
  packed, (tokens, positions, mask, parent) = packed_inputs(tree, chosen)
  w_exact = jnp.asarray(node_weights(tree, packed, chosen, adv, norm, "exact"))
  w_gyre = jnp.asarray(node_weights(tree, packed, chosen, adv, norm, "qwengyre"))
  (seqs, train, scale), lengths = expanded_inputs(tree, chosen, adv, norm)
  f_dedup, f_exp = dedup_fn(model), expanded_fn(model)

  t0 = time.perf_counter()
  (l_dedup, s_dedup), g_dedup = jax.block_until_ready(f_dedup(params, tokens, positions, mask, parent, w_exact))
  compile_dedup = time.perf_counter() - t0
  t0 = time.perf_counter()
  l_exp, g_exp = jax.block_until_ready(f_exp(params, seqs, train, scale))
  compile_exp = time.perf_counter() - t0
  (l_gyre, s_gyre), g_gyre = f_dedup(params, tokens, positions, mask, parent, w_gyre)
  times = interleaved_median_times({
      "dedup": lambda: jax.block_until_ready(f_dedup(params, tokens, positions, mask, parent, w_exact)),
      "expanded": lambda: jax.block_until_ready(f_exp(params, seqs, train, scale))}, reps)

  exact = differences(l_dedup, s_dedup, g_dedup, l_exp, g_exp)
  gyre = differences(l_gyre, s_gyre, g_gyre, l_exp, g_exp)
  n_packed, n_exp = int(packed.tokens.size), int(sum(lengths))
  return {
      "paths": len(chosen), "tokens_packed": n_packed, "tokens_expanded": n_exp,
      "tokens_expanded_padded": int(seqs.size), "token_ratio": n_packed / n_exp,
      "trainable_packed": int(packed.trainable.sum()),
      "trainable_expanded": int(sum(np.sum(tree.trainable[path(tree, int(tree.leaves[c]))]) for c in chosen)),
      "fwd_bwd_s_dedup": times["dedup"], "fwd_bwd_s_expanded": times["expanded"],
      "time_ratio": times["dedup"] / times["expanded"],
      "first_call_s_dedup": compile_dedup, "first_call_s_expanded": compile_exp,
      "loss_dedup": float(l_dedup), "loss_expanded": float(l_exp), "loss_scale": float(s_dedup),
      "grad_norm": float(np.linalg.norm(flat(g_exp))),
      **exact, **{f"qwengyre_{k}": v for k, v in gyre.items()}, "loss_qwengyre": float(l_gyre),
  }


def model_and_params(size: str = "base", model_path: str = "", seed: int = 0):
  """(Transformer, float32 params, what they are): random weights of a named size, or a checkpoint / HF folder."""
  if model_path:
    from rlkit.train.models import load_model
    module, params, _ = load_model(model_path, dtype="float32", param_dtype="float32")
    return module, params, model_path
  cfg = TREE_SIZES[size]
  return Transformer(cfg), init_params(cfg, jax.random.key(seed)), size


def run(size: str = "base", paths: int = 4, path_len: int = 256, shared: float = 0.5, prompt_len: int = 16,
        calls_json: str = "", model_path: str = "", seed: int = 0, reps: int = 5, norm: str = "seq_mean") -> dict:
  """One measurement (the JSON line's dict): the tree from `calls_json` or synthetic from `seed`, advantages from
  seed 1000 + `seed`; random model weights from key 0 (the model is not what varies)."""
  model, params, what = model_and_params(size, model_path)
  if calls_json:
    calls, spec = load_calls(calls_json), {"source": calls_json}
  else:
    calls = synthetic_calls(paths, path_len, shared, prompt_len, model.cfg.vocab_size, np.random.default_rng(seed))
    packed, expanded = token_counts(paths, path_len, shared)
    spec = {"source": "synthetic", "path_len": path_len, "shared": shared, "prompt_len": prompt_len,
            "shared_tokens": shared_tokens(path_len, shared), "tokens_packed_formula": packed,
            "token_ratio_formula": 1 - shared * (paths - 1) / paths}
  row = measure(model, params, calls, 1000 + seed, reps, norm)
  return {"benchmark": "tree_packing", "size": what, "params": num_params(params), **spec, "seed": seed,
          "norm": norm, "reps": reps, "commit": commit(), "jax": jax.__version__, **cpu_info(), **row}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", default="base", choices=list(TREE_SIZES))
  p.add_argument("--model", default="", help="load this HF folder / rlkit checkpoint instead (float32)")
  p.add_argument("--paths", type=int, default=4, help="synthetic tree: leaves (branching)")
  p.add_argument("--path_len", type=int, default=256, help="synthetic tree: tokens per root-to-leaf path")
  p.add_argument("--shared", type=float, default=0.5, help="synthetic tree: shared-prefix fraction of a path")
  p.add_argument("--prompt_len", type=int, default=16, help="synthetic tree: untrained prompt tokens per path")
  p.add_argument("--calls_json", default="", help="measure the tree of these calls instead")
  p.add_argument("--norm", default="seq_mean", choices=("seq_mean", "token_sum"))
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--quick", action="store_true", help="smoke test: the quick model and tree, 2 reps")
  a = p.parse_args(argv)
  if a.quick:
    a.size, a.reps, a.paths, a.path_len, a.shared, a.prompt_len = "quick", 2, *QUICK_TREE.values()
  print(json.dumps(run(a.size, a.paths, a.path_len, a.shared, a.prompt_len, a.calls_json, a.model, a.seed, a.reps,
                       a.norm)), flush=True)


if __name__ == "__main__":
  main()
