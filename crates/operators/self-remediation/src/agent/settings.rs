//! The agent's command line. The manager renders it from the SelfNodeRemediationConfig into the
//! agent DaemonSet (as medik8s renders its environment), so a config change re-creates the agents.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::Args;
use nodemedic_api::GoDuration;
use nodemedic_peer_detection::DetectorSettings;

use crate::protocol::LicenceSettings;

fn duration(text: &str) -> Result<Duration, String> {
    text.parse::<GoDuration>()
        .and_then(|d| d.duration())
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// The node this agent runs on.
    #[arg(long, env = "MY_NODE_NAME")]
    pub node: String,
    #[arg(long, env = "DEPLOYMENT_NAMESPACE", default_value = nodemedic_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The address peers reach this agent on (the pod IP).
    #[arg(long, env = "MY_POD_IP")]
    pub address: IpAddr,
    #[arg(long, env = "HOST_PORT", default_value_t = 9447)]
    pub host_port: u16,
    /// The watchdog device, an absolute path (`/dev/watchdog`); any other path (relative, with a
    /// `..` component) is refused without being opened. When it is refused or cannot be opened
    /// the agent falls back to an existing softdog device, then (with `--software-reboot`) to its
    /// own timer, then to nothing; it never exits for lack of one.
    #[arg(long, env = "WATCHDOG_PATH", default_value = "/dev/watchdog")]
    pub watchdog: String,
    /// Reboot through /proc/sysrq-trigger: at once when the node must fence, and as the
    /// watchdog of a node without a device.
    #[arg(long, env = "IS_SOFTWARE_REBOOT_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub software_reboot: bool,
    /// The timeout to program into the watchdog device (WDIOC_SETTIMEOUT); 0 keeps the driver's
    /// own. The agent registers what the driver applied, so the safe time follows.
    #[arg(long, env = "WATCHDOG_TIMEOUT", default_value = "0s", value_parser = duration)]
    pub watchdog_timeout: Duration,
    /// The program that loads the softdog module (`<program> softdog`) when the node has neither
    /// the configured device nor a softdog device; empty: never load it. The agent image carries
    /// modprobe; the DaemonSet gives it the node's /lib/modules. Only a test lab points it
    /// elsewhere (at a stand-in: tests must not load kernel modules).
    #[arg(long, default_value = "modprobe")]
    pub modprobe: PathBuf,
    /// Where the kernel describes watchdog devices, to find a softdog by its identity. Only a
    /// test lab points it elsewhere, with `--device-dir`.
    #[arg(long, default_value = "/sys/class/watchdog", hide = true)]
    pub watchdog_class_dir: PathBuf,
    /// Where the watchdog device files named in `--watchdog-class-dir` are.
    #[arg(long, default_value = "/dev", hide = true)]
    pub device_dir: PathBuf,
    /// The sysrq trigger a software reboot writes `b` to. Only a test lab points it elsewhere (at
    /// a file it watches, as its nodes share the host's kernel).
    #[arg(long, default_value = crate::watchdog::SYSRQ_TRIGGER)]
    pub sysrq_trigger: PathBuf,
    /// Where the node's boot time is read: a file holding an RFC 3339 time. Default: `btime`
    /// of /proc/stat. (The lab's nodes share the host's kernel; the lab records each simulated
    /// boot in such a file.)
    #[arg(long)]
    pub boot_time_file: Option<PathBuf>,
    #[arg(long, env = "API_CHECK_INTERVAL", default_value = "15s", value_parser = duration)]
    pub api_check_interval: Duration,
    #[arg(long, env = "API_SERVER_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub api_server_timeout: Duration,
    #[arg(long, env = "MAX_API_ERROR_THRESHOLD", default_value_t = 3)]
    pub max_api_error_threshold: u32,
    #[arg(long, env = "PEER_DIAL_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub peer_dial_timeout: Duration,
    #[arg(long, env = "PEER_REQUEST_TIMEOUT", default_value = "7s", value_parser = duration)]
    pub peer_request_timeout: Duration,
    /// How often the peer list (registrations and membership) is read again; a membership
    /// change is read at once as well.
    #[arg(long, env = "PEER_UPDATE_INTERVAL", default_value = "15m", value_parser = duration)]
    pub peer_update_interval: Duration,
    /// The timeout of the peer-list read.
    #[arg(long, env = "PEER_API_SERVER_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub peer_api_server_timeout: Duration,
    /// Probed when the API check fails, for the log and a metric only: reaching an endpoint
    /// proves nothing about remediations, so it never grants a licence.
    #[arg(long, env = "END_POINT_HEALTH_CHECK_URL")]
    pub endpoint_health_check_url: Option<String>,
    /// Where the agent keeps its peer certificate across restarts.
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/nodemedic")]
    pub state_dir: PathBuf,
    /// Where the metrics are served (none without it).
    #[arg(long)]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Serve them over HTTPS with the peer certificate, to callers whose token the API server
    /// authenticates and who may `get` the path `/metrics` (the chart's nodemedic-metrics-reader).
    #[arg(long)]
    pub metrics_secure: bool,
    /// The peer failure detector (docs/peer-detection.md): runs when `--probe-period` is given.
    #[arg(long, value_parser = duration)]
    pub probe_period: Option<Duration>,
    #[arg(long, default_value = "200ms", value_parser = duration)]
    pub probe_rtt: Duration,
    #[arg(long, default_value_t = 3)]
    pub num_indirect_probes: u8,
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub suspect_to_down_after: Duration,
    #[arg(long)]
    pub log_json: bool,
}

impl AgentArgs {
    /// The detector's settings, when it runs; settings it cannot work with are refused, each
    /// with its fix.
    pub fn detector(&self) -> Result<Option<DetectorSettings>, String> {
        let Some(probe_period) = self.probe_period else {
            return Ok(None);
        };
        let settings = DetectorSettings {
            probe_period,
            probe_rtt: self.probe_rtt,
            indirect_probes: self.num_indirect_probes,
            suspect_to_down_after: self.suspect_to_down_after,
        };
        let problems: Vec<String> = settings.validate().iter().map(ToString::to_string).collect();
        if problems.is_empty() {
            Ok(Some(settings))
        } else {
            Err(problems.join("; "))
        }
    }

    pub fn licence(&self) -> LicenceSettings {
        LicenceSettings {
            api_check_interval: self.api_check_interval,
            api_server_timeout: self.api_server_timeout,
            max_api_error_threshold: self.max_api_error_threshold.max(1),
            peer_dial_timeout: self.peer_dial_timeout,
            peer_request_timeout: self.peer_request_timeout,
        }
    }
}
