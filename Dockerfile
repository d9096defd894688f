# The same two images `make image` builds without a container engine (scripts/build-images.sh),
# for people with one:
#   docker build --target controller -t ghcr.io/nodemedic/nodemedic-controller:0.1.0 .
#   docker build --target agent -t ghcr.io/nodemedic/nodemedic-agent:0.1.0 .
#
# Stage 1: build with the same toolchain and lockfile CI uses; only the shipped package.
FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The agent is built for size (cargo profile `agent`): every node runs one.
RUN cargo build --release --locked -p nodemedic --bin nodemedic --bin nodemedic-controller \
 && cargo build --profile agent --locked -p nodemedic --bin nodemedic-agent \
 && strip target/release/nodemedic target/release/nodemedic-controller target/agent/nodemedic-agent \
 && mkdir -p /agent/usr/local/bin /agent/tmp /agent/etc \
 && cp target/agent/nodemedic-agent /agent/usr/local/bin/ \
 && for lib in $(ldd target/agent/nodemedic-agent | grep -oE '/[^ ]+'); do \
      install -D -m 0755 "$(readlink -f "$lib")" "/agent$lib"; \
    done \
 && echo 'root:x:0:0:root:/:/usr/local/bin/nodemedic-agent' > /agent/etc/passwd

# The agent: its executable and the libraries the loader resolves for it. The DaemonSet runs it
# privileged (it opens the watchdog device).
FROM scratch AS agent
COPY --from=build /agent/ /
ENTRYPOINT ["/usr/local/bin/nodemedic-agent"]

# The controller: Debian bookworm with the fence agents that fence by power and what they need
# to run (as scripts/build-images.sh makes it: the SNMP tools, ssh and telnet clients, the Python
# modules of fence_kubevirt and fence_azure_arm), without documentation, with only the cloud SDK
# models the cloud agents use, and without the agents that do not fence by power.
FROM docker.io/library/debian:bookworm-slim AS controller
RUN printf '%s\n' \
      'path-exclude=/usr/share/doc/*' 'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
      'path-exclude=/usr/share/locale/*' 'path-exclude=/usr/share/lintian/*' \
      'path-exclude=/usr/lib/python3/dist-packages/botocore/data/*' \
      'path-include=/usr/lib/python3/dist-packages/botocore/data/_retry.json' \
      'path-include=/usr/lib/python3/dist-packages/botocore/data/endpoints.json' \
      'path-include=/usr/lib/python3/dist-packages/botocore/data/partitions.json' \
      'path-include=/usr/lib/python3/dist-packages/botocore/data/sdk-default-configuration.json' \
      'path-include=/usr/lib/python3/dist-packages/botocore/data/ec2/*' \
      > /etc/dpkg/dpkg.cfg.d/nodemedic \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      fence-agents ipmitool ca-certificates snmp openssh-client telnet \
      python3-kubernetes python3-openshift python3-azure \
 && rm -rf /var/lib/apt/lists/* \
 && cd /usr/lib/python3/dist-packages/azure \
 && for d in *; do case " __init__.py common core identity mgmt profiles " in *" $d "*) ;; *) rm -rf "$d" ;; esac; done \
 && cd mgmt \
 && for d in *; do case " __init__.py core compute network " in *" $d "*) ;; *) rm -rf "$d" ;; esac; done \
 && cd /usr/sbin \
 && rm -f fence_sbd fence_scsi fence_mpath fence_sanlock fence_kdump fence_compute fence_evacuate \
      fence_brocade fence_cisco_mds fence_sanbox2 fence_ifmib fence_ack_manual fence_crosslink \
      fence_heuristics_ping fence_dummy
COPY --from=build /src/target/release/nodemedic /usr/local/bin/nodemedic
COPY --from=build /src/target/release/nodemedic-controller /usr/local/bin/nodemedic-controller
# `kubectl nodemedic` when the binary is copied out of the image onto a kubectl user's PATH.
RUN ln -s /usr/local/bin/nodemedic /usr/local/bin/kubectl-nodemedic
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/nodemedic-controller"]
