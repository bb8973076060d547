#!/usr/bin/env bash
# call6.sh - run 39, call 6 (<= 3 min, what the session's device budget has left): bundle v32c
# (48fbc44: b86cdae's split of tk_merge_warp into warp_kth and tk_warp_sort_out, the same
# search and order but not the same SASS). The contract test under a 170 s limit: its 44
# default cases, then as many of the variant runs as fit; every case prints FAIL on a wrong
# list. Prediction: no FAIL line.
#   device: bash bench/results/2026-12-05-h200-run39/call6.sh
#           carry [".devbundle-v32c.txz"]
set -u
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
rm -rf .devbundle && mkdir -p .devbundle && tar xJf .devbundle-v32c.txz -C .devbundle
. scripts/device/call_common.sh
trap 'tar czf "$OUT/call6.tgz" -C "$R" .' EXIT
step gpu_test_head_cuda_contract 170 "$B/bin/gpu_test_head_cuda_contract"
cat "$R/machine.txt"; cat "$R/steps.txt"
echo "FAIL lines: $(grep -c "FAIL" "$R/gpu_test_head_cuda_contract.log")"
grep -m5 "FAIL" "$R/gpu_test_head_cuda_contract.log"
tail -4 "$R/gpu_test_head_cuda_contract.log"
