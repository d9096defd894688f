# The README's two commands are `make demo` and `make test`; both install what they need first.
.PHONY: setup setup-lab build test demo bench crds manifests fmt model-check image bundle

# The product's executables (`nodemedic`, `nodemedic-controller`, `nodemedic-agent`) and the
# test tooling's `nodemedic-lab` (lab, demo, bench, chaos), which runs the product's next to it.
NODEMEDIC_LAB = $(or $(CARGO_TARGET_DIR),target)/release/nodemedic-lab
# The agent also in its size-optimised build (cargo profile `agent`), which the images ship and
# the labs run (every node runs one, so its resident memory counts many times over).
build: setup-lab
	cargo build --release --locked -p nodemedic -p nodemedic-harness --bins
	cargo build --profile agent --locked -p nodemedic --bin nodemedic-agent

# Everything: what labs need, and Helm, the machine layer, the descheduler and Prometheus, which
# only some tests use.
setup:
	@bash scripts/setup.sh

# What building and running a lab needs (the demo, benchmarks, fault campaigns, the playground):
# a newcomer's first `make demo` builds no Go tool it does not run.
setup-lab:
	@bash scripts/setup.sh packages
	@bash scripts/setup.sh lab

# The test driver runs the setup itself, in phases that overlap the build and the first lab test.
test:
	@bash scripts/test.sh

# The controller and agent OCI images, without a container engine (scripts/build-images.sh):
# target/images/nodemedic-{controller,agent}-<version>.oci.tar.
image: build
	bash scripts/build-images.sh

# The OLM bundle for OperatorHub (target/bundle: manifests/, metadata/, bundle.Dockerfile), from
# the chart and the images by digest, checked by the Operator Framework's own validation.
bundle: image
	bash scripts/build-tools.sh >/dev/null
	$(NODEMEDIC_LAB) bundle --out target/bundle
	$$(bash scripts/build-tools.sh)/bundle-validate target/bundle $$(sed -n 's/^KUBERNETES_VERSION=\([0-9]*\.[0-9]*\).*/\1/p' scripts/versions.env)

# Real nodes (ARGS=--real-nodes) also need the images, containerd and the CNI plugins, and Helm.
demo: build
ifneq (,$(findstring --real-nodes,$(ARGS)))
	bash scripts/build-images.sh
	bash scripts/build-node.sh >/dev/null
	bash scripts/build-tools.sh >/dev/null
endif
	$(NODEMEDIC_LAB) demo $(ARGS)

# Benchmarks: time to safe recovery, scale (1,000 and 5,000 nodes), agent footprint; one report
# in bench/results/. One suite: ARGS="--suite recovery|scale|footprint|images|peer-aggregation" (see nodemedic-lab bench --help).
bench: build image
ifneq (,$(findstring --real-nodes,$(ARGS)))
	bash scripts/build-node.sh >/dev/null
	bash scripts/build-tools.sh >/dev/null
endif
# The out-of-the-box profile (and the footprint suite's chart-defaults window) render the chart.
	bash scripts/build-tools.sh >/dev/null
	$(NODEMEDIC_LAB) bench $(ARGS)

# The fault campaign: randomized trials reproducible from SEED (writes
# bench/results/chaos-*.{json,md}; a violation names the command that replays its trial).
# On real nodes (ARGS=--real-nodes) it also needs the images, containerd and the CNI plugins, and Helm.
.PHONY: chaos
SEED ?= 1
TRIALS ?= 200
chaos: build
ifneq (,$(findstring --real-nodes,$(ARGS)))
	bash scripts/build-images.sh
	bash scripts/build-node.sh >/dev/null
	bash scripts/build-tools.sh >/dev/null
endif
ifneq (,$(findstring --chart-defaults,$(ARGS)))
	bash scripts/build-tools.sh >/dev/null
endif
	$(NODEMEDIC_LAB) chaos --seed $(SEED) --trials $(TRIALS) $(ARGS)

# Regenerate the committed CRD YAML from the types (deploy/crds and the chart's copy).
crds:
	cargo run -q --locked -p nodemedic -- crds --write deploy/crds
	rm -f charts/nodemedic/crds/*.yaml && cp deploy/crds/*.yaml charts/nodemedic/crds/

# Render the chart into deploy/nodemedic.yaml (plain manifests for people without Helm).
manifests:
	bash scripts/render-manifests.sh

fmt:
	cargo fmt --all

# The self-remediation protocol's larger model checks (minutes; the unit tests run the smaller).
model-check:
	cargo test --release --locked -p nodemedic-licence-protocol model -- --include-ignored --nocapture
