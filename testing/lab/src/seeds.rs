//! The seed manifests (the repository's copy of `../shared/fixtures/seed-manifests`), as tests
//! apply them: namespaces rewritten to one, nothing else.

use std::path::PathBuf;

use serde_json::Value;

use crate::{Error, Result, error::io};

/// The repository's copy of the seed manifests (`fixtures/seed-manifests`, checked identical to
/// the shared originals by the api crate's tests), or `$NODEMEDIC_SHARED_DIR/fixtures/seed-manifests`.
pub fn dir() -> Result<PathBuf> {
    let dir = std::env::var_os("NODEMEDIC_SHARED_DIR")
        .map(|shared| PathBuf::from(shared).join("fixtures/seed-manifests"))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/seed-manifests"));
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(Error::Invalid(format!("seed manifests not found at {}", dir.display())))
    }
}

/// A seed manifest by file name, e.g. `002-nhc-snr-3node.yaml`.
pub fn load(file: &str) -> Result<Value> {
    let path = dir()?.join(file);
    let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    serde_saphyr::from_str(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
}

/// Every `namespace` field (the object's own and its template references) set to `namespace`.
pub fn in_namespace(mut manifest: Value, namespace: &str) -> Value {
    fn walk(v: &mut Value, ns: &str) {
        match v {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if key == "namespace" && value.is_string() {
                        *value = Value::String(ns.to_owned());
                    } else {
                        walk(value, ns);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|i| walk(i, ns)),
            _ => {}
        }
    }
    walk(&mut manifest, namespace);
    manifest
}

/// YAML text of a manifest (kubectl accepts JSON as YAML).
pub fn yaml(manifest: &Value) -> String {
    manifest.to_string()
}
