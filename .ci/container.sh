#!/usr/bin/env bash
# The container recipe, run for real (deploy/README.md, "Container"). Registries cannot be
# pulled from here, so the image is built FROM a local Debian base (mmdebstrap from
# deb.debian.org) with the host-built binaries (Dockerfile targets *-prebuilt). Then, from
# the host: /healthz over the generated certificate, the image's HEALTHCHECK, `token create`
# and `web-login` via `podman exec`, non-root with a writable HOME on a read-only root, and
# one ACP turn (initialize, session/new, a prompt to the demo model) through acp-shim
# pinned to the certificate; the runtime-node target's node/npx as the image's user.
# Where podman cannot run it prints "container: NOT RUN — <reason>" and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

not_run() {
    echo "container: NOT RUN — $*" >&2
    exit 0
}
fail() {
    echo "container: FAILED — $*" >&2
    exit 1
}

if ! command -v podman >/dev/null; then
    apt-get install -y podman >/dev/null 2>&1 || not_run "podman is not installed and apt-get cannot install it"
fi
podman info >/dev/null 2>&1 || not_run "podman info fails: $(podman info 2>&1 | tail -n1)"

work="target/container"
mkdir -p "$work"
base=localhost/acpd-ci-base:bookworm
if ! podman image exists "$base"; then
    if ! command -v mmdebstrap >/dev/null; then
        apt-get install -y mmdebstrap >/dev/null 2>&1 || not_run "mmdebstrap cannot be installed"
    fi
    mmdebstrap --quiet --variant=minbase --include=ca-certificates,curl,tini --mode=root \
        bookworm "$work/base.tar" http://deb.debian.org/debian >/dev/null 2>&1 \
        || not_run "cannot build a Debian base with mmdebstrap (deb.debian.org unreachable?)"
    podman import -q "$work/base.tar" "$base" >/dev/null
    rm -f "$work/base.tar"
fi

# crun refuses this VM's hybrid cgroup layout, and a container may not raise RLIMIT_NOFILE
# or set RLIMIT_NPROC to the host's values (no CAP_SYS_RESOURCE): where the defaults fail,
# runc with limits at or under the host's.
podman=(podman)
limits=()
if ! probe=$(podman run --rm "$base" true 2>&1); then
    command -v runc >/dev/null || apt-get install -y runc >/dev/null 2>&1 || true
    podman=(podman --runtime runc)
    limits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
    "${podman[@]}" run --rm "${limits[@]}" "$base" true >/dev/null 2>&1 \
        || not_run "no container starts here: $(echo "$probe" | tail -n1)"
fi

# The binaries `cargo test` uses, without their debug info (the image stays small).
cargo build -q -p acpd -p acp-shim
for bin in acpd acp-shim; do
    objcopy --strip-debug "target/debug/$bin" "$work/$bin"
done

tag="localhost/acpd:ci-$$"
build() { # TARGET TAG
    "${podman[@]}" build -q "${limits[@]}" --format docker --target "$1" -t "$2" \
        --build-arg RUNTIME_BASE="$base" --build-arg PREBUILT_DIR="$work" . >/dev/null
}
name="acpd-ci-$$"
volume="acpd-ci-data-$$"
cleanup() {
    podman rm -f "$name" >/dev/null 2>&1 || true
    podman volume rm -f "$volume" >/dev/null 2>&1 || true
    podman rmi -f "$tag" "$tag-node" >/dev/null 2>&1 || true
}
trap cleanup EXIT
build runtime-prebuilt "$tag" || fail "podman build --target runtime-prebuilt"

# The image's documented run, plus a read-only root (as in Kubernetes) and the demo model.
started=$("${podman[@]}" run -d --name "$name" "${limits[@]}" --read-only --tmpfs /tmp \
    -p 127.0.0.1::7420 -v "$volume:/var/lib/acpd" -e ACPD_MODEL=demo "$tag" 2>&1) \
    || fail "podman run: $started"
port=$(podman port "$name" 7420 | head -n1 | sed 's/.*://')
healthy=
for _ in $(seq 1 30); do
    if curl -fsSk "https://127.0.0.1:$port/healthz" >/dev/null 2>&1; then healthy=1; break; fi
    sleep 1
done
[ -n "$healthy" ] || fail "no /healthz over TLS from the host within 30 s: $(podman logs "$name" 2>&1 | tail -n5)"
podman healthcheck run "$name" >/dev/null || fail "the image's HEALTHCHECK reports unhealthy"
fp=$(podman logs "$name" 2>&1 | sed -n 's/.*TLS certificate loaded.*sha256=\([0-9a-f]*\).*/\1/p' | head -n1)
[ -n "$fp" ] || fail "the start log names no certificate fingerprint"

[ "$(podman exec "$name" id -u)" = 10001 ] || fail "the daemon's user is not 10001"
podman exec "$name" sh -c 'touch "$HOME/.ci-probe"' || fail "HOME is not writable"
token=$(podman exec "$name" acpd token create --name ci 2>/dev/null) || fail "token create via podman exec"
podman exec "$name" acpd web-login --principal ci 2>/dev/null | grep -q '^https://.*/login#code=' \
    || fail "web-login via podman exec"

ACPD_TOKEN="$token" timeout 90 python3 - target/debug/acp-shim "wss://127.0.0.1:$port/acp" "$fp" <<'EOF' || fail "the ACP turn through acp-shim"
import json, select, subprocess, sys, time
shim, url, fp = sys.argv[1:4]
p = subprocess.Popen([shim, "--pin-sha256", fp, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def call(i, method, params, wait=30):
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n")
    p.stdin.flush()
    end = time.time() + wait
    while select.select([p.stdout], [], [], max(0, end - time.time()))[0]:
        line = p.stdout.readline()
        if not line:
            sys.exit(f"acp-shim ended before answering {method}")
        m = json.loads(line)
        if m.get("id") == i:
            if "result" not in m:
                sys.exit(f"{method}: {m}")
            return m["result"]
    sys.exit(f"no answer to {method} within {wait} s")
assert call(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})["protocolVersion"] == 1
sid = call(2, "session/new", {"cwd": "/tmp", "mcpServers": []})["sessionId"]
prompt = [{"type": "text", "text": "hello"}]
stop = call(3, "session/prompt", {"sessionId": sid, "prompt": prompt})["stopReason"]
assert stop == "end_turn", stop
p.stdin.close()
p.wait(10)
EOF

# Without TLS, a public listener is refused in one line (exit 64).
set +e
refused=$("${podman[@]}" run --rm "${limits[@]}" -e ACPD_TLS=off "$tag" 2>&1)
code=$?
set -e
[ "$code" = 64 ] || fail "serve without TLS exited $code, not 64: $refused"

build runtime-node-prebuilt "$tag-node" || fail "podman build --target runtime-node-prebuilt"
node=$("${podman[@]}" run --rm "${limits[@]}" --read-only --tmpfs /tmp --entrypoint sh "$tag-node" \
    -c 'test "$(id -u)" = 10001 && node --version && npx --version' 2>&1) \
    || fail "node/npx in runtime-node: $node"

echo "container: ok (healthz, HEALTHCHECK, exec token/web-login, ACP turn over pinned TLS, runtime-node)" >&2
