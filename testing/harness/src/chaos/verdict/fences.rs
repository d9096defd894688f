//! False fences: a node reset by its watchdog, rebooted by its own agent (sysrq) or powered off
//! through its BMC without a reason the protocol or the health check gives.
//!
//! A fence is excused in two ways, and only these:
//!
//! 1. **Its licence ran out** (watchdog and software-reboot fences). An agent feeds its watchdog
//!    only while it holds a licence, which lasts `L` from the send time of the request that
//!    earned it: a consistent API read, or a round of votes from a strict majority of its
//!    configuration (docs/self-remediation-protocol.md). A live agent renews once per round:
//!    every `apiCheckInterval`, or once its API read timed out and its peers answered, whichever
//!    is longer (`R` below). So when it is cut off at `c` its last renewal was sent after
//!    `c − R`, its licence ends after `c − R + L`, its feeder (which checks on every feed
//!    interval `F` and stops 50 ms early) feeds last after `c − R + L − 50 ms − F`, and the
//!    watchdog fires `W` later: **no lapse fence comes sooner than `L + W − R − F − 50 ms` into a
//!    cut-off** (its *shortest lapse*). The fence must also fall within the cut-off or within `R`
//!    of its end (the first round after it renews and feeds at once). A live stretch shorter than
//!    `R` between two cut-offs may renew nothing, so it is bridged. A freshly booted agent holds
//!    no licence: cut off from its boot, it is reset `W` after it. A frozen agent stops feeding
//!    at once: frozen since `z`, it is reset from `z + W − F` on (while frozen). What "cut off"
//!    and "frozen" are, fault by fault, is [`super::reach`]'s.
//! 2. **A remediation it was due**: the agent fences at once when it sees its own remediation
//!    (or a peer tells it), and fence agents power the node off through its BMC. That excuses the
//!    fence only when the remediation came from an outage a health check could have seen: the
//!    node disconnected for at least the trial's shortest detection (a Ready condition's
//!    node-monitor grace less a kubelet lease renewal plus the check's duration; with the peer
//!    detector, a failed probe and its suspicion), the remediation created after that and no
//!    later than [`Detection::lag`] after the node was back; or created while another such
//!    remediation of it was in flight (an escalation). It excuses fences until [`super::Params::fence_grace`] after it is removed (a
//!    BMC request taken while it existed may land later). A remediation of a node that was
//!    healthy excuses nothing: it is the false fence's cause, not its reason.
//!
//! Every bound is widened by [`TOLERANCE`].

use std::{collections::BTreeMap, time::Duration};

use jiff::{SignedDuration, Timestamp};
use nodemedic_lab::timeline::{Entry, Event};
use nodemedic_self_remediation::protocol::LicenceSettings;

use super::{
    Params, Violation, ViolationKind,
    reach::{self, NodeHistory, Span},
    signed,
};

/// Slack on every bound: the lab records a condition after it applied it, and its watchdog
/// looks for expiries every 50 ms; on a loaded machine an agent's round starts or its answer
/// comes a few hundred milliseconds late.
pub const TOLERANCE: Duration = Duration::from_secs(1);

/// The agent's feeder stops feeding this long before its licence ends (`agent/feeder.rs`).
const FEED_MARGIN: Duration = Duration::from_millis(50);

/// The agents' timings in force in a trial, from its SelfNodeRemediationConfig and watchdog.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentTimings {
    /// `L`.
    pub licence: Duration,
    /// `R`: the longest between two renewals of an agent that reaches the API or a majority.
    pub round: Duration,
    /// `W`.
    pub watchdog: Duration,
    /// `F`: how often the feeder feeds.
    pub feed_interval: Duration,
}

impl AgentTimings {
    pub fn new(settings: &LicenceSettings, watchdog: Duration) -> Self {
        let asked_peers = settings.api_server_timeout + settings.peer_dial_timeout + settings.peer_request_timeout;
        Self {
            licence: settings.licence(),
            round: settings.api_check_interval.max(asked_peers),
            watchdog,
            feed_interval: nodemedic_self_remediation::watchdog::feed_interval(watchdog),
        }
    }

