# syntax=docker/dockerfile:1.7
# karpenter-capi: a release binary in a distroless, non-root image.
#
# The binary uses rustls (no OpenSSL), so it needs only glibc and libgcc at run time: the
# distroless "cc" image has exactly those. Builder and runtime are both Debian 12 (bookworm), so
# the glibc the binary was linked against is the one it runs with.
#
#   docker build -t karpenter-capi:0.1.0 .
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Symbols off and one codegen unit: a smaller, faster binary; the build takes a little longer.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    CARGO_PROFILE_RELEASE_LTO=thin
COPY . .
# Cache mounts keep the crate registry and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin karpenter-capi \
 && install -D -m 0555 target/release/karpenter-capi /out/karpenter-capi

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="karpenter-capi" \
      org.opencontainers.image.description="Just-in-time nodes for Cluster API clusters, with Karpenter's API" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/karpenter-capi /karpenter-capi
# distroless's nonroot user; the manifests also set runAsNonRoot and a read-only root filesystem.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/karpenter-capi"]
CMD ["run"]
