#!/usr/bin/env bash
# For a session with a GPU machine, in one call: calibrate the GPU (full run, then --quick), check
# that memo-sim loads both profiles, and run the GPU-marked calibrate test. Everything lands in
# $OUT (7 files: the two YAMLs, the full run's raw measurements, the two progress logs, the
# pytest log and summary.txt with nvidia-smi, wall times and the profile's key numbers).
#
#   bash benchmarks/calibrate_gpu.sh                 # NAME defaults to <gpu>-calibrated
#   NAME=h100-lab bash benchmarks/calibrate_gpu.sh   # EXTRA="--peak-tflops 989" for an unknown GPU
#
# The device machine has torch, click, pyyaml and pytest but not memo installed: the repository
# is put on PYTHONPATH. Full run: under 5 minutes on one H100 (target); --quick: under 1 minute.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-calibrate_gpu_out}
PY=${PYTHON:-python3}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
NAME=${NAME:-$($PY -c 'import re, torch; n = torch.cuda.get_device_name(0).lower().replace("nvidia", ""); print(re.sub(r"[^a-z0-9]+", "-", n).strip("-") + "-calibrated")')}
S="$OUT/summary.txt"
{ echo "# calibrate_gpu.sh $(date -u +%FT%TZ) NAME=$NAME"; nvidia-smi 2>&1 | head -20; } >"$S"

run() {  # run LABEL LOG CMD...: time a command, keep its stdout+stderr in LOG
  local label=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "$label: exit $rc in $((SECONDS - t0)) s" | tee -a "$S"
}

# shellcheck disable=SC2086
run "calibrate full" "$OUT/$NAME.log" $PY -m memo_exec.calibrate --name "$NAME" --device cuda --out-dir "$OUT" \
    --raw-out "$OUT/$NAME.raw.json" --force $EXTRA
# shellcheck disable=SC2086
run "calibrate quick" "$OUT/$NAME-quick.log" $PY -m memo_exec.calibrate --name "$NAME-quick" --device cuda --quick \
    --out-dir "$OUT" --force $EXTRA
run "pytest -m gpu tests/test_calibrate.py" "$OUT/pytest_gpu.log" \
    $PY -m pytest -q -m gpu tests/test_calibrate.py -p no:cacheprovider

$PY - "$OUT/$NAME.yaml" "$OUT/$NAME-quick.yaml" >>"$S" 2>&1 <<'PYEOF'
import sys
from memo_sim.profile import load_profile
for path in sys.argv[1:]:
    try:
        p = load_profile(path)
        e = p.efficiency
        print(f"{path}: {p.gpu.model}; bf16 peak {p.peak('bf16') / 1e12:.0f} TFLOP/s; "
              f"gemm eff at 1e9/1e11/1e13 FLOP {e.gemm(1e9):.3f}/{e.gemm(1e11):.3f}/{e.gemm(1e13):.3f}; "
              f"attn fwd {e.attention_fwd(1e11):.3f}/{e.attention_fwd(1e13):.3f}, "
              f"bwd {e.attention_bwd(1e11):.3f}/{e.attention_bwd(1e13):.3f}; "
              f"HBM {float(p.gpu.hbm_bandwidth) / 1e9:.0f} GB/s x elementwise {float(e.elementwise):.2f}; "
              f"d2h {float(p.host_link.d2h_bandwidth) / 1e9:.1f} / h2d {float(p.host_link.h2d_bandwidth) / 1e9:.1f} GB/s, "
              f"latency {float(p.host_link.latency) * 1e6:.1f} us; copy/compute slowdown "
              f"{float(p.gpu.copy_compute_slowdown):.3f}; memory {p.gpu_memory / 2**30:.1f} GiB, reserved "
              f"{float(p.gpu.reserved_bytes) / 2**30:.2f} GiB; pinned {p.host.pinned_rounding}; "
              f"took {p.provenance.get('duration_s')} s")
    except Exception as err:  # noqa: BLE001 - reported in the summary
        print(f"{path}: {type(err).__name__}: {err}")
PYEOF
cat "$S"
