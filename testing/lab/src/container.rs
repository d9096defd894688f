//! The images `make image` builds, run as containers the way a kubelet runs the chart's pods:
//! each OCI archive unpacked once per lab with umoci (in the lab's tmpfs), and every container
//! run in the foreground by runc under the lab's supervision, so its output is a lab log and a
//! power-off of its node kills it like any of the node's processes. runc rather than crun:
//! Debian's crun refuses a host with both cgroup hierarchies mounted ("cgroups in hybrid mode
//! not supported"), as CI's machines are.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{Error, Result, cmd, error::io, process::ProcessSpec};

/// A container: an image (an OCI archive), the arguments after its entrypoint, and what the
/// pod spec would give it.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub image: PathBuf,
    /// Replaces the image's entrypoint (a pod's `command`).
    pub command: Option<Vec<String>>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binds: Vec<Bind>,
    /// `uid:gid`; the image's user when unset.
    pub user: Option<(u32, u32)>,
    /// `capabilities: {drop: [ALL]}`.
    pub drop_all_capabilities: bool,
    /// The network namespace to join (a node's, under /run/netns); the host's when unset. runc
    /// joins it itself: run inside `ip netns exec`, it would find no cgroup mount under the
    /// fresh /sys that command mounts.
    pub network: Option<PathBuf>,
}

/// A host path mounted into the container (a hostPath or a projected volume).
#[derive(Clone, Debug)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: String,
    pub writable: bool,
}

impl ContainerSpec {
    pub fn new(image: impl Into<PathBuf>, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            image: image.into(),
            command: None,
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            binds: Vec::new(),
            user: None,
            drop_all_capabilities: false,
            network: None,
        }
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn bind(mut self, source: impl Into<PathBuf>, destination: impl Into<String>, writable: bool) -> Self {
        self.binds.push(Bind {
            source: source.into(),
            destination: destination.into(),
            writable,
        });
        self
    }
}

/// Where one lab keeps its unpacked images, bundles and runc state.
pub(crate) struct Containers {
    root: PathBuf,
    lab_id: String,
}

impl Containers {
    pub(crate) fn new(shm: &Path, lab_id: &str) -> Self {
        Self {
            root: shm.join("containers"),
            lab_id: lab_id.to_owned(),
        }
    }

    fn state(&self) -> PathBuf {
        self.root.join("runc")
    }

    /// The process that runs `spec` as container `name` (`controller`, `node-1/agent`), in the
    /// network namespace `spec.network` names, or the host's.
    pub(crate) fn process(&self, name: &str, spec: &ContainerSpec) -> Result<ProcessSpec> {
        let (state, id, bundle) = self.prepare(name, spec)?;
        // The container's init starts a session of its own, out of reach of a kill of runc's
        // process group: a kill of the process deletes the container too.
        let delete = vec![
            "--root".to_owned(),
            state.clone(),
            "delete".to_owned(),
            "--force".to_owned(),
            id.clone(),
        ];
        let mut process = ProcessSpec::new(
            "/bin/sh",
            [
                "-c".to_owned(),
                r#"runc --root "$1" delete --force "$2" >/dev/null 2>&1; exec runc --root "$1" run --bundle "$3" "$2""#
                    .to_owned(),
                "nodemedic-lab-container".to_owned(),
                state,
                id,
                bundle,
            ],
        );
        process.after_kill = Some(("runc".to_owned(), delete));
        Ok(process)
    }

    /// Runs `spec` to completion as container `name` on the host; returns its output.
    pub(crate) fn run(&self, name: &str, spec: &ContainerSpec) -> Result<String> {
        let (state, id, bundle) = self.prepare(name, spec)?;
        cmd::run_quietly("runc", &["--root", &state, "delete", "--force", &id]);
        let output = cmd::run("runc", &["--root", &state, "run", "--bundle", &bundle, &id]);
        cmd::run_quietly("runc", &["--root", &state, "delete", "--force", &id]);
        output
    }

