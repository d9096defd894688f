# The `nodemedic` binary (every role, status, crds), the single-role `nodemedic-controller` and
# `nodemedic-agent`, and the ClusterLabs fence agents the Fence Agents Remediation controller runs.
# Build: docker build -t nodemedic .
#
# Stage 1: build with the same toolchain and lockfile CI uses.
FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p nodemedic --bins \
 && strip target/release/nodemedic target/release/nodemedic-controller target/release/nodemedic-agent

# Stage 2: Debian slim plus the fence agents (fence_redfish, fence_ipmilan, ... and ipmitool,
# which fence_ipmilan calls). Nothing else: no shell tools the binary needs.
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      fence-agents ipmitool ca-certificates \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=build /src/target/release/nodemedic /usr/local/bin/nodemedic
# The operators alone, the Deployment's command.
COPY --from=build /src/target/release/nodemedic-controller /usr/local/bin/nodemedic-controller
# The agent alone, the DaemonSet's command: every node runs it, so it carries nothing else.
COPY --from=build /src/target/release/nodemedic-agent /usr/local/bin/nodemedic-agent
# `kubectl nodemedic` when the binary is copied out of the image onto a kubectl user's PATH.
RUN ln -s /usr/local/bin/nodemedic /usr/local/bin/kubectl-nodemedic
# The controller runs unprivileged; the agent DaemonSet runs privileged (it opens /dev/watchdog)
# and sets its own securityContext.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodemedic"]
CMD ["controller"]
