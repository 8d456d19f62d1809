# acpd: multi-stage build, small non-root runtime image (deploy/README.md, "Container").
#
#   docker build -t acpd .                                  # runtime: acpd, built-in agent
#   docker build -t acpd:node --target runtime-node .       # + Node.js/npx for npx agents
#   docker run -d --name acpd -p 7420:7420 -v acpd-data:/var/lib/acpd acpd
#   docker logs acpd                        # the certificate's SHA-256, a console link
#   docker exec acpd acpd token create --name me
#
# The daemon listens on 0.0.0.0:7420 with TLS: a certificate mounted at ACPD_TLS_CERT /
# ACPD_TLS_KEY, else a self-signed one generated into the data volume at first start (acpd
# logs its SHA-256; `acp-shim --pin-sha256` trusts exactly it).
#
# Targets: runtime (the default) and runtime-node compile acpd here; runtime-prebuilt and
# runtime-node-prebuilt copy PREBUILT_DIR/acpd and PREBUILT_DIR/acp-shim from the build
# context instead (binaries built on a bookworm-compatible host, as .ci/container.sh does).
# Build arguments:
#   RUST_IMAGE    the build stage's image (default rust:1-bookworm)
#   RUNTIME_BASE  the runtime's base: any Debian bookworm image; node:22-bookworm-slim
#                 brings a current Node.js to the plain runtime target
#   PREBUILT_DIR  where the *-prebuilt targets find the binaries (default target/release)
# Targets are chosen by name rather than by a build argument in FROM: older buildah (podman
# 4.3) does not resolve a stage named by an argument's default.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_BASE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY migrations ./migrations
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked -p acpd -p acp-shim

FROM ${RUNTIME_BASE} AS base
# curl for the health check, tini as PID 1 (signals, zombies of agents' children). A base
# that has them already (CI's local one) needs no network here.
RUN dpkg -s ca-certificates curl tini >/dev/null 2>&1 \
 || { apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates curl tini \
      && rm -rf /var/lib/apt/lists/*; }
# A fixed UID/GID (10001), which the Kubernetes manifests name. One volume holds the data
# directory and HOME (agents' caches and credentials: npx, git, logins), each 0700.
RUN groupadd --gid 10001 acpd \
 && useradd --uid 10001 --gid acpd --no-create-home --home-dir /var/lib/acpd \
      --shell /usr/sbin/nologin acpd \
 && install -d -m 0700 -o acpd -g acpd /var/lib/acpd /var/lib/acpd/data /var/lib/acpd/home
COPY deploy/container/acpd-entrypoint deploy/container/acpd-healthcheck /usr/local/bin/
COPY config/acpd.toml /etc/acpd/acpd.toml.example
USER acpd
WORKDIR /var/lib/acpd
ENV HOME=/var/lib/acpd/home \
    ACPD_DATA_DIR=/var/lib/acpd/data \
    ACPD_LISTEN=0.0.0.0:7420 \
    ACPD_TLS_CERT=/var/lib/acpd/data/tls/cert.pem \
    ACPD_TLS_KEY=/var/lib/acpd/data/tls/key.pem
VOLUME ["/var/lib/acpd"]
EXPOSE 7420
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/acpd-healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/acpd-entrypoint"]
CMD ["serve"]

# Node.js, npm, npx and git from Debian (Node 18) for agents started with npx. For a newer
# Node, build the plain runtime on a Node image: --build-arg RUNTIME_BASE=node:22-bookworm-slim.
FROM base AS node
USER root
RUN command -v npx >/dev/null \
 || { apt-get update \
      && apt-get install -y --no-install-recommends nodejs npm git \
      && rm -rf /var/lib/apt/lists/*; }
USER acpd

FROM base AS runtime-prebuilt
ARG PREBUILT_DIR=target/release
COPY ${PREBUILT_DIR}/acpd ${PREBUILT_DIR}/acp-shim /usr/local/bin/

FROM node AS runtime-node-prebuilt
ARG PREBUILT_DIR=target/release
COPY ${PREBUILT_DIR}/acpd ${PREBUILT_DIR}/acp-shim /usr/local/bin/

FROM node AS runtime-node
COPY --from=build /src/target/release/acpd /src/target/release/acp-shim /usr/local/bin/

# The default target (last): acpd and its built-in agent.
FROM base AS runtime
COPY --from=build /src/target/release/acpd /src/target/release/acp-shim /usr/local/bin/
