"""LoGRA as the trainer's optimizer (rlkit/optim/logra_training.py) and predicted-KL control in the update step:
the model-side sketch of an N-D kernel is its dense gradient's 2-D view times the optimizer's projection;
the compiled step's memory under AdamW, LoGRA and LoRA; every new optimizer field changes the updates; a
non-finite KL prediction skips the step; a resumed state continues exactly."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.models import lora
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.optim.logra import layer_projections, logra_count
from rlkit.optim.logra_training import logra_path, selected_mask, to_views
from rlkit.optim.optimizers import gradient_path, make_optimizer, optimizer_defaults
from rlkit.optim.trainable import DENSE
from rlkit.train.steps import Probe, init_train_state, jvp_by_vjp, make_sft_step, make_update_step
from tests.fast_compile import fast_compile

CFG = TransformerConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
MODEL = Transformer(CFG)


def _batch(seed=1, b=4, t=12, vocab=CFG.vocab_size):
  tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, vocab)
  return {"tokens": tokens, "attention_mask": jnp.ones((b, t), bool), "loss_mask": jnp.ones((b, t), bool)}


def _section(**fields):
  c = optimizer_defaults()
  c.update(dict(name="logra", logra_rank=4, lr=1e-2), **fields)
  return c


def _nll(params, batch):
  logits = MODEL.apply({"params": params}, batch["tokens"])
  logp = jax.nn.log_softmax(logits[:, :-1])
  return -jnp.mean(jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], -1))


def test_model_side_sketch_is_the_dense_gradient_view_times_the_projection():
  """For every selected kernel (qkv and o are 4-D, gate_up 3-D) the gradient w.r.t. the zero sketch A equals
  view(G)·P with P the projection the optimizer regenerates; other leaves get their dense gradients, and the
  model's value is unchanged by the zero term."""
  cfg = _section(logra_targets=("qkv", "o", "gate_up"), logra_seed=3)
  params, batch = init_params(CFG, jax.random.key(0)), _batch()
  tx, path = make_optimizer(cfg, 10), logra_path(cfg)
  opt_state = tx.init(params)
  with fast_compile():
    args = path.grad_args(params, opt_state)
    loss_s, sketch = jax.jit(jax.value_and_grad(lambda a: _nll(path.model_params(a, params, opt_state), batch)))(args)
    loss_d, dense = jax.jit(jax.value_and_grad(_nll))(params, batch)
  np.testing.assert_allclose(loss_s, loss_d, rtol=1e-6)
  views, mask = to_views(params, cfg.logra_targets), selected_mask(params, cfg.logra_targets)
  proj = layer_projections(views, cfg.logra_rank, logra_count(opt_state), seed=3, mask=selected_mask(views, cfg.logra_targets))
  dense_views = to_views(dense, cfg.logra_targets)
  flat = jax.tree_util.tree_flatten_with_path(mask)[0]
  assert sum(sel for _, sel in flat) == 3 and not mask["layers_0"]["mlp"]["down"]
  for keypath, sel in flat:
    get = lambda tree: tree if not keypath else get_at(tree, keypath)  # noqa: E731
    if sel:
      assert get(sketch).shape == (get(views).shape[0], 4)      # [in, r]: no [in, out] gradient
      np.testing.assert_allclose(get(sketch), get(dense_views) @ get(proj), rtol=2e-4, atol=1e-6)
    else:
      np.testing.assert_allclose(get(sketch), get(dense), rtol=1e-5, atol=1e-7)


def get_at(tree, keypath):
  for k in keypath:
    tree = tree[k.key]
  return tree


# ------------------------------------------------------------------------------------------------- memory

