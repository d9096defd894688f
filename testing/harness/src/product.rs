//! Where the product's executables are. `cargo build -p nodemedic --bins` (or `make build`)
//! puts them in the same target directory as this tooling: next to the `nodemedic-lab`
//! executable, and one folder up from a test executable, which cargo keeps in `deps/`.

use std::path::{Path, PathBuf};

use nodemedic_lab::{Error, Result};

/// The all-in-one `nodemedic` executable (`controller`, `agent`, `crds`, `status`); the
/// single-role `nodemedic-controller` and `nodemedic-agent` are found next to it.
pub fn nodemedic() -> Result<PathBuf> {
    executable("nodemedic")
}

pub fn executable(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe()
        .map_err(|e| Error::Invalid(format!("cannot locate this executable to find {name} next to it: {e}")))?;
    let dir = me.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(name), dir.parent().unwrap_or(dir).join(name)];
    candidates.iter().find(|path| path.is_file()).cloned().ok_or_else(|| {
        Error::Invalid(format!(
            "the product executable {name} is not built next to {}: build it with `cargo build -p nodemedic --bins` \
             (with --release for a release build of the tooling), or `make build`",
            me.display()
        ))
    })
}
