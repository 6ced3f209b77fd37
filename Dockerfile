# syntax=docker/dockerfile:1.7
# karpenter-capi: the release binary in an image built from scratch, run as a non-root user. The
# binary is the controller alone: built without the default `simulator` feature, it has no
# embedded simulated cluster and no `simulate` subcommand.
#
#   docker build -t registry.example.com/karpenter-capi:0.1.0 .
#
# scripts/build-image builds the same image without a container engine and checks it (file
# list, configuration, the entrypoint run as uid 65532 from a read-only root); CI runs that.
# Both lay out the root filesystem with scripts/image-rootfs: the binary, the shared libraries
# ldd lists for it (glibc and libgcc of Debian 12, as in the builder below) and the loader, and
# /etc/passwd, /etc/group and /etc/nsswitch.conf. scripts/build-image checks that USER,
# ENTRYPOINT, CMD, EXPOSE and the labels here match its own.
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# The same profile settings as scripts/build-image: symbols off, one codegen unit, thin LTO.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
    CARGO_PROFILE_RELEASE_LTO=thin
COPY . .
# Cache mounts keep the crate registry and compiled dependencies between builds; the root
# filesystem is laid out in the same step, while the cached target directory is mounted.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features --bin karpenter-capi \
 && scripts/image-rootfs target/release/karpenter-capi /rootfs

FROM scratch
LABEL org.opencontainers.image.title="karpenter-capi" \
      org.opencontainers.image.description="Just-in-time nodes for Cluster API clusters, with Karpenter's API" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /rootfs/ /
# No file in the image belongs to this user, so it can change nothing; the manifests also set
# runAsNonRoot and a read-only root filesystem, and the controller writes no files.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/karpenter-capi"]
CMD ["run"]
