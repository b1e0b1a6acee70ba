#!/bin/bash
# The GPU measurements of benchmarks/README.md in one call of a lent GPU machine, each step under its own time
# limit so that one failure costs only its step. Run from the repository root:
#
#   bash benchmarks/gpu_checks.sh [STEP ...]  # fp4_matmul sync fp4_sampler fp4_sweep fp4_stages (default: all)
#
# Each step's JSON lines go to $OUT/<step>.jsonl and its whole output to $OUT/<step>.log ($OUT defaults to
# /tmp/gpu_checks). The machine runs its own python3 and packages (JAX with CUDA, Flax, Optax, Orbax); a
# package it lacks travels as a wheel in .whl/ (ml_collections: see the device notes in benchmarks/README.md).
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used,memory.total --format=csv,noheader
python3 -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__,
'optax', optax.__version__, jax.devices())"

step() {   # step NAME SECONDS SCRIPT ARGS...: run one benchmark, keep its JSON lines and its log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" python3 "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep '^{' "$OUT/$name.log" >"$OUT/$name.jsonl"
  echo "-- $name: rc $rc, $((SECONDS - t0)) s, $(wc -l <"$OUT/$name.jsonl") JSON lines"
  [ $rc -eq 0 ] || grep -v '^{' "$OUT/$name.log" | tail -n 25
  return 0
}

steps=${*:-fp4_matmul sync fp4_sampler fp4_sweep fp4_stages}
for s in $steps; do
  case $s in
    fp4_matmul) step fp4_matmul 80 benchmarks/fp4_matmul.py --m 1,4,16,64 ;;
    sync) step sync 60 benchmarks/sync.py --size 134217728 ;;
    fp4_sampler) step fp4_sampler 300 benchmarks/fp4_sampler.py --size 1b --reps 3 ;;
    fp4_sweep) step fp4_sweep 150 benchmarks/fp4_matmul.py --m 1,16 --bn 32,64,128 --split_k 4,8 --num_warps 4,8 \
      --repeats 5 ;;
    fp4_stages) step fp4_stages 60 benchmarks/fp4_matmul.py --m 1,16 --stages --repeats 5 ;;
    *) echo "unknown step $s" ;;
  esac
done
# The table last (the device reply carries the end of the output).
python3 - "$OUT" <<'EOF'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
  for line in f.read_text().splitlines():
    r = json.loads(line)
    skip = {"benchmark", "bench", "cpu", "cpu_isa", "cpu_cores", "commit", "backend", "pallas_mode", "repeats"}
    keep = {k: v for k, v in r.items() if k not in skip}
    print(f.stem, json.dumps(keep))
EOF
