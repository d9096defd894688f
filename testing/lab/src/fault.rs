//! The lab's fault vocabulary: one [`Fault`] type that the playground's command line parses
//! (clap), its socket carries and the fault campaign plans (serde), and [`Lab::inject`] /
//! [`Lab::undo`], which do it. A new fault is a variant here, its arm in [`Lab::inject`] and in
//! [`Fault::undoing`], and the method that has its effect.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{Error, Lab, Result};

/// How a fault names a node: by name (`String`, the default), or by anything a caller resolves
/// to a name before injecting it (the fault campaign's slots, `usize`).
pub trait NodeId: Clone + fmt::Debug + Send + Sync + FromStr + 'static {}

impl<T: Clone + fmt::Debug + Send + Sync + FromStr + 'static> NodeId for T {}

fn node_id<N: NodeId>(text: &str) -> std::result::Result<N, String> {
    text.parse().map_err(|_| format!("{text:?} names no node"))
}

/// A fault the lab can inject, or the injection that undoes one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::Subcommand)]
#[serde(tag = "action", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Fault<N: NodeId = String> {
    /// Power a node off and leave it off, recorded as a crash (undone by power-on).
    Crash {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Power a node off, as its BMC would.
    PowerOff {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Power a node on: it boots, and its processes start again.
    PowerOn {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Power-cycle a node.
    Reset {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Stop every process of a node (SIGSTOP): a hung kernel (undone by thaw).
    Freeze {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    Thaw {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Cut these nodes from everything except each other (undone by heal).
    Partition {
        #[arg(value_parser = node_id::<N>, required = true)]
        nodes: Vec<N>,
    },
    /// Drop only the node's traffic to and from the API server (undone by heal).
    IsolateFromApi {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Undo a partition or API isolation of a node.
    Heal {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Delay every packet the nodes send by delay ± jitter and drop some (every node when none
    /// is named; undone by restore-links).
    SlowLinks {
        #[arg(long, default_value_t = 200)]
        delay_ms: u64,
        #[arg(long, default_value_t = 100)]
        jitter_ms: u64,
        /// How many packets in a thousand are lost.
        #[arg(long, default_value_t = 50)]
        loss_permille: u32,
        #[arg(value_parser = node_id::<N>)]
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<N>,
    },
    /// Give the nodes' links back their speed (every slowed node when none is named).
    RestoreLinks {
        #[arg(value_parser = node_id::<N>)]
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<N>,
    },
    /// Kill the API server and leave it stopped (undone by start-apiserver).
    StopApiserver,
    StartApiserver,
    /// Kill etcd and leave it stopped: the API server answers, with errors (undone by
    /// start-etcd).
    StopEtcd,
    StartEtcd,
    /// Kill etcd and start it again.
    RestartEtcd,
    /// Stop a node's BMC processes: a BMC that accepts connections and never answers (undone by
    /// resume-bmc).
    HangBmc {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    ResumeBmc {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Fill a node's disk: its kubelet reports DiskPressure, and the node controller taints it
    /// (undone by free-disk).
    FillDisk {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    FreeDisk {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Throttle a node's nodemedic agent to `percent` of a CPU (undone by feed-agent).
    StarveAgent {
        #[arg(value_parser = node_id::<N>)]
        node: N,
        #[arg(long, default_value_t = 2)]
        percent: u64,
    },
    FeedAgent {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Put a node's nodemedic agent under memory pressure: a hog fills its memory cgroup's
    /// `headroom_mib` (undone by relieve-agent).
    SqueezeAgent {
        #[arg(value_parser = node_id::<N>)]
        node: N,
        #[arg(long, default_value_t = 64)]
        headroom_mib: u64,
    },
    RelieveAgent {
        #[arg(value_parser = node_id::<N>)]
        node: N,
    },
    /// Throttle etcd to `percent` of a CPU: it writes and answers slowly (undone by
    /// unthrottle-etcd).
    SlowEtcd {
        #[arg(long, default_value_t = 10)]
        percent: u64,
    },
    UnthrottleEtcd,
    /// Throttle the API server to `percent` of a CPU: it answers slowly (undone by
    /// unthrottle-apiserver).
    SlowApiserver {
        #[arg(long, default_value_t = 20)]
        percent: u64,
    },
    UnthrottleApiserver,
}

impl<N: NodeId> Fault<N> {
    /// The same fault with its nodes named otherwise (a campaign's slots resolved to names).
    pub fn resolve<M: NodeId, E>(
        &self,
        mut name: impl FnMut(&N) -> std::result::Result<M, E>,
    ) -> std::result::Result<Fault<M>, E> {
        let mut names = |nodes: &[N]| nodes.iter().map(&mut name).collect::<std::result::Result<Vec<M>, E>>();
        Ok(match self {
            Self::Crash { node } => Fault::Crash { node: name(node)? },
            Self::PowerOff { node } => Fault::PowerOff { node: name(node)? },
            Self::PowerOn { node } => Fault::PowerOn { node: name(node)? },
            Self::Reset { node } => Fault::Reset { node: name(node)? },
            Self::Freeze { node } => Fault::Freeze { node: name(node)? },
            Self::Thaw { node } => Fault::Thaw { node: name(node)? },
            Self::Partition { nodes } => Fault::Partition { nodes: names(nodes)? },
            Self::IsolateFromApi { node } => Fault::IsolateFromApi { node: name(node)? },
            Self::Heal { node } => Fault::Heal { node: name(node)? },
            Self::SlowLinks {
                delay_ms,
                jitter_ms,
                loss_permille,
                nodes,
            } => Fault::SlowLinks {
                delay_ms: *delay_ms,
                jitter_ms: *jitter_ms,
                loss_permille: *loss_permille,
                nodes: names(nodes)?,
            },
            Self::RestoreLinks { nodes } => Fault::RestoreLinks { nodes: names(nodes)? },
            Self::StopApiserver => Fault::StopApiserver,
            Self::StartApiserver => Fault::StartApiserver,
            Self::StopEtcd => Fault::StopEtcd,
            Self::StartEtcd => Fault::StartEtcd,
            Self::RestartEtcd => Fault::RestartEtcd,
            Self::HangBmc { node } => Fault::HangBmc { node: name(node)? },
            Self::ResumeBmc { node } => Fault::ResumeBmc { node: name(node)? },
            Self::FillDisk { node } => Fault::FillDisk { node: name(node)? },
            Self::FreeDisk { node } => Fault::FreeDisk { node: name(node)? },
            Self::StarveAgent { node, percent } => Fault::StarveAgent {
                node: name(node)?,
                percent: *percent,
            },
            Self::FeedAgent { node } => Fault::FeedAgent { node: name(node)? },
            Self::SqueezeAgent { node, headroom_mib } => Fault::SqueezeAgent {
                node: name(node)?,
                headroom_mib: *headroom_mib,
            },
            Self::RelieveAgent { node } => Fault::RelieveAgent { node: name(node)? },
            Self::SlowEtcd { percent } => Fault::SlowEtcd { percent: *percent },
            Self::UnthrottleEtcd => Fault::UnthrottleEtcd,
            Self::SlowApiserver { percent } => Fault::SlowApiserver { percent: *percent },
            Self::UnthrottleApiserver => Fault::UnthrottleApiserver,
        })
    }

    /// What undoes this fault; nothing for a fault that undoes itself or another.
    pub fn undoing(&self) -> Vec<Fault<N>> {
        match self {
            Self::Crash { node } | Self::PowerOff { node } => vec![Fault::PowerOn { node: node.clone() }],
            Self::Freeze { node } => vec![Fault::Thaw { node: node.clone() }],
            Self::Partition { nodes } => nodes.iter().map(|node| Fault::Heal { node: node.clone() }).collect(),
            Self::IsolateFromApi { node } => vec![Fault::Heal { node: node.clone() }],
            Self::SlowLinks { nodes, .. } => vec![Fault::RestoreLinks { nodes: nodes.clone() }],
            Self::StopApiserver => vec![Fault::StartApiserver],
            Self::StopEtcd => vec![Fault::StartEtcd],
            Self::HangBmc { node } => vec![Fault::ResumeBmc { node: node.clone() }],
            Self::FillDisk { node } => vec![Fault::FreeDisk { node: node.clone() }],
            Self::StarveAgent { node, .. } => vec![Fault::FeedAgent { node: node.clone() }],
            Self::SqueezeAgent { node, .. } => vec![Fault::RelieveAgent { node: node.clone() }],
            Self::SlowEtcd { .. } => vec![Fault::UnthrottleEtcd],
            Self::SlowApiserver { .. } => vec![Fault::UnthrottleApiserver],
            Self::FeedAgent { .. }
            | Self::RelieveAgent { .. }
            | Self::UnthrottleEtcd
            | Self::UnthrottleApiserver
            | Self::PowerOn { .. }
            | Self::Reset { .. }
            | Self::Thaw { .. }
            | Self::Heal { .. }
            | Self::RestoreLinks { .. }
            | Self::StartApiserver
            | Self::StartEtcd
            | Self::RestartEtcd
            | Self::ResumeBmc { .. }
            | Self::FreeDisk { .. } => Vec::new(),
        }
    }
}

impl<N: NodeId + Serialize> Fault<N> {
    /// The fault's kebab-case name, as on the command line and in a plan.
    pub fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v["action"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// `crash node-1`, `partition node-1,node-2`, `slow-links (delayMs 200, jitterMs 100,
/// lossPermille 50)`: its name, its nodes, its settings, read from its serialized form so a new
/// fault needs nothing here.
impl<N: NodeId + Serialize> fmt::Display for Fault<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = serde_json::to_value(self).map_err(|_| fmt::Error)?;
        let serde_json::Value::Object(fields) = value else {
            return Err(fmt::Error);
        };
        let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        let mut settings = Vec::new();
        write!(f, "{}", self.kind())?;
        for (key, value) in &fields {
            match (key.as_str(), value) {
                ("action", _) => {}
                ("node", node) => write!(f, " {}", text(node))?,
                ("nodes", serde_json::Value::Array(nodes)) => {
                    write!(f, " {}", nodes.iter().map(text).collect::<Vec<_>>().join(","))?;
                }
                (key, value) => settings.push(format!("{key} {}", text(value))),
            }
        }
        if !settings.is_empty() {
            write!(f, " ({})", settings.join(", "))?;
        }
        Ok(())
    }
}

/// The lab process of a node's nodemedic agent, and the control plane's.
fn agent(node: &str) -> String {
    format!("{node}/agent")
}
const ETCD: &str = "etcd";
const APISERVER: &str = "kube-apiserver";

impl Lab {
    /// Injects the fault (or the injection that undoes another), recorded on the timeline.
    pub async fn inject(&self, fault: &Fault) -> Result<()> {
        match fault {
            Fault::Crash { node } => self.crash(node).await,
            Fault::PowerOff { node } => self.power_off(node).await,
            Fault::PowerOn { node } => self.power_on(node).await,
            Fault::Reset { node } => self.reset(node).await,
            Fault::Freeze { node } => self.freeze(node).await,
            Fault::Thaw { node } => self.thaw(node).await,
            Fault::Partition { nodes } => self.partition(&names(nodes)).await,
            Fault::IsolateFromApi { node } => self.isolate_from_api(node).await,
            Fault::Heal { node } => self.heal(node).await,
            Fault::SlowLinks {
                delay_ms,
                jitter_ms,
                loss_permille,
                nodes,
            } => {
                let nodes = if nodes.is_empty() { self.nodes() } else { nodes.clone() };
                let (delay, jitter) = (Duration::from_millis(*delay_ms), Duration::from_millis(*jitter_ms));
                let loss_percent = f64::from(*loss_permille) / 10.0;
                self.slow_links(&names(&nodes), delay, jitter, loss_percent).await
            }
            Fault::RestoreLinks { nodes } => {
                let nodes = if nodes.is_empty() {
                    self.slowed_nodes()?
                } else {
                    nodes.clone()
                };
                self.restore_links(&names(&nodes)).await
            }
            Fault::StopApiserver => self.stop_apiserver().await,
            Fault::StartApiserver => self.start_apiserver().await,
            Fault::StopEtcd => self.stop_etcd().await,
            Fault::StartEtcd => self.start_etcd().await,
            Fault::RestartEtcd => self.restart_etcd().await,
            Fault::HangBmc { node } => self.hang_bmc(node).await,
            Fault::ResumeBmc { node } => self.resume_bmc(node).await,
            Fault::FillDisk { node } => self.fill_disk(node).await,
            Fault::FreeDisk { node } => self.free_disk(node).await,
            Fault::StarveAgent { node, percent } => self.throttle_cpu(&agent(node), *percent),
            Fault::FeedAgent { node } => self.unthrottle_cpu(&agent(node)),
            Fault::SqueezeAgent { node, headroom_mib } => self.squeeze_memory(&agent(node), *headroom_mib),
            Fault::RelieveAgent { node } => self.release_memory(&agent(node)).await,
            Fault::SlowEtcd { percent } => self.throttle_cpu(ETCD, *percent),
            Fault::UnthrottleEtcd => self.unthrottle_cpu(ETCD),
            Fault::SlowApiserver { percent } => self.throttle_cpu(APISERVER, *percent),
            Fault::UnthrottleApiserver => self.unthrottle_cpu(APISERVER),
        }
    }

    /// Undoes the fault: injects what [`Fault::undoing`] names, in order.
    pub async fn undo(&self, fault: &Fault) -> Result<()> {
        let undoing = fault.undoing();
        if undoing.is_empty() {
            return Err(Error::Invalid(format!(
                "{fault} is not a fault that stays: nothing undoes it"
            )));
        }
        for step in &undoing {
            self.inject(step).await?;
        }
        Ok(())
    }
}

/// The lab's fault calls take node names as `&[&str]`.
fn names(nodes: &[String]) -> Vec<&str> {
    nodes.iter().map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        fault: Fault,
    }

    fn parse(args: &[&str]) -> Fault {
        Cli::try_parse_from(std::iter::once("lab").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"))
            .fault
    }

    #[test]
    fn the_command_line_the_wire_and_a_plan_spell_a_fault_the_same_way() {
        let fault = parse(&["partition", "node-1", "node-2"]);
        assert_eq!(
            fault,
            Fault::Partition {
                nodes: vec!["node-1".into(), "node-2".into()]
            }
        );
        let wire = serde_json::to_string(&fault).expect("serializes");
        assert_eq!(wire, r#"{"action":"partition","nodes":["node-1","node-2"]}"#);
        assert_eq!(serde_json::from_str::<Fault>(&wire).expect("parses"), fault);
        assert_eq!(fault.to_string(), "partition node-1,node-2");
        let by_slot = fault.resolve(|name| name.trim_start_matches("node-").parse::<usize>());
        assert_eq!(by_slot, Ok(Fault::Partition { nodes: vec![1, 2] }));
    }

    #[test]
    fn slow_links_default_to_what_the_defaults_must_hold_and_name_every_node_by_none() {
        let fault = parse(&["slow-links"]);
        assert_eq!(
            fault,
            Fault::SlowLinks {
                delay_ms: 200,
                jitter_ms: 100,
                loss_permille: 50,
                nodes: Vec::new()
            }
        );
        assert_eq!(
            serde_json::to_string(&fault).expect("serializes"),
            r#"{"action":"slow-links","delayMs":200,"jitterMs":100,"lossPermille":50}"#
        );
        assert_eq!(
            fault.to_string(),
            "slow-links (delayMs 200, jitterMs 100, lossPermille 50)"
        );
        assert_eq!(fault.undoing(), vec![Fault::RestoreLinks { nodes: Vec::new() }]);
    }

    #[test]
    fn every_fault_that_stays_names_what_undoes_it() {
        let node = || "node-1".to_owned();
        assert_eq!(
            parse(&["fill-disk", "node-1"]).undoing(),
            vec![Fault::FreeDisk { node: node() }]
        );
        assert_eq!(
            parse(&["crash", "node-1"]).undoing(),
            vec![Fault::PowerOn { node: node() }]
        );
        assert_eq!(
            parse(&["partition", "node-1", "node-2"]).undoing(),
            vec![Fault::Heal { node: node() }, Fault::Heal { node: "node-2".into() }]
        );
        assert_eq!(parse(&["stop-etcd"]).undoing(), vec![Fault::StartEtcd]);
        assert!(parse(&["restart-etcd"]).undoing().is_empty());
        assert!(
            Cli::try_parse_from(["lab", "partition"]).is_err(),
            "a partition names its nodes"
        );
    }
}
