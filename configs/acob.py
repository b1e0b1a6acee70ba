"""The ACoB experiment (experiments/acob/): does staged value calibration with a reference penalty spare a good
reference policy the early drop that online actor-critic causes, on a precision task?

  python experiments/acob/run.py --root=/tmp/acob
  python launch.py --config=configs/acob.py:bc --workdir=/tmp/acob/bc_s0
  python launch.py --config=configs/acob.py:acob --workdir=/tmp/acob/acob_s0 --config.acob.expert_path=/tmp/acob/bc_s0

PrecisionReach (methods/embodied.md §3.5): the point mass must stay within RADIUS of its goal for HOLD
consecutive steps within 50 steps; the reward is sparse (1 at success). `bc`: BC_STEPS steps of behaviour cloning
of the scripted controller on the drift-free task (configs/embodied.py's expert, chunks of 4). Every other preset
is one `acob` stage of STEPS iterations on the same task under a drift DRIFT the clone never saw, from a `bc`
run's expert (`acob.expert_path`); 16 environments x 8 chunks an iteration, CRITIC_UPDATES critic steps each:

  naive         no calibration (random critics, actor updates from the first iteration), no reference penalty
                (beta 0, no dual ascent), no trip-wire: plain online actor-critic on the same update rule
  acob          ACoB: calibrate on pi_ref's Monte-Carlo returns, TD to the gate (up to TD_ROUNDS rounds), then
                advantage-weighted flow matching with beta x D_ref by dual ascent and the trip-wire
  acob_no_cal   ACoB without stages 1-2 (actor updates from the first iteration, random critics; beta, trip-wire)
  acob_no_beta  ACoB without the reference penalty (beta 0, no dual ascent; calibration, gate, trip-wire)
  sync, stream  the throughput pair (ACoB-Stream): `acob` with a large VLA emulated (INFER_S of inference per
                collection, EXEC_S of execution per chunk), TPUT_BLOCKS blocks of 10 learn steps, in one thread
                (`sync`) or on actor and learner threads (`stream`)
"""
from configs.embodied import get_config as embodied_config

BC_STEPS = 300
STEPS = 150
EVAL_EVERY = 10
EVAL_EPISODES = 512
CRITIC_UPDATES = 32
TD_ROUNDS = 5
RADIUS, HOLD = 0.03, 5
DRIFT = [0.11, 0.0]
INFER_S, EXEC_S, TPUT_BLOCKS = 0.4, 0.1, 5
INF = float("inf")
ARMS = {
    "naive": dict(calibrate_steps=0, td_steps=0, beta=0.0, d_max=INF, margin=INF),
    "acob": {},
    "acob_no_cal": dict(calibrate_steps=0, td_steps=0),
    "acob_no_beta": dict(beta=0.0, d_max=INF),
}
THROUGHPUT = {"sync": "sync", "stream": "stream"}
PRESETS = {"bc": f"{BC_STEPS} BC steps on drift-free PrecisionReach (pi_ref)",
           **{arm: f"acob stage, {STEPS} iterations under drift {DRIFT}: {fields or 'the full method'}"
              for arm, fields in ARMS.items()},
           **{name: f"throughput: acob with stream.mode={mode}, infer {INFER_S} s, exec {EXEC_S} s a chunk"
              for name, mode in THROUGHPUT.items()}}


def get_config(arg=None):
  preset = arg or "acob"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for acob; choose one of {', '.join(PRESETS)}.")
  c = embodied_config("acob")
  c.progress = False
  task = {"goal_radius": RADIUS, "hold_steps": HOLD, "max_steps": 50, "sparse": 1}
  c.bc.steps, c.bc.eval_every, c.bc.eval_episodes = BC_STEPS, 0, EVAL_EPISODES
  c.bc.env_task = dict(task)
  c.acob.env_task = {**task, "drift": list(DRIFT)}
  c.acob.update(steps=STEPS, eval_every=EVAL_EVERY, eval_episodes=EVAL_EPISODES, critic_updates=CRITIC_UPDATES,
                td_rounds=TD_ROUNDS)
  if preset == "bc":
    c.stages = ("bc",)
    return c
  c.stages = ("acob",)
  if preset in THROUGHPUT:
    c.acob.update(steps=TPUT_BLOCKS, eval_every=0, eval_episodes=64, calibrate_steps=0, td_steps=0)
    c.acob.stream.update(mode=THROUGHPUT[preset], block=10, infer_s=INFER_S, exec_s=EXEC_S)
  else:
    c.acob.update(ARMS[preset])
  return c
