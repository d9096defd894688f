# The README's two commands are `make demo` and `make test`; both install what they need first.
.PHONY: setup test demo crds fmt model-check

setup:
	@bash scripts/setup.sh

test: setup
	@bash scripts/test.sh

demo: setup
	cargo run --release --locked -p nodemedic -- demo $(ARGS)

# Regenerate the committed CRD YAML from the types.
crds:
	cargo run -q --locked -p nodemedic -- crds --write deploy/crds

fmt:
	cargo fmt --all

# The self-remediation protocol's larger model checks (minutes; the unit tests run the smaller).
model-check:
	cargo test --release --locked -p nodemedic-self-remediation protocol::model -- --include-ignored --nocapture
