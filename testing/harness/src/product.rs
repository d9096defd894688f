//! Where the product's executables are. `cargo build -p nodemedic --bins` (or `make build`)
//! puts them in the same target directory as this tooling: next to the `nodemedic-lab`
//! executable, and one folder up from a test executable, which cargo keeps in `deps/`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
};

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
/// when it was built from the sources as they are; otherwise `sibling` itself. Chosen once per
/// process: a campaign starts agents hundreds of times, and keeps the path it chose first.
pub fn shipped_build(sibling: &Path) -> PathBuf {
    static CHOSEN: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let Ok(mut chosen) = CHOSEN.get_or_init(Mutex::default).lock() else {
        return choose_build(sibling);
    };
    chosen
        .entry(sibling.to_path_buf())
        .or_insert_with(|| choose_build(sibling))
        .clone()
}

fn choose_build(sibling: &Path) -> PathBuf {
    let in_release = sibling.parent().and_then(Path::file_name) == Some("release".as_ref());
    let agent = sibling.file_name() == Some("nodemedic-agent".as_ref());
    sibling
        .parent()
        .and_then(Path::parent)
        .zip(sibling.file_name())
        .filter(|_| in_release && agent)
        .map(|(target, name)| target.join(AGENT_PROFILE).join(name))
        .filter(|sized| built_from_current_sources(sized))
        .unwrap_or_else(|| sibling.to_path_buf())
}

/// Whether `exe` was built from the sources as they are: no file its dep-info (`<exe>.d`, which
/// cargo writes next to it) names changed since it was linked, cargo's own test of local
/// sources. Not the binary's age: cargo leaves a build that is still fresh untouched, so an
/// up-to-date agent build can be older than a release build made after it.
fn built_from_current_sources(exe: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(exe) else { return false };
    let Ok(dep_info) = std::fs::read_to_string(exe.with_extension("d")) else {
        return false;
    };
    let Some((_, sources)) = dep_info.lines().next().and_then(|line| line.split_once(": ")) else {
        return false;
    };
    // Spaces inside a path are escaped (`\ `); the separators are the others.
    let sources = sources.replace("\\ ", "\0");
    sources
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(|s| PathBuf::from(s.replace('\0', " ")))
        .all(|source| modified(&source).is_some_and(|changed| changed <= built))
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

    fn dep_info(exe: &Path, sources: &[&Path]) {
        let names: Vec<String> = sources
            .iter()
            .map(|s| s.display().to_string().replace(' ', "\\ "))
            .collect();
        std::fs::write(
            exe.with_extension("d"),
            format!("{}: {}\n", exe.display(), names.join(" ")),
        )
        .expect("dep-info written");
    }

    #[test]
    fn the_agent_profile_build_is_run_while_its_sources_are_unchanged() {
        let target = tempfile::tempdir().expect("temp dir");
        let release = target.path().join("release/nodemedic-agent");
        let sized = target.path().join("agent/nodemedic-agent");
        let source = target.path().join("src dir/agent.rs");
        let then = SystemTime::now() - Duration::from_secs(60);
        touch(&release, then + Duration::from_secs(30));
        assert_eq!(
            choose_build(&release),
            release,
            "no agent-profile build: the release one"
        );
        touch(&source, then);
        touch(&sized, then + Duration::from_secs(10));
        dep_info(&sized, &[&source]);
        assert_eq!(
            choose_build(&release),
            sized,
            "fresh, though older than the release build"
        );
        touch(&source, then + Duration::from_secs(20));
        assert_eq!(choose_build(&release), release, "a source changed since");
        std::fs::remove_file(sized.with_extension("d")).expect("dep-info removed");
        assert_eq!(choose_build(&release), release, "without dep-info nothing is known");
    }

    #[test]
    fn debug_builds_and_other_executables_are_run_as_they_are() {
        let target = tempfile::tempdir().expect("temp dir");
        let now = SystemTime::now();
        for name in ["nodemedic-agent", "nodemedic-controller"] {
            let sized = target.path().join("agent").join(name);
            touch(&sized, now);
            dep_info(&sized, &[]);
        }
        let debug = target.path().join("debug/nodemedic-agent");
        assert_eq!(choose_build(&debug), debug);
        let controller = target.path().join("release/nodemedic-controller");
        assert_eq!(choose_build(&controller), controller);
    }
}
