# acpd: multi-stage build, small non-root runtime image.
#
#   docker build -t acpd .
#   docker run -p 7420:7420 -v acpd-data:/var/lib/acpd acpd
#
# The image listens on 0.0.0.0 inside the container, which acpd allows only with TLS or
# --insecure: mount a certificate (see README, TLS) or put a TLS-terminating proxy in front.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY migrations ./migrations
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked -p acpd -p acp-shim

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/acpd --shell /usr/sbin/nologin acpd
COPY --from=build /src/target/release/acpd /src/target/release/acp-shim /usr/local/bin/
COPY config/acpd.toml /etc/acpd/acpd.toml.example
USER acpd
ENV ACPD_DATA_DIR=/var/lib/acpd \
    ACPD_LISTEN=0.0.0.0:7420
VOLUME ["/var/lib/acpd"]
EXPOSE 7420
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS http://127.0.0.1:7420/healthz || exit 1
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/acpd"]
CMD ["serve"]
