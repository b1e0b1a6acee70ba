"""The SFT probes run after tips' first failed gate, before the second design (probe_runs/README.md): does a
longer SFT of the base on the step labels learn to localise errors, where 125 steps learned only the verdict prior
("no error": ProcessBench F1 0.3 against the final-answer baseline's 32); on which chains; in which verdict form?
One SFT run of the base per preset, seed 0, evaluated on the 500 held-out chains.

  python launch.py --config=experiments/tips/probe.py:sft1000 --workdir=/tmp/tips_probe/sft1000
"""
from configs import tips

# preset -> (SFT steps of tips.SFT_BATCH chains, peak learning rate, the chains' operator, the SFT target)
PRESETS = {"sft1000": (1_000, 3e-4, "-", "steps"), "sft1000_hi": (1_000, 1e-3, "-", "steps"),
           "plus125": (125, 3e-4, "+", "steps"),      # running SUMS, the base's own step_check skill
           "checks250": (250, 3e-4, "-", "checks")}   # worked verdicts: each step undone, compared, then its verdict


# A start for a third design: worked step labels of running sums beside worked checks of *correct* running
# differences only (every verdict '+': how a difference is undone, and no label of a wrong difference step).
MIXED_START = {"sums": {"task": "processbench_chains", "weight": 1.0,
                        "kwargs": {"op": "+", "subsets": tips.SUBSETS, "sft_target": "checks"}},
               "differences": {"task": "processbench_chains", "weight": 1.0,
                               "kwargs": {"op": "-", "subsets": tips.SUBSETS, "sft_target": "checks",
                                          "error_frac": 0.0}}}
PRESETS["mixed_start"] = (tips.START_STEPS, 3e-4, "+ and -", "checks")    # configs/tips.py's start, on MIXED_START


def get_config(arg=None):
  if arg == "mixed_start":
    c = tips.get_config("start")
    c.task.name, c.task.kwargs = "mixture", {"skills": MIXED_START}
    return c
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the tips probe; choose one of {', '.join(PRESETS)}.")
  c = tips.get_config("supervised")
  c.model.path = tips.BASE_MODEL
  c.sft.steps, c.sft.optimizer.lr, op, target = PRESETS[arg]
  c.task.kwargs = {**c.task.kwargs, "op": op, "sft_target": target}
  if target != "checks":     # bare verdicts: up to 6 (fewer tokens where the tokenizer merged them) and the end
    c.sft.max_len, c.eval.max_new_tokens = 56, 8
  c.sft.eval_every = 125 if c.sft.steps > 125 else 25
  return c
