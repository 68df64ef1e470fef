#!/usr/bin/env bash
# compute-sanitizer over tools/sanitize_cases.py (every format and layout, both kernel paths,
# the fused SiLU-and-multiply, masked, RMSNorm and NVFP4 kernels, the tile kernels of 128 and
# 256, edge shapes): memcheck (out-of-bounds and misaligned accesses), initcheck (reads of bytes
# never written, including the outputs' padding as they are copied back) and racecheck.
# Usage, on a machine with a GPU and compute-sanitizer on the PATH, from anywhere:
#   bash tools/sanitize.sh [log file] [--full]    (default log: sanitize.log)
# --full runs every edge shape for every variant (about four times the calls).
# Exits non-zero if a tool reports an error or a result differs from the NumPy backend.
# SANITIZE_TOOLS="memcheck" runs a subset of the tools.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${1:-sanitize.log}
full=${2:-}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# the launch path with PDL is sanitized like the plain one: keep the default (on for SM90+)
status=0
: > "$log"
for tool in ${SANITIZE_TOOLS:-memcheck initcheck racecheck}; do
  echo "## compute-sanitizer --tool $tool" | tee -a "$log"
  compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    python3 tools/sanitize_cases.py $full > "$log.$tool" 2>&1
  code=$?
  grep -E "^# |ERROR SUMMARY|RACECHECK SUMMARY|========= (Invalid|Uninitialized|Race|Program hit|Error)|^Traceback|^[A-Za-z.]*Error" \
    "$log.$tool" | tail -25 | tee -a "$log"
  echo "exit code $code" | tee -a "$log"
  [ "$code" -eq 0 ] || status=1
  rm -f "$log.$tool"
done
echo "## overall: $([ $status -eq 0 ] && echo clean || echo ERRORS)" | tee -a "$log"
exit $status
