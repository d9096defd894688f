//! nodemedic's images in a lab: the archives `make image` builds, run as containers with what
//! the chart's pods get. The controller runs as the Deployment's container does (its
//! ServiceAccount's token projected where a pod finds it, user 65532, no capabilities, a
//! read-only root); an agent as the manager's DaemonSet pod on its node does (a token bound to
//! that pod, root, the node's network).

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use nodemedic_api::self_remediation::SelfNodeRemediationConfig;
use nodemedic_lab::{ContainerSpec, Error, Lab, Result};

use crate::scenario::{self, CONTROLLER_ACCOUNT, LabWatchdog, NS, chart_rbac};

/// Where a pod finds its ServiceAccount's token, CA certificate and namespace.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The two archives `make image` writes.
#[derive(Clone, Debug)]
pub struct Images {
    pub controller: PathBuf,
    pub agent: PathBuf,
}

impl Images {
    /// The archives under `NODEMEDIC_IMAGES`, or `target/images` of the target directory the
    /// product executable `exe` was built in (`target/debug/nodemedic`, `target/release/...`).
    pub fn of(exe: &Path) -> Result<Self> {
        let dir = match std::env::var_os("NODEMEDIC_IMAGES") {
            Some(dir) => PathBuf::from(dir),
            None => exe
                .parent()
                .and_then(Path::parent)
                .map(|target| target.join("images"))
                .ok_or_else(|| Error::Invalid(format!("{}: not in a target directory", exe.display())))?,
        };
        let version = env!("CARGO_PKG_VERSION");
        let images = Self {
            controller: dir.join(format!("nodemedic-controller-{version}.oci.tar")),
            agent: dir.join(format!("nodemedic-agent-{version}.oci.tar")),
        };
        for archive in [&images.controller, &images.agent] {
            if !archive.is_file() {
                return Err(Error::Invalid(format!(
                    "the image archive {} is missing: build the images with `make image` \
                     (or scripts/build-images.sh), or point NODEMEDIC_IMAGES at their directory",
                    archive.display()
                )));
            }
        }
        Ok(images)
    }
}

