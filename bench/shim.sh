#!/usr/bin/env bash
# acp-shim vs websocat on one acpd (see bench/shim.py). Needs python3; websocat is optional
# (`cargo install websocat`). Builds release binaries first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acpd --bin acp-shim --bin acpd-scripted-agent
exec python3 bench/shim.py target/release/acpd target/release/acp-shim \
  target/release/acpd-scripted-agent $(command -v websocat || true)
