//! One node's BMC emulators: their files, their processes, and waiting until they answer.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncWriteExt;

use super::{Bmc, BmcOptions, IPMI_PORT, PowerDelays, REDFISH_PORT};
use crate::{Error, Lab, ProcessSpec, Result, binaries, error::io, lab::process_died, wait};

/// The sushy-emulator launcher (run by the sushy-tools virtualenv's python).
const SUSHY_BMC: &str = include_str!("sushy_bmc.py");
/// `ipmi_sim`'s chassis_control program.
const IPMI_CHASSIS: &str = include_str!("ipmi_chassis.py");
/// What every power emulator imports to tell the lab a node's power changes (beside it, where
/// Python finds a script's modules).
pub(super) const LAB_POWER: (&str, &str) = ("lab_power.py", include_str!("lab_power.py"));

/// The two scripts and their shared module, written once into the lab directory.
pub(crate) struct Scripts {
    python: PathBuf,
    sushy: PathBuf,
    chassis: PathBuf,
}

impl Scripts {
    pub(super) fn write(dir: &Path, python: PathBuf) -> Result<Self> {
        let scripts = Self {
            python,
            sushy: dir.join("sushy_bmc.py"),
            chassis: dir.join("ipmi_chassis.py"),
        };
        write(&scripts.sushy, SUSHY_BMC)?;
        write(&scripts.chassis, IPMI_CHASSIS)?;
        write(&dir.join(LAB_POWER.0), LAB_POWER.1)?;
        Ok(scripts)
    }
}

pub(super) fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

/// The names the lab runs a node's BMC processes under: no `/`, so they are host processes
/// that outlive the node's power.
pub(crate) fn process_names(node: &str) -> [String; 2] {
    [format!("bmc-redfish-{node}"), format!("bmc-ipmi-{node}")]
}

pub(crate) struct NodeBmc<'a> {
    pub node: &'a str,
    pub index: usize,
    pub ip: Ipv4Addr,
    pub lab_id: &'a str,
    pub dir: PathBuf,
    /// Certificate and key for the Redfish endpoint.
    pub tls: (PathBuf, PathBuf),
    pub socket: PathBuf,
    pub options: &'a BmcOptions,
}

impl NodeBmc<'_> {
    /// Both emulators keep the node's power state in one file: one BMC, two protocols.
    fn power_file(&self) -> PathBuf {
        self.dir.join("power")
    }

    pub(super) fn processes(&self, scripts: &Scripts) -> Result<Vec<(String, ProcessSpec)>> {
        std::fs::create_dir_all(&self.dir).map_err(io(format!("creating {}", self.dir.display())))?;
        write(&self.power_file(), "On")?;
        let [redfish_name, ipmi_name] = process_names(self.node);
        Ok(vec![
            (redfish_name, self.redfish(scripts)?),
            (ipmi_name, self.ipmi(scripts)?),
        ])
    }

    fn redfish(&self, scripts: &Scripts) -> Result<ProcessSpec> {
        let state = self.dir.join("redfish");
        std::fs::create_dir_all(&state).map_err(io(format!("creating {}", state.display())))?;
        let uuid = format!("{}0000-0000-4000-8000-{:012x}", self.lab_id, self.index + 1);
        let delays = match self.options.delays {
            PowerDelays::None => "none",
            PowerDelays::Realistic => "realistic",
        };
        let args = [
            scripts.sushy.display().to_string(),
            self.node.to_owned(),
            self.ip.to_string(),
            REDFISH_PORT.to_string(),
            uuid,
            self.tls.0.display().to_string(),
            self.tls.1.display().to_string(),
            state.display().to_string(),
            self.power_file().display().to_string(),
            self.socket.display().to_string(),
            delays.to_owned(),
        ];
        Ok(ProcessSpec::new(&scripts.python, args)
            .env("BMC_USERNAME", &self.options.username)
            .env("BMC_PASSWORD", &self.options.password))
    }

    fn ipmi(&self, scripts: &Scripts) -> Result<ProcessSpec> {
        let state = self.dir.join("ipmi");
        std::fs::create_dir_all(&state).map_err(io(format!("creating {}", state.display())))?;
        let power = self.power_file();
        // ipmi_sim runs chassis_control through the shell, appending `get ...` or `set ...`.
        let chassis = [
            scripts.python.as_path(),
            scripts.chassis.as_path(),
            Path::new(self.node),
            power.as_path(),
            self.socket.as_path(),
        ]
        .map(|p| p.display().to_string());
        if let Some(bad) = chassis
            .iter()
            .find(|a| a.contains(|c: char| c.is_whitespace() || "\"'\\$`".contains(c)))
        {
            return Err(Error::Invalid(format!(
                "{bad}: a BMC path or node name the shell would split"
            )));
        }
        let (user, password) = (&self.options.username, &self.options.password);
        // No anonymous user and no `none`/`straight` authentication: over IPMI 1.5 as over 2.0
        // a wrong password is refused. One admin user, as fence_ipmilan expects.
        let lan_conf = format!(
            "name \"lab-bmc\"\n\
             set_working_mc 0x20\n\
             \x20 startlan 1\n\
             \x20   addr {ip} {IPMI_PORT}\n\
             \x20   priv_limit admin\n\
             \x20   allowed_auths_callback md2 md5\n\
             \x20   allowed_auths_user md2 md5\n\
             \x20   allowed_auths_operator md2 md5\n\
             \x20   allowed_auths_admin md2 md5\n\
             \x20   guid {id}{guid:028x}\n\
             \x20 endlan\n\
             \x20 chassis_control \"{chassis} 0x20\"\n\
             \x20 user 2 true \"{user}\" \"{password}\" admin 10 md2 md5\n",
            ip = self.ip,
            id = self.lab_id,
            guid = self.index + 1,
            chassis = chassis.join(" "),
        );
        let lan = self.dir.join("lan.conf");
        write(&lan, &lan_conf)?;
        let emu = self.dir.join("emu.cmd");
        write(
            &emu,
            "mc_setbmc 0x20\n\
             mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n\
             sel_enable 0x20 1000 0x0a\n\
             mc_enable 0x20\n",
        )?;
        let args = [
            "-c".to_owned(),
            lan.display().to_string(),
            "-f".to_owned(),
            emu.display().to_string(),
            "-s".to_owned(),
            state.display().to_string(),
            "-n".to_owned(),
        ];
        Ok(ProcessSpec::new(binaries::tool("ipmi_sim")?, args))
    }
}