/// What a pod of `account` finds under [`SERVICE_ACCOUNT_DIR`], written into the lab for
/// container `name`: the token, the cluster's CA certificate and the namespace.
fn projected_service_account(lab: &Lab, name: &str, token: &str) -> Result<PathBuf> {
    let dir = lab
        .dir()
        .join("containers")
        .join(format!("{}-serviceaccount", name.replace('/', "_")));
    let io = |e: std::io::Error| Error::Io {
        what: format!("writing {}", dir.display()),
        source: e,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    std::fs::write(dir.join("token"), token).map_err(io)?;
    std::fs::copy(lab.ca_certificate(), dir.join("ca.crt")).map_err(io)?;
    std::fs::write(dir.join("namespace"), NS).map_err(io)?;
    Ok(dir)
}

/// The environment the kubelet gives every pod to find the API server.
fn in_cluster(spec: ContainerSpec, lab: &Lab, token_dir: &Path) -> ContainerSpec {
    spec.env("KUBERNETES_SERVICE_HOST", lab.api_ip().to_string())
        .env("KUBERNETES_SERVICE_PORT", lab.api_port().to_string())
        .bind(token_dir, SERVICE_ACCOUNT_DIR, false)
}

/// Runs the controller image as container `name` with the chart's Deployment settings and its
/// ServiceAccount's token (only the chart's RBAC); metrics on 127.0.0.1:`metrics_port` of the
/// host's network, where the BMCs are too.
pub async fn start_controller_container(
    lab: &Lab,
    image: &Path,
    name: &str,
    metrics_port: u16,
    extra: &[&str],
) -> Result<()> {
    lab.apply_yaml_once(&chart_rbac())?;
    let token = scenario::service_account_token(lab, CONTROLLER_ACCOUNT, day_long_token()).await?;
    let tokens = projected_service_account(lab, name, &token)?;
    let mut args = vec![
        format!("--metrics-bind=127.0.0.1:{metrics_port}"),
        // No webhook configuration points at a lab controller.
        "--webhook-bind=".to_owned(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut spec = in_cluster(ContainerSpec::new(image, args), lab, &tokens)
        .env("POD_NAMESPACE", NS)
        .env("POD_NAME", name)
        .env("RUST_LOG", "info,kube=warn");
    spec.user = Some((65532, 65532));
    spec.drop_all_capabilities = true;
    lab.add_host_container(name, &spec)
}

/// Runs the agent image in every node's namespace as the DaemonSet's pod there: a token bound
/// to that pod, and the lab's stand-ins for the node's boot time, sysrq trigger and state
/// directory (the lab directory, mounted at the same path) and its watchdog device (the node's
/// emulated one, bound at the path the agent is given, as the DaemonSet mounts the node's /dev).
pub async fn start_agent_containers(lab: &Lab, image: &Path, config: &SelfNodeRemediationConfig) -> Result<()> {
    lab.apply_yaml_once(&chart_rbac())?;
    for node in lab.nodes() {
        let token = scenario::daemonset_pod_token(lab, &node).await?;
        let tokens = projected_service_account(lab, &format!("{node}/agent"), &token)?;
        let args = scenario::agent_args(lab, config, &node, LabWatchdog::Device)?;
        let device = lab.watchdog_device_path(&node);
        let spec = in_cluster(ContainerSpec::new(image, args), lab, &tokens)
            .env("RUST_LOG", "info,kube=warn")
            .bind(lab.dir(), lab.dir().display().to_string(), true)
            .bind(&device, device.display().to_string(), true);
        lab.add_node_container(&node, "agent", &spec)?;
    }
    Ok(())
}

/// Runs `command` in `image` (its own root, no network) and returns its output.
pub fn run_in_image(lab: &Lab, image: &Path, name: &str, command: &[&str]) -> Result<String> {
    let mut spec = ContainerSpec::new(image, Vec::<String>::new());
    spec.command = Some(command.iter().map(|s| (*s).to_owned()).collect());
    lab.run_container(name, &spec)
}

/// The executables an image with a Debian base (the controller's) holds under /usr/local/bin,
/// and the help of its `nodemedic` (empty without one), read by running the image.
pub fn image_commands(lab: &Lab, image: &Path) -> Result<(Vec<String>, String)> {
    let mut list = ContainerSpec::new(image, Vec::<String>::new());
    list.command = Some(vec!["/bin/ls".into(), "/usr/local/bin".into()]);
    let listed = lab.run_container("list-binaries", &list)?;
    let binaries: Vec<String> = listed.split_whitespace().map(str::to_owned).collect();
    let help = if binaries.iter().any(|b| b == "nodemedic") {
        let mut help = ContainerSpec::new(image, ["--help"]);
        help.command = Some(vec!["/usr/local/bin/nodemedic".into()]);
        lab.run_container("help", &help)?
    } else {
        String::new()
    };
    Ok((binaries, help))
}

fn day_long_token() -> TokenRequest {
    TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: None,
            expiration_seconds: Some(24 * 3600),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    /// Both recipes of the controller image (the one `make image` runs and the Dockerfile) drop
    /// every agent the CRDs refuse: the images test checks the first's image, nothing can build
    /// the second's here.
    #[test]
    fn both_image_recipes_drop_every_agent_that_does_not_fence_by_power() {
        let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        for recipe in ["scripts/build-images.sh", "Dockerfile"] {
            let text = std::fs::read_to_string(format!("{repo}/{recipe}")).expect("the recipe");
            for (agent, _) in nodemedic_api::fence_agents::NOT_BY_POWER {
                let word = text
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|w| w == *agent);
                assert!(word, "{recipe} keeps {agent}, which the CRDs refuse");
            }
        }
    }
}
