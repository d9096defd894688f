# The README's two commands are `make demo` and `make test`; both install what they need first.
.PHONY: setup build test demo bench crds manifests fmt model-check

# Both executables: `nodemedic` and the agent-only `nodemedic-agent` the labs run on each node.
NODEMEDIC = $(or $(CARGO_TARGET_DIR),target)/release/nodemedic
build: setup
	cargo build --release --locked -p nodemedic --bins

setup:
	@bash scripts/setup.sh

test: setup
	@bash scripts/test.sh

demo: build
	$(NODEMEDIC) demo $(ARGS)

# Benchmarks: time to safe recovery, scale (1,000 and 5,000 nodes), agent footprint; one report
# in bench/results/. One suite: ARGS="--suite recovery|scale|footprint" (see nodemedic bench --help).
bench: build
	$(NODEMEDIC) bench $(ARGS)

# The fault campaign: randomized trials reproducible from SEED (writes
# bench/results/chaos-*.{json,md}; a violation names the command that replays its trial).
.PHONY: chaos
SEED ?= 1
TRIALS ?= 200
chaos: build
	$(NODEMEDIC) chaos --seed $(SEED) --trials $(TRIALS) $(ARGS)

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
	cargo test --release --locked -p nodemedic-self-remediation protocol::model -- --include-ignored --nocapture
