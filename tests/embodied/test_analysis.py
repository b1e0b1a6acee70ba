"""rlkit/embodied/analysis.py: a planted low-rank change in one module is found there (share, concentration,
rank) and only there; grafts move exactly the chosen groups; function-space shifts see the timestep modules only;
the rank statistics and Spearman's correlation equal their definitions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.embodied import analysis
from rlkit.models.flow import TIMESTEP_MODULES, FlowConfig, init_flow

CFG = FlowConfig(action_dim=2, horizon=3, hidden=32, blocks=2, time_dim=16)
GROUPS = {"timestep": TIMESTEP_MODULES, "mlp": r"mlp_\d+_", "io": r"^(action|obs)_"}


def _params():
  return init_flow(CFG, 5, jax.random.key(0))


def _plant(p, module="mlp_0_in", rank=2, scale=0.5):
  rng = np.random.default_rng(1)
  k = p[module]["kernel"]
  d = scale * rng.standard_normal((k.shape[0], rank)) @ rng.standard_normal((rank, k.shape[1]))
  return {**p, module: {**p[module], "kernel": k + jnp.asarray(d, k.dtype)}}, d


def test_a_planted_low_rank_change_is_found_in_its_module():
  p0 = _params()
  p1, d = _plant(p0)
  shares = analysis.update_shares(p0, p1, GROUPS)
  assert shares["mlp"]["share"] == pytest.approx(1.0) and shares["timestep"]["share"] == 0.0
  assert shares["mlp"]["concentration"] == pytest.approx(1.0 / shares["mlp"]["param_share"])
  modulation = analysis.update_shares(p0, p1, {"modulation": r"^modulation", **GROUPS})["modulation"]
  assert modulation["relative_change"] is None and modulation["share"] == 0.0   # zero-initialised (adaLN-Zero)
  changed = p0["mlp_0_in"]["kernel"].size                   # every entry of the planted kernel moved, nothing else
  assert shares["timestep"]["sparsity"] == 1.0
  assert shares["mlp"]["sparsity"] == pytest.approx(1 - changed / shares["mlp"]["params"])
  spectra = analysis.kernel_spectra(p0, p1, GROUPS)
  planted = spectra["mlp_0_in/kernel"]
  assert planted["k90"] <= 2 and planted["stable_rank"] <= 2 and planted["erank"] < 2.05
  assert planted["gaussian_erank"] > 10 and planted["group"] == "mlp"
  assert all(s["erank"] == 0 for name, s in spectra.items() if name != "mlp_0_in/kernel")


def test_spectrum_statistics_equal_their_definitions():
  s = np.array([3.0, 2.0, 1.0])
  m = np.diag(s)
  got = analysis.spectrum(m)
  p = s / s.sum()
  assert got["erank"] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
  assert got["stable_rank"] == pytest.approx(14 / 9) and got["k90"] == 2          # 9 + 4 = 13 of 14 >= 90%
  assert got["erank_norm"] == pytest.approx(got["erank"] / 3)


def test_grafts_move_exactly_the_chosen_groups():
  p0 = _params()
  p1 = jax.tree.map(lambda x: x + 1.0, p0)
  half = analysis.graft(p0, p1, GROUPS, ("timestep",), alpha=0.5)
  rest = analysis.graft(p0, p1, GROUPS, ("timestep",), complement=True)
  for path, a in jax.tree_util.tree_flatten_with_path(half)[0]:
    name = analysis.path_str(path)
    base = np.asarray(analysis._leaves(p0)[name])
    moved = analysis.group_of(name, GROUPS) == "timestep"
    np.testing.assert_allclose(np.asarray(a), base + (0.5 if moved else 0.0), rtol=1e-6)
    np.testing.assert_allclose(analysis._leaves(rest)[name], base + (0.0 if moved else 1.0), rtol=1e-6)


def test_function_shifts_see_only_the_timestep_modules():
  p0 = _params()
  grid = jnp.linspace(0, 1, 5)
  outputs = lambda p: analysis.timestep_outputs(CFG, p, grid)                      # noqa: E731
  assert set(outputs(p0)) == {"time_mlp_in", "time_mlp_out", "modulation_0", "modulation_1", "modulation_out"}
  p_mlp, _ = _plant(p0)
  assert np.abs(analysis.function_shift(outputs, p0, p_mlp)).max() == 0.0
  p_mod, _ = _plant(p0, module="modulation_1")
  shift = analysis.function_shift(outputs, p0, p_mod)
  assert np.abs(shift).max() > 0
  w = analysis.shift_vector(p0, p_mod, GROUPS, "timestep")
  assert w.size == sum(x.size for p, x in analysis._leaves(p0).items() if analysis.group_of(p, GROUPS) == "timestep")


def test_cosines_and_spearman():
  c = analysis.cosine_matrix([np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([-2.0, 0.0])])
  np.testing.assert_allclose(c, [[1, 2 ** -0.5, -1], [2 ** -0.5, 1, -(2 ** -0.5)], [-1, -(2 ** -0.5), 1]], atol=1e-12)
  assert analysis.spearman([1, 2, 3, 4], [10, 20, 25, 99]) == pytest.approx(1.0)
  assert analysis.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  scipy_stats = pytest.importorskip("scipy.stats")
  x, y = [1, 2, 2, 3, 5, 4], [2, 1, 4, 4, 6, 3]
  assert analysis.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y)[0])


def test_the_random_direction_control_keeps_each_leafs_step_size_not_its_direction():
  p0 = _params()
  p1, _ = _plant(p0, module="time_mlp_in")
  p1 = {**p1, "mlp_0_in": jax.tree.map(lambda x: x + 0.1, p1["mlp_0_in"])}
  r = analysis.random_direction(p0, p1, GROUPS, ("timestep",), seed=3)
  a, b, c = analysis._leaves(p0), analysis._leaves(p1), analysis._leaves(r)
  for name in a:
    if analysis.group_of(name, GROUPS) != "timestep":
      np.testing.assert_array_equal(c[name], a[name])            # other groups untouched, even where p1 moved
      continue
    np.testing.assert_allclose(np.linalg.norm(c[name] - a[name]), np.linalg.norm(b[name] - a[name]), rtol=1e-5)
  d_true, d_rand = b["time_mlp_in/kernel"] - a["time_mlp_in/kernel"], c["time_mlp_in/kernel"] - a["time_mlp_in/kernel"]
  assert abs(np.sum(d_true * d_rand)) / (np.linalg.norm(d_true) * np.linalg.norm(d_rand)) < 0.2


def test_adam_second_moments_are_found_in_a_chained_optimizer_state():
  import optax
  p = _params()
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3))
  state = tx.init(p)
  g = jax.tree.map(lambda x: jnp.full_like(x, 2.0), p)
  _, state = tx.update(g, state, p)
  as_restored = jax.tree.map(lambda x: x, state, is_leaf=lambda x: False)
  nu = analysis.adam_second_moments({"0": None, "1": {"inner_state": [dict(as_restored[1].inner_state[0]._asdict())]}})
  assert jax.tree.structure(nu) == jax.tree.structure(p)
  for leaf in jax.tree.leaves(nu):        # one step of squared clipped gradients, scaled by 1 - b2
    np.testing.assert_allclose(np.asarray(leaf), np.asarray(leaf).flat[0])
  assert analysis.adam_second_moments({"a": [1, {"b": 2}]}) is None