    /// Writes the bundle of container `name`; returns runc's state directory, the container's
    /// id and its bundle.
    fn prepare(&self, name: &str, spec: &ContainerSpec) -> Result<(String, String, String)> {
        crate::binaries::tool("runc")?;
        let rootfs = self.unpacked(&spec.image)?;
        let file = name.replace('/', "_");
        let bundle = self.root.join("bundles").join(&file);
        std::fs::create_dir_all(&bundle).map_err(io(format!("creating {}", bundle.display())))?;
        let generated = rootfs.with_file_name("config.json");
        let text = std::fs::read_to_string(&generated).map_err(io(format!("reading {}", generated.display())))?;
        let mut config: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Invalid(format!("{}: not an OCI runtime config: {e}", generated.display())))?;
        adapt(&mut config, &rootfs, spec);
        std::fs::write(bundle.join("config.json"), config.to_string()).map_err(io("writing a container config"))?;
        // The id is the same on every start: a container left from the node's previous boot is
        // deleted before the next one runs.
        let id = format!("nodemedic-{}-{file}", self.lab_id);
        Ok((self.state().display().to_string(), id, bundle.display().to_string()))
    }

    /// The image's root filesystem, unpacked on first use (beside it, the runtime config umoci
    /// generates from the image's configuration).
    fn unpacked(&self, archive: &Path) -> Result<PathBuf> {
        let stem = archive
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".oci.tar"))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: not an image archive (make image writes target/images/<name>-<version>.oci.tar)",
                    archive.display()
                ))
            })?;
        let bundle = self.root.join("images").join(stem);
        let rootfs = bundle.join("rootfs");
        if rootfs.is_dir() {
            return Ok(rootfs);
        }
        if !archive.is_file() {
            return Err(Error::Invalid(format!(
                "the image {} is missing: build it with `make image`",
                archive.display()
            )));
        }
        crate::binaries::tool("skopeo")?;
        crate::binaries::tool("umoci")?;
        let layout = self.root.join("layouts").join(stem);
        for dir in [self.root.join("layouts"), self.root.join("images")] {
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let source = format!("oci-archive:{}", archive.display());
        let target = format!("oci:{}:image", layout.display());
        cmd::run("skopeo", &["copy", "--quiet", &source, &target])?;
        let image = format!("{}:image", layout.display());
        cmd::run("umoci", &["unpack", "--image", &image, &bundle.display().to_string()])?;
        let _ = std::fs::remove_dir_all(&layout);
        Ok(rootfs)
    }

    /// Stops and deletes every container of the lab (teardown; best effort).
    pub(crate) fn remove_all(&self) {
        let state = self.state();
        let Ok(entries) = std::fs::read_dir(&state) else { return };
        let root = state.display().to_string();
        for entry in entries.flatten() {
            if let Some(id) = entry.file_name().to_str() {
                cmd::run_quietly("runc", &["--root", &root, "delete", "--force", id]);
            }
        }
    }
}

