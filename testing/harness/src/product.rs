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

/// The cargo profile the agent ships with (`cargo build --profile agent`, which `make build`,
/// `make image` and the Dockerfile run): built for size, since every node runs one.
pub const AGENT_PROFILE: &str = "agent";

/// The build of the single-role executable `sibling` (a file next to the all-in-one `nodemedic`)
/// that a cluster would run: for the agent next to a release build, the [`AGENT_PROFILE`] build
/// when it is at least as new as the release one (a release build made after it means the
/// sources changed since); otherwise `sibling` itself.
pub fn shipped_build(sibling: &Path) -> PathBuf {
    let in_release = sibling.parent().and_then(Path::file_name) == Some("release".as_ref());
    let agent = sibling.file_name() == Some("nodemedic-agent".as_ref());
    let Some(sized) = sibling
        .parent()
        .and_then(Path::parent)
        .zip(sibling.file_name())
        .filter(|_| in_release && agent)
        .map(|(target, name)| target.join(AGENT_PROFILE).join(name))
    else {
        return sibling.to_path_buf();
    };
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(&sized), modified(sibling)) {
        (Some(size_built), Some(release_built)) if size_built >= release_built => sized,
        (Some(_), None) => sized,
        _ => sibling.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn touch(path: &Path, at: SystemTime) {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("folder created");
        let file = std::fs::File::create(path).expect("file created");
        file.set_modified(at).expect("mtime set");
    }

    #[test]
    fn the_agent_profile_build_is_run_unless_a_release_build_is_newer() {
        let target = tempfile::tempdir().expect("temp dir");
        let release = target.path().join("release/nodemedic-agent");
        let sized = target.path().join("agent/nodemedic-agent");
        let then = SystemTime::now() - Duration::from_secs(60);
        touch(&release, then);
        assert_eq!(
            shipped_build(&release),
            release,
            "no agent-profile build: the release one"
        );
        touch(&sized, then + Duration::from_secs(1));
        assert_eq!(shipped_build(&release), sized);
        touch(&release, then + Duration::from_secs(2));
        assert_eq!(shipped_build(&release), release, "sources changed since the size build");
    }

    #[test]
    fn debug_builds_and_other_executables_are_run_as_they_are() {
        let target = tempfile::tempdir().expect("temp dir");
        let now = SystemTime::now();
        touch(&target.path().join("agent/nodemedic-agent"), now);
        touch(&target.path().join("agent/nodemedic-controller"), now);
        let debug = target.path().join("debug/nodemedic-agent");
        assert_eq!(shipped_build(&debug), debug);
        let controller = target.path().join("release/nodemedic-controller");
        assert_eq!(shipped_build(&controller), controller);
    }
}
