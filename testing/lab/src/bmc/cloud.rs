//! A lab cloud for the cloud fence agents: moto's EC2 emulator (aws_cloud.py, in its own
//! virtualenv) with one instance per node, whose stop and start are the node's power off and on,
//! reported on the lab's BMC socket like the BMCs' (see `power`). It stands in for a cluster on
//! EC2 as sushy-tools stands in for a server's Redfish BMC.
//!
//! fence_aws reaches it as its proxy: the lab's directory of fence agents ([`Aws::agents_dir`])
//! runs `fence_aws` with HTTPS_PROXY, HTTP_PROXY (the instance metadata it reads its own host
//! from) and AWS_CA_BUNDLE (moto's CA) set, and every other agent as installed. Nothing of it is
//! in what ships: a controller is pointed at that directory with `--fence-agents-dir`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use super::emulators::{LAB_POWER, write};
use crate::{
    Error, Lab, ProcessSpec, Result,
    binaries::{self, cache_dir, version},
    error::io,
    lab::free_port,
    wait,
};

const SCRIPT: &str = include_str!("aws_cloud.py");
/// The emulator's host process.
pub(crate) const PROCESS: &str = "cloud-aws";
/// The region its instances are in, and the credentials it accepts (any).
pub const REGION: &str = "us-east-1";
pub const ACCESS_KEY: &str = "lab-access-key";
pub const SECRET_KEY: &str = "lab-secret-key";

/// How the fence agents reach the lab's cloud.
#[derive(Clone, Debug)]
pub struct Aws {
    /// The instance id of each node (`--plug`).
    pub instances: BTreeMap<String, String>,
    /// Fence agents as installed, with `fence_aws` reaching the lab's cloud: a controller's
    /// `--fence-agents-dir`.
    pub agents_dir: PathBuf,
}

pub(super) fn venv_python() -> PathBuf {
    cache_dir()
        .join(format!("venv-moto-{}", version("MOTO_VERSION")))
        .join("bin/python")
}

pub(super) fn preflight() -> Result<()> {
    let python = venv_python();
    if !python.exists() {
        return Err(Error::MissingTool {
            what: format!(
                "the moto virtualenv {} (installed by scripts/setup.sh)",
                python.display()
            ),
        });
    }
    binaries::tool("fence_aws").map(|_| ())
}

fn dir(lab: &Lab) -> PathBuf {
    lab.dir().join("bmc").join("aws")
}

fn state_file(lab: &Lab) -> PathBuf {
    dir(lab).join("state.json")
}

/// Starts the emulator for the lab's nodes, reporting power changes on `socket`.
pub(super) fn start(lab: &Lab, socket: &Path) -> Result<()> {
    let dir = dir(lab);
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let script = dir.join("aws_cloud.py");
    write(&script, SCRIPT)?;
    write(&dir.join(LAB_POWER.0), LAB_POWER.1)?;
    let port = free_port()?;
    let mut args = vec![
        script.display().to_string(),
        port.to_string(),
        socket.display().to_string(),
        state_file(lab).display().to_string(),
    ];
    args.extend(lab.nodes());
    lab.add_host_process(PROCESS, ProcessSpec::new(venv_python(), args))?;
    agents_dir(&dir, port)
}

/// The agents as installed, `fence_aws` behind a wrapper that points it at the emulator.
fn agents_dir(dir: &Path, port: u16) -> Result<()> {
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).map_err(io(format!("creating {}", agents.display())))?;
    let installed = binaries::tool("fence_aws")?;
    let installed_dir = installed.parent().unwrap_or(Path::new("/usr/sbin")).to_path_buf();
    for entry in std::fs::read_dir(&installed_dir).map_err(io(format!("reading {}", installed_dir.display())))? {
        let path = entry.map_err(io("reading the fence agents"))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with("fence_") && name != "fence_aws" {
            let link = agents.join(&name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&path, &link).map_err(io(format!("linking {}", link.display())))?;
        }
    }
    let proxy = format!("http://127.0.0.1:{port}");
    let wrapper = agents.join("fence_aws");
    let text = format!(
        "#!/bin/sh\n# The lab's cloud (moto) as this agent's AWS.\nexport HTTPS_PROXY={proxy} HTTP_PROXY={proxy} NO_PROXY=\nexport AWS_CA_BUNDLE=\"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"ca\"])' {state})\"\nexec {installed} \"$@\"\n",
        state = dir.join("state.json").display(),
        installed = installed.display(),
    );
    write(&wrapper, &text)?;
    let mut permissions = std::fs::metadata(&wrapper)
        .map_err(io(format!("reading {}", wrapper.display())))?
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&wrapper, permissions).map_err(io(format!("making {} executable", wrapper.display())))
}

/// Waits until the emulator serves and has made the instances.
pub(super) async fn wait_serving(lab: &Lab) -> Result<()> {
    wait::until(
        "the lab's cloud (moto) with an instance per node",
        Duration::from_secs(90),
        || async { Ok(state_file(lab).exists().then_some(())) },
    )
    .await
}

impl Lab {
    /// The lab's cloud. Fails when the lab was started without `BmcOptions::aws`.
    pub fn aws(&self) -> Result<Aws> {
        let file = state_file(self);
        let text = std::fs::read_to_string(&file)
            .map_err(|_| Error::Invalid("this lab has no cloud: start it with BmcOptions { aws: true, .. }".into()))?;
        let state: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
        let instances = self
            .nodes()
            .into_iter()
            .filter_map(|node| {
                let id = state["instances"][&node].as_str()?.to_owned();
                Some((node, id))
            })
            .collect();
        Ok(Aws {
            instances,
            agents_dir: dir(self).join("agents"),
        })
    }
}
