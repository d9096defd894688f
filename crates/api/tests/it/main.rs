//! The API crate's integration tests: seed manifests round-trip through the types, and the
//! committed CRD YAML matches what the types generate.

mod crds_committed;
mod seed_roundtrip;

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `../shared/fixtures/seed-manifests` beside the repository (or `NODEMEDIC_SHARED_DIR`).
pub fn seed_manifest_dir() -> PathBuf {
    let shared = std::env::var_os("NODEMEDIC_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"));
    let dir = shared.join("fixtures/seed-manifests");
    assert!(
        dir.is_dir(),
        "seed manifests not found at {}: the project expects the shared/ folder beside its root \
         (or set NODEMEDIC_SHARED_DIR)",
        dir.display()
    );
    dir
}