/// `fence_redfish`'s options (on its stdin) for `action` against this BMC.
pub(crate) fn redfish_options(bmc: &Bmc, action: &str) -> String {
    format!(
        "ip={}\nipport={}\nusername={}\npassword={}\nsystems_uri={}\nssl_insecure=1\naction={action}\n",
        bmc.ip, bmc.redfish_port, bmc.username, bmc.password, bmc.systems_uri
    )
}

/// `fence_ipmilan`'s options: lanplus with cipher suite 3 (without it, every call against
/// `ipmi_sim` first spends 10-14 s failing to list cipher suites).
pub(crate) fn ipmi_options(bmc: &Bmc, action: &str) -> String {
    format!(
        "ip={}\nipport={}\nusername={}\npassword={}\nlanplus=1\ncipher=3\naction={action}\n",
        bmc.ip, bmc.ipmi_port, bmc.username, bmc.password
    )
}

/// Runs a fence agent with `options` on its stdin; its exit code, or None when it did not
/// finish within `timeout` (fence_redfish has no network timeout of its own) or was killed.
pub(crate) async fn run_agent(agent: &str, options: &str, timeout: Duration) -> Result<Option<i32>> {
    let mut child = tokio::process::Command::new(binaries::tool(agent)?)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(io(format!("running {agent}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(options.as_bytes())
            .await
            .map_err(io(format!("writing {agent}'s options")))?;
    }
    Ok(tokio::time::timeout(timeout, child.wait())
        .await
        .ok()
        .and_then(|status| status.ok())
        .and_then(|status| status.code()))
}

/// Waits until both of the node's BMCs answer a status request with On (exit code 0).
pub(crate) async fn wait_answering(lab: &Lab, node: &str, bmc: &Bmc, timeout: Duration) -> Result<()> {
    let names = process_names(node);
    wait::until(&format!("the BMCs of {node} to answer"), timeout, || async {
        if let Some(died) = names.iter().find_map(|n| process_died(&lab.inner.resources, n)) {
            return Err(died);
        }
        let attempt = Duration::from_secs(10);
        let redfish = run_agent("fence_redfish", &redfish_options(bmc, "status"), attempt).await?;
        let ipmi = run_agent("fence_ipmilan", &ipmi_options(bmc, "status"), attempt).await?;
        Ok((redfish == Some(0) && ipmi == Some(0)).then_some(()))
    })
    .await
    .map_err(|e| match e {
        // A BMC that died says more than the timeout.
        Error::Timeout { .. } => names
            .iter()
            .find_map(|n| process_died(&lab.inner.resources, n))
            .unwrap_or(e),
        other => other,
    })
}
