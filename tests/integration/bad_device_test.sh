#!/bin/bash
# A daemon (asympo-learner or asympo-rollout, $1) refuses a device it cannot
# have at start: exit 2, a message naming --device and the value, nothing
# bound. On a machine without a GPU "cuda" is refused too.
set -u
bin=$1
values=(gpu cuda:x cuda:-1 cuda:4096)
if ! nvidia-smi -L >/dev/null 2>&1; then values+=(cuda cuda:0); fi
for d in "${values[@]}"; do
  out=$("$bin" --device="$d" --metrics_address= 2>&1)
  rc=$?
  if [[ $rc -ne 2 ]]; then
    echo "FAIL: --device=$d: exit $rc (want 2): $out"
    exit 1
  fi
  if ! grep -qF -- "--device: \"$d\"" <<<"$out"; then
    echo "FAIL: --device=$d: the message does not name the flag and value: $out"
    exit 1
  fi
  echo "ok: --device=$d: $out"
done
