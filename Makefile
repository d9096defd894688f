# The README's two commands are `make demo` and `make test`; both install what they need first.
.PHONY: setup test demo crds fmt

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