    /// The shortest cut-off that can end in a watchdog reset: `L + W − R − F − 50 ms`.
    pub fn shortest_lapse(&self) -> Duration {
        (self.licence + self.watchdog).saturating_sub(self.round + self.feed_interval + FEED_MARGIN)
    }

    /// The shortest freeze that can end in a watchdog reset: `W − F`.
    pub fn shortest_stall(&self) -> Duration {
        self.watchdog.saturating_sub(self.feed_interval)
    }
}

/// When a remediation can come from a node's outage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Detection {
    /// The shortest disconnection after which a health check of the trial may remediate a node.
    pub after: Duration,
    /// How long after a node is connected again a remediation may still be created from what the
    /// API showed while it was not: its kubelet renews at once and the node controller looks
    /// every second, and the health check reads the node afresh before it creates one; a few
    /// seconds, on a loaded machine.
    pub lag: Duration,
    /// How often a kubelet renews its lease: a node connected again for less than that (and
    /// [`TOLERANCE`]) may renew nothing, and the outages on either side are one to the node
    /// controller (a partition that ends just as its watchdog resets the node, say).
    pub renewal: Duration,
}

/// Why a fence is not false.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Excuse {
    /// Cut off from the API server and a majority since then.
    CutOff(Timestamp),
    /// Booted then, and cut off since.
    Booted(Timestamp),
    Frozen(Timestamp),
    /// A remediation from an outage, created then.
    Remediation(Timestamp),
}

/// The stretch of `dark` spans (from `boot` on, live gaps shorter than `gap` bridged) that `at`
/// falls in, or within `gap` after.
fn stretch_at(dark: &[Span], boot: Option<Timestamp>, at: Timestamp, gap: SignedDuration) -> Option<Span> {
    let mut spans: Vec<Span> = dark
        .iter()
        .filter(|s| s.from <= at && boot.is_none_or(|b| s.to.is_none_or(|to| to >= b)))
        .map(|s| Span {
            from: boot.map_or(s.from, |b| s.from.max(b)),
            to: s.to,
        })
        .collect();
    spans.sort_by_key(|s| s.from);
    let mut current: Option<Span> = None;
    for s in spans {
        current = match current {
            Some(c) if c.to.is_none_or(|to| s.from.duration_since(to) < gap) => Some(Span {
                from: c.from,
                to: c.to.zip(s.to).map(|(a, b)| a.max(b)),
            }),
            _ => Some(s),
        };
    }
    current.filter(|c| c.to.is_none_or(|to| at <= to + gap))
}

/// Whether the node's own history lets its watchdog (or its agent's own timer) reset it at `at`:
/// rule 1 of the module.
pub fn lapse(history: &NodeHistory, at: Timestamp, timings: &AgentTimings) -> Option<Excuse> {
    let tolerance = signed(TOLERANCE);
    let boot = history.boots.iter().copied().filter(|b| *b <= at).max();
    let stalled = history.frozen.iter().find(|s| {
        boot.is_none_or(|b| s.from >= b)
            && s.from + signed(timings.shortest_stall()) <= at + tolerance
            && s.to.is_none_or(|to| at <= to + tolerance)
    });
    if let Some(s) = stalled {
        return Some(Excuse::Frozen(s.from));
    }
    let gap = signed(timings.round) + tolerance;
    let stretch = stretch_at(&history.dark, boot, at, gap)?;
    if stretch.from + signed(timings.shortest_lapse()) <= at + tolerance {
        return Some(Excuse::CutOff(stretch.from));
    }
    boot.filter(|b| stretch.from.duration_since(*b) < gap && *b + signed(timings.watchdog) <= at + tolerance)
        .map(Excuse::Booted)
}

/// A remediation object's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remediated {
    pub created: Timestamp,
    pub removed: Option<Timestamp>,
}