MEM_CFG = TransformerConfig(vocab_size=64, hidden_size=128, intermediate_size=512, num_layers=1, num_heads=4,
                            num_kv_heads=2, head_dim=32, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def memory():
  """Compiled SFT steps (under `fast_compile`: the same buffer sizes as XLA's default passes, measured) of a 1-layer d=128,
  F=512 decoder (254K params, 96% in the four projections), 2 x 16 tokens, under AdamW, LoGRA r=16 and
  LoRA r=16 with AdamW. Returns {arm: (memory_analysis, state)}."""
  model, params = Transformer(MEM_CFG), init_params(MEM_CFG, jax.random.key(0))
  batch = _batch(b=2, t=16, vocab=64)
  out = {}
  for arm, fields, rank in (("adamw", dict(name="adamw"), 0), ("logra", dict(name="logra"), 0),
                            ("lora", dict(name="adamw"), 16)):
    c = optimizer_defaults()
    c.update(logra_rank=16, **fields)
    section = lora.lora_defaults()
    section.rank = rank
    p = lora.add_adapters(params, section, jax.random.key(2))
    tx, path = make_optimizer(c, 10), gradient_path(c)
    state = init_train_state(p, tx, path)
    with fast_compile():
      out[arm] = make_sft_step(model, tx, 1, path).lower(state, batch, {}).compile().memory_analysis(), state
  return out


def _bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _total(m) -> int:
  return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes


def test_memory_logra_step_is_well_below_adamw(memory):
  """Per parameter, AdamW's step takes 12 B of arguments (W, m, v), 12 B of outputs (donated, aliased) and
  8 B of temporaries (the gradient; XLA:CPU's transposed weight copies for the input gradients): 32 B
  (measured 8.14 MB). LoGRA keeps RowAdam's [in] row moments instead of m, v, and its gradients are
  [in, r] sketches: 4 + 4 B plus temporaries (the update D·Pᵀ and the same weight copies, about 6 B):
  3.73 MB, 0.46x. The bound 0.6x leaves the non-projection params (embedding, norms: 4%, on AdamW in both
  arms) and activations their share; the arguments alone must be under 0.4x (measured 0.36x)."""
  adamw, _ = memory["adamw"]
  logra, state = memory["logra"]
  assert _total(logra) < 0.6 * _total(adamw), (_total(logra), _total(adamw))
  assert logra.argument_size_in_bytes < 0.4 * adamw.argument_size_in_bytes
  assert logra.temp_size_in_bytes < adamw.temp_size_in_bytes
  assert _bytes(state.opt_state) < 0.1 * _bytes(state.params)      # row moments + AdamW on 4% of params


def test_memory_lora_has_no_optimizer_state_for_the_frozen_base(memory):
  """LoRA r=16 on the four projections (38K adapter params): the arguments are the base weights, the adapters
  and AdamW's two moments of the adapters only (no [in, out] moment or gradient of a frozen weight)."""
  adamw, _ = memory["adamw"]
  m, state = memory["lora"]
  mask = lora.trainable_mask(state.params)
  base = _bytes([x for x, t in zip(jax.tree.leaves(state.params), jax.tree.leaves(mask)) if not t])
  adapters = _bytes(DENSE.trainable(state.params))
  assert _bytes(state.opt_state) < 2 * adapters + 1024
  assert m.argument_size_in_bytes < base + 3 * adapters + 4096
  assert _total(m) < 0.6 * _total(adamw), (_total(m), _total(adamw))


def test_memory_the_lora_gradient_holds_the_adapters_only():
  """The differentiated tree of a LoRA step is the adapters: the compiled gradient's output is their size."""
  params = init_params(CFG, jax.random.key(0))
  section = lora.lora_defaults()
  section.rank = 2
  p = lora.add_adapters(params, section, jax.random.key(1))
  t = DENSE.trainable(p)
  assert {k for k in t["layers_0"]["attn"]} == {"qkv_lora_a", "qkv_lora_b", "o_lora_a", "o_lora_b"}
  grads = jax.eval_shape(jax.grad(lambda a: _nll(DENSE.model_params(a, p, None), _batch())), t)
  assert jax.tree.structure(grads) == jax.tree.structure(t)


# ------------------------------------------------------------------------------------------- switches

@pytest.fixture(scope="module")
def small_params():
  return init_params(CFG, jax.random.key(0))


def _updates(params, **fields):
  """Two updates of the `logra` optimizer of `_section(**fields)` fed random sketches (and dense gradients)
  shaped as the step gives them, with a toy `kl_probe` (q = the displacement's squared norm) for kl_target.
  Run eagerly: the flips share their ops' compilations (jitted, each flip compiled its own update)."""
  cfg = _section(**fields)
  tx, path = make_optimizer(cfg, 10), gradient_path(cfg)
  probe = lambda d: sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(d))  # noqa: E731
  state, out = tx.init(params), []
  for seed in (1, 2):
    args = path.grad_args(params, state)
    grads = jax.tree.map(lambda a: jax.random.normal(jax.random.key(seed), a.shape), args)
    u, state = tx.update(grads, state, params, kl_probe=probe)
    out.append(u)
  return out, state


def test_every_logra_field_changes_the_updates(small_params):
  """Each optimizer field the LoGRA arm adds changes its updates over two steps (b2 acts from the second on;
  refresh_every=0 keeps the first projection); `kl_target` (which wraps any optimizer) scales the step so
  its predicted KL is the target. The model side of rank, targets and seed: the sketch test above."""
  flips = {"logra_rank": 8, "logra_targets": ("qkv", "down"), "logra_b2": 0.5, "logra_refresh_every": 0,
           "logra_seed": 1, "kl_target": 1e-6}
  assert set(flips) == {k for k in optimizer_defaults() if k.startswith("logra_")} | {"kl_target"}
  with fast_compile():
    base, _ = _updates(small_params)
    for field, value in flips.items():
      flipped, state = _updates(small_params, **{field: value})
      assert not all(np.allclose(a, b, rtol=0, atol=1e-9) for a, b in zip(jax.tree.leaves(base),
                                                                          jax.tree.leaves(flipped))), field
    q = sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(flipped[-1]))
    np.testing.assert_allclose(q, 1e-6, rtol=1e-4)            # the applied step, alpha * delta, predicts 1e-6
    assert int(logra_count(state)) == 2


_STEPS: dict = {}


