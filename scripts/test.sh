#!/usr/bin/env bash
# Everything CI checks: formatting, lints, generated files, unit/property tests and the lab tests
# against the real control plane. Run through `make test` (which runs setup first).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n=== %s ===\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
# Lab tests start a whole control plane; the lab itself serialises them (one lab at a time).
cargo test --workspace --locked