/// Every node's remediations, in the order they were created.
pub fn remediations(entries: &[Entry]) -> BTreeMap<&str, Vec<Remediated>> {
    let mut open: BTreeMap<(&str, &str), (&str, usize)> = BTreeMap::new();
    let mut out: BTreeMap<&str, Vec<Remediated>> = BTreeMap::new();
    for e in entries {
        if let Event::Remediation {
            kind,
            name,
            node,
            change,
            created_at,
        } = &e.event
        {
            match change.as_str() {
                "created" => {
                    let list = out.entry(node.as_str()).or_default();
                    // From its creation, not from when the lab's watch saw it: after an API
                    // outage the watch relists seconds late, and a fence the object caused can
                    // come first (chaos-20261208T003206Z, trial 1). The creation time is
                    // truncated to the second: at most a second early, within the tolerance.
                    list.push(Remediated {
                        created: created_at.map_or(e.at, |created| created.min(e.at)),
                        removed: None,
                    });
                    open.insert((kind.as_str(), name.as_str()), (node.as_str(), list.len() - 1));
                }
                "removed" => {
                    if let Some((node, i)) = open.remove(&(kind.as_str(), name.as_str()))
                        && let Some(r) = out.get_mut(node).and_then(|list| list.get_mut(i))
                    {
                        r.removed = Some(e.at);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Which of a node's remediations (in creation order) came from an outage a health check could
/// have seen in `disconnected`, or escalate one that did: rule 2 of the module.
pub fn justified(remediations: &[Remediated], disconnected: &[Span], detection: &Detection) -> Vec<bool> {
    let tolerance = signed(TOLERANCE);
    let lag = signed(detection.lag);
    let outages = bridged(disconnected, signed(detection.renewal) + tolerance);
    let mut out: Vec<bool> = Vec::with_capacity(remediations.len());
    for r in remediations {
        let from_outage = outages.iter().any(|s| {
            // When a health check could have called it unhealthy: the outage must last that long.
            let seen = s.from + signed(detection.after);
            seen <= r.created + tolerance && s.to.is_none_or(|to| seen <= to + tolerance && r.created <= to + lag)
        });
        let escalates = remediations
            .iter()
            .zip(&out)
            .any(|(earlier, ok)| *ok && earlier.removed.is_none_or(|gone| r.created <= gone + lag));
        out.push(from_outage || escalates);
    }
    out
}

/// `spans` with every gap shorter than `gap` closed.
fn bridged(spans: &[Span], gap: SignedDuration) -> Vec<Span> {
    let mut sorted = spans.to_vec();
    sorted.sort_by_key(|s| s.from);
    let mut out: Vec<Span> = Vec::with_capacity(sorted.len());
    for s in sorted {
        match out.last_mut() {
            Some(last) if last.to.is_none_or(|to| s.from.duration_since(to) < gap) => {
                last.to = last.to.zip(s.to).map(|(a, b)| a.max(b));
            }
            _ => out.push(s),
        }
    }
    out
}

/// The node's justified remediation that excuses a fence at `at`, if any.
fn remediation_excuse(
    remediations: &[Remediated],
    history: &NodeHistory,
    at: Timestamp,
    params: &Params,
) -> Option<Excuse> {
    let ok = justified(remediations, &history.disconnected, &params.detection);
    remediations
        .iter()
        .zip(ok)
        .find(|(r, ok)| {
            *ok && r.created <= at + signed(TOLERANCE)
                && r.removed.is_none_or(|gone| at <= gone + signed(params.fence_grace))
        })
        .map(|(r, _)| Excuse::Remediation(r.created))
}

/// Fencing causes: a watchdog reset (self remediation), a node rebooting itself through its
/// sysrq trigger (self remediation without a watchdog, or fencing at once; the lab records
/// `SoftwareReboot` and then this power-off) or a BMC power-off (fence agents). The plan's own
/// crashes and resets, and the power-off of a node removed from the cluster, have their own
/// causes.
fn is_fence(cause: &str) -> bool {
    matches!(cause, "watchdog" | "software-reboot" | "bmc")
}

/// What the node's history held before a fence at `at`, for the violation's detail.
fn explain(history: &NodeHistory, at: Timestamp, params: &Params) -> String {
    let last_dark = history.dark.iter().rev().find(|s| s.from <= at);
    let dark = match last_dark {
        None => "never cut off from the API server and a majority of its peers".to_owned(),
        Some(s) => format!(
            "last cut off from the API server and a majority of its peers (or frozen) for {:.1}s, from {:.1}s before",
            s.seconds(at),
            at.duration_since(s.from).as_secs_f64()
        ),
    };
    let needs = params.agents.map_or(String::new(), |t| {
        format!(
            " (a lapse needs {:.1}s cut off: L {:.1}s + W {:.1}s - a round {:.1}s - a feed interval {:.2}s; tolerance {:.0}s)",
            t.shortest_lapse().as_secs_f64(),
            t.licence.as_secs_f64(),
            t.watchdog.as_secs_f64(),
            t.round.as_secs_f64(),
            t.feed_interval.as_secs_f64(),
            TOLERANCE.as_secs_f64()
        )
    });
    format!("{dark}{needs}")
}

/// A fence and what excused it (None: nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    pub node: String,
    pub at: Timestamp,
    pub cause: String,
    pub excuse: Option<Excuse>,
    /// Why nothing excused it (empty when something did).
    pub detail: String,
}

impl Judged {
    /// One line of a trial's log for an excused fence, times from `since`.
    pub fn line(&self, since: Timestamp) -> String {
        let ago = |t: Timestamp| self.at.duration_since(t).as_secs_f64();
        let why = match self.excuse {
            Some(Excuse::CutOff(from)) => format!(
                "cut off from the API server and a majority of its peers (or frozen) since {:.1}s before",
                ago(from)
            ),
            Some(Excuse::Booted(at)) => format!("booted {:.1}s before, with no licence since", ago(at)),
            Some(Excuse::Frozen(from)) => format!("frozen since {:.1}s before", ago(from)),
            Some(Excuse::Remediation(created)) => {
                format!("its remediation from an outage, created {:.1}s before", ago(created))
            }
            None => format!("not excused: {}", self.detail),
        };
        format!(
            "{:>6.1}s fence: {} powered off ({}); {why}",
            self.at.duration_since(since).as_secs_f64(),
            self.node,
            self.cause
        )
    }
}

/// Every fencing power-off from `since` on, with what excused it.
pub fn judge_fences(entries: &[Entry], since: Timestamp, params: &Params) -> Vec<Judged> {
    let histories = reach::histories(entries, params.nodes);
    let remediations = remediations(entries);
    let none = NodeHistory::default();
    let mut out = Vec::new();
    for e in entries.iter().filter(|e| e.at >= since) {
        let Event::Power { node, on: false, cause } = &e.event else {
            continue;
        };
        if !is_fence(cause) {
            continue;
        }
        let history = histories.get(node.as_str()).unwrap_or(&none);
        let own = params
            .agents
            .filter(|_| cause != "bmc")
            .and_then(|timings| lapse(history, e.at, &timings));
        let mine = remediations.get(node.as_str()).map_or(&[][..], Vec::as_slice);
        let excuse = own.or_else(|| remediation_excuse(mine, history, e.at, params));
        let detail = if excuse.is_some() {
            String::new()
        } else {
            let remediated = match mine.iter().filter(|r| r.created <= e.at).count() {
                0 => "no remediation of it".to_owned(),
                n => format!("{n} remediation(s) of it, none from an outage a health check could see"),
            };
            format!("{}; {remediated}", explain(history, e.at, params))
        };
        out.push(Judged {
            node: node.clone(),
            at: e.at,
            cause: cause.clone(),
            excuse,
            detail,
        });
    }
    out
}

/// Every fencing power-off from `since` on that neither rule of the module excuses.
pub fn false_fences(entries: &[Entry], since: Timestamp, params: &Params) -> Vec<Violation> {
    judge_fences(entries, since, params)
        .into_iter()
        .filter(|j| j.excuse.is_none())
        .map(|j| {
            let detail = format!("{} powered off ({}): {}", j.node, j.cause, j.detail);
            Violation::new(ViolationKind::FalseFence, Some(&j.node), Some(j.at), detail)
        })
        .collect()
}