def _step(**fields):
  """(tx, path, jitted SFT step) of `_section(**fields)`, memoised (one compile per configuration)."""
  key = repr(sorted(fields.items()))
  if key not in _STEPS:
    cfg = _section(**fields)
    tx, path = make_optimizer(cfg, 10), gradient_path(cfg)
    _STEPS[key] = tx, path, make_sft_step(MODEL, tx, 1, path)
  return _STEPS[key]


def test_non_finite_kl_prediction_skips_the_step():
  """A probe whose logits are not finite (with a finite loss and gradient) gives a non-finite q: the update
  is skipped (parameters, optimizer state and step unchanged) and counted in skipped_updates."""
  params = {"w": jnp.ones((3, 4))}
  x = jnp.arange(6.0).reshape(2, 3)

  def loss_fn(p, mb, inputs):
    return jnp.sum((mb @ p["w"]) ** 2) / inputs["n"], {}

  probe = Probe(lambda p, mb: (mb @ p["w"]) * jnp.nan, lambda mb: jnp.ones(mb.shape[:1], bool))
  c = optimizer_defaults()
  c.kl_target = 1e-3
  tx = make_optimizer(c, 10)
  with fast_compile():
    step = make_update_step(loss_fn, tx, 1, lambda mb: {"n": 1.0}, probe=probe)
    state0 = init_train_state(params, tx)
    state, m = step(jax.tree.map(jnp.copy, state0), x, {})
  assert int(m["skipped_updates"].value) == 1 and int(state.step) == 0 and float(m["kl/scale"].value) == 0
  np.testing.assert_array_equal(state.params["w"], params["w"])
  inner = lambda s: s.inner_state  # noqa: E731
  for a, b in zip(jax.tree.leaves(inner(state.opt_state)), jax.tree.leaves(inner(state0.opt_state))):
    np.testing.assert_array_equal(a, b)


def test_jvp_by_vjp_is_the_jvp():
  f = lambda p: jnp.tanh(p["a"] @ p["b"])  # noqa: E731
  p = {"a": jnp.arange(6.0).reshape(2, 3) / 7, "b": jnp.ones((3, 2)) / 3}
  t = {"a": jnp.ones((2, 3)), "b": jnp.arange(6.0).reshape(3, 2)}
  want, got = jax.jvp(f, (p,), (t,)), jvp_by_vjp(f, (p,), (t,))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5)


def test_logra_with_kl_control_resumes_exactly_from_a_saved_state(small_params, tmp_path):
  """The SFT step under LoGRA with predicted-KL control on the batch's tokens: each step's predicted KL is
  the target (alpha < 1 here). Three steps in one go equal two steps, an Orbax save/restore of the TrainState
  (what a checkpoint holds: the LoGRA count, row moments and the KL control's state; projections are
  regenerated) onto a fresh initial state, and a third step."""
  from rlkit.train.checkpoint import Checkpointer
  tx, path, step = _step(kl_target=1e-6)
  with fast_compile():
    state = init_train_state(jax.tree.map(jnp.copy, small_params), tx, path)
    for seed in (1, 2):
      state, m = step(state, _batch(seed), {})
      m = {k: float(v.value) for k, v in m.items()}
      assert 0 < m["kl/scale"] < 1 and m["skipped_updates"] == 0
      np.testing.assert_allclose(m["kl/scale"] ** 2 * m["kl/predicted"], 1e-6, rtol=1e-4)
    assert int(logra_count(state.opt_state)) == 2 and int(state.step) == 2
    ckpt = Checkpointer(str(tmp_path), every=1)
    ckpt.save(2, state, {})
    target = init_train_state(jax.tree.map(jnp.copy, small_params), tx, path)
    restored, _ = ckpt.restore(2, target)
    ckpt.close()
    straight, _ = step(state, _batch(3), {})
    resumed, _ = step(restored, _batch(3), {})
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["adamw", "logra"])
def test_realised_kl_of_a_controlled_step_tends_to_its_prediction(small_params, name):
  """The step logs the exact KL between the policy before and after the update on the probe tokens
  (`kl/realised`) beside the prediction for the step applied (`kl/applied` = α²·q): their ratio tends to 1 as
  the KL target (so α) shrinks, and the gap at the larger target is the third-order term, not noise. Without
  KL control none of it is computed or logged."""
  def metrics(**fields):
    tx, path, step = _step(name=name, lr=1.0, **fields)
    with fast_compile():
      _, m = step(init_train_state(jax.tree.map(jnp.copy, small_params), tx, path), _batch(4), {})
    return {k: float(v.value) for k, v in m.items()}
  errors = []
  for target in (1e-2, 1e-4):
    m = metrics(kl_target=target)
    assert 0 < m["kl/scale"] < 1
    np.testing.assert_allclose(m["kl/applied"], target, rtol=1e-4)
    errors.append(abs(m["kl/realised"] / m["kl/applied"] - 1))
  assert errors[1] < 0.05 and errors[1] < errors[0], errors
  assert not any(k.startswith("kl/") for k in metrics())
