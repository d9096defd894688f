//! A BMC per node on the management bridge: a Redfish one (sushy-tools' emulator, fake driver,
//! over TLS on port 443) and an IPMI one (OpenIPMI's `ipmi_sim`, UDP port 623), both on the
//! host at the node's BMC address, so the real fence agents drive them as they would a server's.
//! Their power off and on are the lab's power-off and power-on of the node: each BMC reports a
//! change on the lab's BMC socket and waits for the lab to act before it answers (see `power`).
//!
//! A BMC's power state is its own, as a real one's is: a lab `crash` leaves it saying On, as a
//! hung server's BMC does.

pub mod cloud;
mod emulators;
mod power;

pub(crate) use emulators::process_names;

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use nix::sys::signal::Signal;

use crate::{
    Error, Lab, Result,
    binaries::{self, cache_dir, version},
    error::io,
    timeline::Event,
};

/// How fast a BMC's power transitions are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PowerDelays {
    /// Applied at once: the request that asks for Off returns once the node is off.
    #[default]
    None,
    /// The Redfish emulator's own random 1-11 s per transition, as slow as real BMCs (IPMI
    /// stays immediate: `ipmi_sim` has no delays).
    Realistic,
}

#[derive(Clone, Debug)]
pub struct BmcOptions {
    pub delays: PowerDelays,
    pub username: String,
    pub password: String,
    /// A lab cloud too: the nodes are EC2 instances of moto's emulator ([`cloud`]), for fence_aws.
    pub aws: bool,
}

impl Default for BmcOptions {
    /// The credentials of the seed manifests (`002-far-*.yaml`).
    fn default() -> Self {
        Self {
            delays: PowerDelays::None,
            username: "ansible".into(),
            password: "n0tPassword".into(),
            aws: false,
        }
    }
}

/// How to reach a node's BMC: one power state, spoken over Redfish and IPMI.
#[derive(Clone, Debug)]
pub struct Bmc {
    pub ip: Ipv4Addr,
    /// Redfish over HTTPS.
    pub redfish_port: u16,
    /// IPMI over LAN (UDP); use `lanplus` with cipher suite 3.
    pub ipmi_port: u16,
    /// The Redfish system (by name; the emulator redirects to its UUID).
    pub systems_uri: String,
    pub username: String,
    pub password: String,
    /// The CA that signed the Redfish certificate (whose SAN is `ip`).
    pub tls_ca: PathBuf,
}

pub(crate) const REDFISH_PORT: u16 = 443;
pub(crate) const IPMI_PORT: u16 = 623;
const SYSTEMS_URI: &str = "/redfish/v1/Systems/1";

fn venv_python() -> PathBuf {
    cache_dir()
        .join(format!("venv-sushy-tools-{}", version("SUSHY_TOOLS_VERSION")))
        .join("bin/python")
}

/// Checks what BMCs need: the sushy-tools virtualenv, `ipmi_sim` and the fence agents (the lab
/// waits for each BMC with them).
pub(crate) fn preflight() -> Result<()> {
    let setup = "(installed by scripts/setup.sh)";
    let python = venv_python();
    if !python.exists() || !python.with_file_name("sushy-emulator").exists() {
        return Err(Error::MissingTool {
            what: format!("the sushy-tools virtualenv {} {setup}", python.display()),
        });
    }
    for tool in ["ipmi_sim", "ipmitool", "fence_redfish", "fence_ipmilan"] {
        binaries::tool(tool).map_err(|_| Error::MissingTool {
            what: format!("{tool} {setup}"),
        })?;
    }
    Ok(())
}

/// Credentials go into `lan.conf` (quoted), an htpasswd line and the agents' `key=value` stdin.
fn validate(options: &BmcOptions) -> Result<()> {
    let fits = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.chars().all(|c| c.is_ascii_graphic() && !"\"\\:".contains(c))
    };
    // IPMI allows 16-byte user names and 20-byte (IPMI 2.0) passwords.
    if fits(&options.username, 16) && fits(&options.password, 20) {
        Ok(())
    } else {
        Err(Error::Invalid(
            "BMC credentials must be printable ASCII without spaces, quotes, backslashes or colons, a user name of at most 16 bytes and a password of at most 20".into(),
        ))
    }
}

