//! The API crate's integration tests: seed manifests round-trip through the types, the
//! committed CRD YAML matches what the types generate, and the CRDs refuse a watchdog path the
//! agents would refuse.

mod crds_committed;
mod seed_roundtrip;
mod watchdog_path;

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The seed manifests: the repository's copy (`fixtures/seed-manifests`, kept identical to
/// `../shared/fixtures/seed-manifests` by `seed_roundtrip`), or `$NODEMEDIC_SHARED_DIR/fixtures/seed-manifests`.
pub fn seed_manifest_dir() -> PathBuf {
    let dir = std::env::var_os("NODEMEDIC_SHARED_DIR")
        .map(|shared| PathBuf::from(shared).join("fixtures/seed-manifests"))
        .unwrap_or_else(|| repo_root().join("fixtures/seed-manifests"));
    assert!(dir.is_dir(), "seed manifests not found at {}", dir.display());
    dir
}
