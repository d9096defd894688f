//! The campaign's pure parts: plans (drawn, validated, counted) and the verdict's checks on
//! hand-made timelines.

mod fences;
mod plan;
mod verdict;

use std::time::Duration;

use jiff::Timestamp;
use nodemedic_healthcheck::decide::{Budget, IntOrPercent};
use nodemedic_lab::{
    NodeCondition, PodId,
    timeline::{Entry, Event},
};

use nodemedic_self_remediation::protocol::LicenceSettings;

use super::verdict::{AgentTimings, Detection, Params, Violation, ViolationKind};

fn params() -> Params {
    // Three nodes, minHealthy 51 %: one may be unhealthy.
    Params {
        nodes: 3,
        budget: Budget::MinHealthy(IntOrPercent::Percent(51)),
        remediate_after: Duration::from_secs(25),
        fence_grace: Duration::from_secs(20),
        agents: Some(agents()),
        detection: Detection {
            after: Duration::from_secs(9),
            lag: Duration::from_secs(10),
            renewal: Duration::from_secs(1),
        },
        control_plane_one_at_a_time: true,
        control_plane_settle: Duration::from_secs(15),
    }
}

/// The lab's fast agents: `L` = 2 × (1 s + 0.5 s) + 0.5 s + 0.5 s = 4 s, rounds every 1.5 s at
/// most (a 0.5 s read that times out, then a 1 s vote round), a 3 s watchdog fed every second:
/// the shortest lapse is 4 + 3 − 1.5 − 1 − 0.05 = 4.45 s.
fn agents() -> AgentTimings {
    let ms = Duration::from_millis;
    AgentTimings::new(
        &LicenceSettings {
            api_check_interval: ms(1000),
            api_server_timeout: ms(500),
            max_api_error_threshold: 2,
            peer_dial_timeout: ms(500),
            peer_request_timeout: ms(500),
        },
        Duration::from_secs(3),
    )
}

/// A hand-made timeline, one entry per call at the given second.
#[derive(Default)]
struct Script(Vec<Entry>);

impl Script {
    fn at(&mut self, s: i64, event: Event) -> &mut Self {
        self.0.push(Entry {
            at: t(s),
            revision: None,
            event,
        });
        self
    }
    fn cond(&mut self, s: i64, node: &str, powered: bool, partitioned: bool) -> &mut Self {
        let condition = NodeCondition {
            powered,
            partitioned,
            ..NodeCondition::default()
        };
        self.at(
            s,
            Event::NodeCondition {
                node: node.into(),
                condition,
            },
        )
    }
    fn power_off(&mut self, s: i64, node: &str, cause: &str) -> &mut Self {
        self.at(
            s,
            Event::Power {
                node: node.into(),
                on: false,
                cause: cause.into(),
            },
        )
        .cond(s, node, false, false)
    }
    fn remediation(&mut self, s: i64, node: &str, change: &str) -> &mut Self {
        self.at(
            s,
            Event::Remediation {
                kind: "SelfNodeRemediation".into(),
                name: node.into(),
                node: node.into(),
                change: change.into(),
                created_at: None,
            },
        )
    }
    /// A fault of the whole lab, as the lab or the runner records it.
    fn fault(&mut self, s: i64, fault: &str) -> &mut Self {
        self.at(
            s,
            Event::Fault {
                node: None,
                fault: fault.into(),
            },
        )
    }
    /// The API answering again, as the runner notes it.
    fn back(&mut self, s: i64) -> &mut Self {
        self.at(
            s,
            Event::Note {
                text: super::verdict::CONTROL_PLANE_BACK.into(),
            },
        )
    }
    fn note(&mut self, s: i64, text: &str) -> &mut Self {
        self.at(s, Event::Note { text: text.into() })
    }
    /// The node taken out of the cluster, as `Lab::remove_node` records it.
    fn removed(&mut self, s: i64, node: &str) -> &mut Self {
        self.power_off(s, node, "node-removed")
            .at(s, Event::NodeRemoved { node: node.into() })
    }
    /// The node joining (again): the lab records no condition for it.
    fn added(&mut self, s: i64, node: &str) -> &mut Self {
        self.at(s, Event::NodeAdded { node: node.into() })
    }
    fn gone(&mut self, s: i64, uid: &str, node: &str) -> &mut Self {
        self.at(
            s,
            Event::PodGone {
                pod: db0(uid),
                node: Some(node.into()),
            },
        )
    }
    fn running(&mut self, s: i64, uid: &str, node: &str) -> &mut Self {
        self.at(
            s,
            Event::PodPhase {
                pod: db0(uid),
                node: Some(node.into()),
                phase: "Running".into(),
                claims: vec!["data-db-0".into()],
                stateful: true,
            },
        )
    }
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + s).expect("time")
}

fn kinds(v: &[Violation]) -> Vec<ViolationKind> {
    v.iter().map(|v| v.kind).collect()
}

fn db0(uid: &str) -> PodId {
    PodId {
        namespace: "vm".into(),
        name: "db-0".into(),
        uid: uid.into(),
    }
}
