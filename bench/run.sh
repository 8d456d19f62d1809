#!/usr/bin/env bash
# Builds release binaries and runs the relay benchmark (benches/relay): acpd against a
# websocat pair and direct stdio, pinned to one CPU and unpinned, in one run. Arguments go
# to the benchmark (e.g. --quick). Needs websocat (`cargo install websocat`) on PATH, in
# ~/.cargo/bin or named by $WEBSOCAT; Postgres rows when ACPD_TEST_DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
# 10 000 idle connections need as many descriptors, in the benchmark and in acpd.
ulimit -n "$(ulimit -Hn)"
cargo build --release -p acpd -p acp-shim -p acpd-scripted-agent
exec cargo bench --bench relay -- "$@"