impl Lab {
    /// The node's BMCs. Fails when the lab was started without [`crate::LabConfig::with_bmcs`].
    pub fn bmc(&self, node: &str) -> Result<Bmc> {
        let index = self.inner.index(node)?;
        let options = self.bmc_options()?;
        Ok(Bmc {
            ip: self.inner.resources.net.bmc_ip(index)?,
            redfish_port: REDFISH_PORT,
            ipmi_port: IPMI_PORT,
            systems_uri: SYSTEMS_URI.into(),
            username: options.username.clone(),
            password: options.password.clone(),
            tls_ca: self.inner.pki.path("ca.crt"),
        })
    }

    /// Stops the node's BMC processes (SIGSTOP): a BMC that accepts connections but never
    /// answers. The node itself runs on.
    pub async fn hang_bmc(&self, node: &str) -> Result<()> {
        self.signal_bmc(node, Signal::SIGSTOP, "hang-bmc")
    }

    pub async fn resume_bmc(&self, node: &str) -> Result<()> {
        self.signal_bmc(node, Signal::SIGCONT, "resume-bmc")
    }

    fn bmc_options(&self) -> Result<&BmcOptions> {
        self.inner
            .config
            .bmcs
            .as_ref()
            .ok_or_else(|| Error::Invalid("this lab has no BMCs: start it with LabConfig::with_bmcs".into()))
    }

    fn signal_bmc(&self, node: &str, signal: Signal, fault: &str) -> Result<()> {
        self.inner.index(node)?;
        self.bmc_options()?;
        let procs = self
            .inner
            .resources
            .processes
            .lock()
            .map_err(|_| Error::Invalid("process table poisoned".into()))?;
        for name in emulators::process_names(node) {
            procs
                .by_name
                .get(&name)
                .ok_or_else(|| Error::UnknownProcess(name.clone()))?
                .signal(signal);
        }
        self.inner.timeline.record(Event::Fault {
            node: Some(node.to_owned()),
            fault: fault.to_owned(),
        });
        Ok(())
    }

    /// Starts the report socket and every node's BMCs (after the lab exists, so a failure tears
    /// everything down).
    pub(crate) fn start_bmcs(&mut self) -> Result<()> {
        let Some(options) = self.inner.config.bmcs.clone() else {
            return Ok(());
        };
        validate(&options)?;
        let dir = self.dir().join("bmc");
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let socket = dir.join("power.sock");
        self.tasks.push(power::serve(self.inner.clone(), &socket)?);
        let scripts = emulators::Scripts::write(&dir, venv_python())?;
        for (node, index) in self.inner.nodes.indices() {
            let ip = self.inner.resources.net.add_bmc_address(index)?;
            let tls = self.inner.pki.issue_server(&format!("bmc-{node}"), ip)?;
            let bmc = emulators::NodeBmc {
                node: &node,
                index,
                ip,
                lab_id: &self.inner.id,
                dir: dir.join(&node),
                tls,
                socket: socket.clone(),
                options: &options,
            };
            for (name, spec) in bmc.processes(&scripts)? {
                self.add_host_process(&name, spec)?;
            }
        }
        if options.aws {
            cloud::preflight()?;
            cloud::start(self, &socket)?;
        }
        Ok(())
    }

    /// Waits until every BMC answers a status request of the real fence agents.
    pub(crate) async fn wait_bmcs(&self) -> Result<()> {
        if self.inner.config.bmcs.is_none() {
            return Ok(());
        }
        let waits = self.nodes().into_iter().map(|node| async move {
            let bmc = self.bmc(&node)?;
            emulators::wait_answering(self, &node, &bmc, Duration::from_secs(60)).await
        });
        futures::future::try_join_all(waits).await?;
        if self.bmc_options()?.aws {
            cloud::wait_serving(self).await?;
        }
        Ok(())
    }
}
