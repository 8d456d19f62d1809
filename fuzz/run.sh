#!/bin/sh
# Runs every cargo-fuzz target for a fixed time with the seeds and the JSON-RPC dictionary;
# exits non-zero on the first finding (the crash lands in fuzz/artifacts/<target>/).
#   fuzz/run.sh [SECONDS_PER_TARGET]   (default 60; CI: fuzz/run.sh 20)
# Installs cargo-fuzz if it is missing; needs the nightly toolchain.
set -eu
secs="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
targets="$(cargo +nightly fuzz list)"
for t in $targets; do
  mkdir -p "fuzz/corpus/$t"
  seeds=""
  [ -d "fuzz/seeds/$t" ] && seeds="fuzz/seeds/$t"
  echo "fuzz/run.sh: $t for ${secs}s" >&2
  # shellcheck disable=SC2086 # $seeds is empty or one directory
  cargo +nightly fuzz run "$t" "fuzz/corpus/$t" $seeds -- \
    -dict=fuzz/json-rpc.dict -max_total_time="$secs" -print_final_stats=1
done
echo "fuzz/run.sh: no finding in:" $targets >&2