/// The runtime config umoci generated, adapted as the kubelet would for the pod spec: shared
/// read-only root, the caller's arguments, environment, mounts and user; the network namespace
/// of the process that starts it.
fn adapt(config: &mut Value, rootfs: &Path, spec: &ContainerSpec) {
    config["root"] = json!({"path": rootfs.display().to_string(), "readonly": true});
    let process = &mut config["process"];
    process["terminal"] = json!(false);
    if let Some(command) = &spec.command {
        process["args"] = json!(command);
    }
    if let Some(args) = process["args"].as_array_mut() {
        args.extend(spec.args.iter().map(|a| json!(a)));
    }
    if let Some(env) = process["env"].as_array_mut() {
        env.extend(spec.env.iter().map(|(k, v)| json!(format!("{k}={v}"))));
    }
    if let Some((uid, gid)) = spec.user {
        process["user"] = json!({"uid": uid, "gid": gid});
    }
    if spec.drop_all_capabilities {
        process["capabilities"] =
            json!({"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []});
        process["noNewPrivileges"] = json!(true);
    }
    if let Some(mounts) = config["mounts"].as_array_mut() {
        // What a pod's emptyDir gives a read-only root to write in.
        mounts.push(json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]}));
        for bind in &spec.binds {
            let access = if bind.writable { "rw" } else { "ro" };
            mounts.push(json!({
                "destination": bind.destination,
                "type": "bind",
                "source": bind.source.display().to_string(),
                "options": ["rbind", access],
            }));
        }
    }
    let linux = &mut config["linux"];
    if let Some(namespaces) = linux["namespaces"].as_array_mut() {
        namespaces.retain(|ns| ns["type"] != "network");
        if let Some(path) = &spec.network {
            namespaces.push(json!({"type": "network", "path": path.display().to_string()}));
        }
    }
    // The host's sysrq trigger stays out of reach whatever the container runs: masked by an
    // empty file, as the runtimes' defaults do, and listed here in case an image's config did not.
    for list in ["maskedPaths", "readonlyPaths"] {
        if !linux[list].is_array() {
            linux[list] = json!([]);
        }
        if let Some(paths) = linux[list].as_array_mut()
            && !paths.iter().any(|p| p == crate::SYSRQ_TRIGGER)
        {
            paths.push(json!(crate::SYSRQ_TRIGGER));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated() -> Value {
        json!({
            "process": {"args": ["/usr/local/bin/nodemedic-controller"], "env": ["PATH=/usr/bin"], "user": {"uid": 65532, "gid": 65532},
                        "capabilities": {"bounding": ["CAP_KILL"]}},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}], "readonlyPaths": ["/proc/sys"]}
        })
    }

    #[test]
    fn the_container_shares_its_starters_network_and_never_reaches_the_sysrq_trigger() {
        let mut config = generated();
        let spec = ContainerSpec::new("/x/nodemedic-controller-0.1.0.oci.tar", ["--metrics-bind=127.0.0.1:1"])
            .env("POD_NAMESPACE", "nodemedic")
            .bind("/lab/token", "/var/run/secrets/kubernetes.io/serviceaccount", false);
        adapt(&mut config, Path::new("/shm/images/c/rootfs"), &spec);
        assert_eq!(
            config["process"]["args"],
            json!(["/usr/local/bin/nodemedic-controller", "--metrics-bind=127.0.0.1:1"])
        );
        assert_eq!(
            config["process"]["env"],
            json!(["PATH=/usr/bin", "POD_NAMESPACE=nodemedic"])
        );
        assert_eq!(
            config["root"],
            json!({"path": "/shm/images/c/rootfs", "readonly": true})
        );
        assert_eq!(
            config["linux"]["namespaces"],
            json!([{"type": "pid"}, {"type": "mount"}])
        );
        assert_eq!(config["linux"]["maskedPaths"], json!([crate::SYSRQ_TRIGGER]));
        assert_eq!(
            config["linux"]["readonlyPaths"],
            json!(["/proc/sys", crate::SYSRQ_TRIGGER])
        );
        let mounts = config["mounts"].as_array().expect("mounts");
        assert!(
            mounts
                .iter()
                .any(|m| m["destination"] == "/tmp" && m["type"] == "tmpfs")
        );
        assert!(
            mounts
                .iter()
                .any(|m| m["destination"] == "/var/run/secrets/kubernetes.io/serviceaccount"
                    && m["options"] == json!(["rbind", "ro"]))
        );
        assert_eq!(config["process"]["capabilities"]["bounding"], json!(["CAP_KILL"]));
    }

    #[test]
    fn dropping_all_capabilities_leaves_none_and_forbids_gaining_any() {
        let mut config = generated();
        let mut spec = ContainerSpec::new("/x/a.oci.tar", Vec::<String>::new());
        spec.drop_all_capabilities = true;
        spec.user = Some((0, 0));
        adapt(&mut config, Path::new("/r"), &spec);
        assert_eq!(config["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(config["process"]["noNewPrivileges"], json!(true));
        assert_eq!(config["process"]["user"], json!({"uid": 0, "gid": 0}));
    }
}
