//! Leader election on a coordination Lease, so two controller replicas can run and one acts.
//!
//! Written here rather than taken from kube-lease-manager, for two things a long API outage
//! showed (issue 60). Its loop backed off up to 30 s after errors, so after an outage leadership
//! settled that late. Here every retry waits at most two seconds ([`crate::backoff`]). A leader
//! that cannot reach the API server keeps leading (nothing it does reaches the API either) and
//! resigns when it reads that another replica holds the lease, within two seconds of reaching
//! the API again (docs/outages.md: why not by time, and the window that leaves).
//!
//! A standby times the lease by its own clock from the moment it had the lease's last change
//! back (as client-go does), never by the renewTime another machine's clock wrote, so clock skew
//! between replicas does not matter. The task also remembers the last time it could not reach
//! the API ([`LastOutage`]): a replica that starts leading after an outage its watches never saw
//! hands it to the health check, which must not take the Unknowns the outage caused for dead
//! nodes.

mod decide;

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{Api, Client, api::PostParams};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

use self::decide::{Next, Seen, Timing, View, next, observe};
use crate::{Error, Result, backoff};

/// The environment variable through which a replica that starts afresh after resigning hands
/// its new run the outage it was in ([`LastOutage::lost_after`]), as an RFC 3339 time.
pub const LOST_AFTER_ENV: &str = "NODEMEDIC_API_LOST_AFTER";

/// The last time the election could not reach the API server, by the wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastOutage {
    /// The last answer before it (or when the first request failed, if none had answered).
    pub lost_after: Timestamp,
    /// The first answer after it; `None` while it lasts.
    pub regained: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct Contact {
    last_answer: Option<Timestamp>,
    outage: Option<LastOutage>,
}

impl Contact {
    /// A run started afresh in an outage its previous run was in.
    fn inherited(lost_after: Option<Timestamp>) -> Self {
        Self {
            last_answer: lost_after,
            outage: lost_after.map(|lost_after| LastOutage {
                lost_after,
                regained: None,
            }),
        }
    }

    fn answered(&mut self, now: Timestamp) {
        self.last_answer = Some(now);
        if let Some(outage) = self.outage.as_mut().filter(|o| o.regained.is_none()) {
            outage.regained = Some(now);
        }
    }

    fn failed(&mut self, now: Timestamp) {
        if self.outage.is_none_or(|o| o.regained.is_some()) {
            self.outage = Some(LastOutage {
                lost_after: self.last_answer.unwrap_or(now),
                regained: None,
            });
        }
    }
}

pub struct Leadership {
    /// True while this process leads. It turns false when another replica holds the lease; the
    /// task has then ended.
    pub is_leader: watch::Receiver<bool>,
    /// Ends when this replica resigns, or releases the lease once every receiver is dropped.
    pub task: JoinHandle<()>,
    contact: Arc<Mutex<Contact>>,
}

impl Leadership {
    /// The last outage the election went through, if any.
    pub fn last_outage(&self) -> Option<LastOutage> {
        self.contact.lock().unwrap_or_else(PoisonError::into_inner).outage
    }

    /// Stops competing: frees the lease when this replica holds it, so a standby takes over at
    /// once rather than a lease duration later; waits `at_most` for that.
    pub async fn step_down(self, at_most: Duration) {
        drop(self.is_leader);
        let _ = tokio::time::timeout(at_most, self.task).await;
    }
}

/// Starts competing for `lease` in `namespace` as `identity`. A caller stops acting the moment
/// `is_leader` turns false again: a deposed leader that kept acting would be a second writer.
/// `lost_after`: an outage this run starts in (see [`LOST_AFTER_ENV`]).
pub fn elect(
    client: Client,
    namespace: &str,
    lease: &str,
    identity: &str,
    duration: Duration,
    lost_after: Option<Timestamp>,
) -> Leadership {
    let (tell, is_leader) = watch::channel(false);
    let contact = Arc::new(Mutex::new(Contact::inherited(lost_after)));
    let contender = Contender {
        api: Api::namespaced(client, namespace),
        lease: lease.to_owned(),
        me: identity.to_owned(),
        timing: Timing::new(duration),
        contact: contact.clone(),
    };
    let task = tokio::spawn(contender.run(tell));
    Leadership {
        is_leader,
        task,
        contact,
    }
}

struct Contender {
    api: Api<Lease>,
    lease: String,
    me: String,
    timing: Timing,
    contact: Arc<Mutex<Contact>>,
}

/// The loop's state: the lease as last read or written, and when this replica renewed it.
#[derive(Default)]
struct State {
    lease: Option<Lease>,
    seen: Option<Seen>,
    renewed: Option<Instant>,
    looked: bool,
}

impl Contender {
    async fn run(self, tell: watch::Sender<bool>) {
        let mut state = State::default();
        let mut retry = backoff::prompt();
        let mut failing = false;
        loop {
            let step = next(View {
                me: &self.me,
                seen: state.seen.as_ref(),
                renewed: state.renewed,
                looked: state.looked,
                now: Instant::now(),
                timing: self.timing,
            });
            let done = match step {
                Next::Resign => {
                    tracing::warn!(
                        lease = %self.lease,
                        holder = ?state.seen.as_ref().and_then(|s| s.holder.clone()),
                        "no longer leading: another replica holds the lease"
                    );
                    tell.send_replace(false);
                    return;
                }
                Next::Wait(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = tell.closed() => return self.release(&state).await,
                    }
                }
                Next::Look | Next::Acquire | Next::Renew => self.request(&mut state, step).await,
            };
            match done {
                Ok(()) => {
                    self.contact().answered(Timestamp::now());
                    if std::mem::take(&mut failing) {
                        tracing::info!(lease = %self.lease, "leader election: the API server answers again");
                    }
                    retry = backoff::prompt();
                    if state.renewed.is_some() && !*tell.borrow() {
                        tracing::info!(lease = %self.lease, "leading");
                        tell.send_replace(true);
                    }
                }
                Err(error) => {
                    self.contact().failed(Timestamp::now());
                    // Said once per run of failures: an outage would otherwise fill the log.
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(%error, lease = %self.lease, ?step, "leader election: request failed; trying again every 2 s at most");
                    }
                    let wait = retry.next().unwrap_or(backoff::CAP);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = tell.closed() => return self.release(&state).await,
                    }
                }
            }
        }
    }

    fn contact(&self) -> std::sync::MutexGuard<'_, Contact> {
        self.contact.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A read or a write, given up when it hangs for a lease duration.
    async fn request(&self, state: &mut State, step: Next) -> Result<()> {
        let limit = self.timing.duration;
        let request = async {
            match step {
                Next::Look => self.look(state).await,
                _ => self.write(state, step == Next::Acquire).await,
            }
        };
        tokio::time::timeout(limit, request).await.unwrap_or_else(|_| {
            Err(Error::Timeout {
                what: format!("{step:?} of lease {}", self.lease),
                after: limit,
            })
        })
    }

    async fn look(&self, state: &mut State) -> Result<()> {
        let sent = Instant::now();
        let lease = self
            .api
            .get_opt(&self.lease)
            .await
            .map_err(|e| Error::call(format!("read lease {}", self.lease), e))?;
        let answered = Instant::now();
        state.looked = true;
        state.seen = lease.as_ref().map(|l| observe(state.seen.as_ref(), l, sent, answered));
        state.lease = lease;
        Ok(())
    }

    /// Writes this replica in as the holder, locked to the version read: a conflict means
    /// another wrote first (or deleted the lease), and is answered by reading again.
    async fn write(&self, state: &mut State, acquire: bool) -> Result<()> {
        let sent = Instant::now();
        let stamp = MicroTime(Timestamp::now());
        let mut lease = state.lease.clone().unwrap_or_else(|| Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(self.lease.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if acquire {
            if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(self.me.clone());
            spec.acquire_time = Some(stamp.clone());
        }
        spec.lease_duration_seconds = i32::try_from(self.timing.duration.as_secs()).ok();
        spec.renew_time = Some(stamp);
        let written = if state.lease.is_some() {
            self.api.replace(&self.lease, &PostParams::default(), &lease).await
        } else {
            self.api.create(&PostParams::default(), &lease).await
        };
        match written {
            Ok(lease) => {
                state.seen = Some(observe(state.seen.as_ref(), &lease, sent, Instant::now()));
                state.lease = Some(lease);
                state.renewed = Some(sent);
                Ok(())
            }
            // What another wrote decides: a leader that then finds another holder resigns.
            Err(kube::Error::Api(status))
                if status.is_conflict() || status.is_already_exists() || status.is_not_found() =>
            {
                self.look(state).await
            }
            Err(e) => Err(Error::call(format!("write lease {}", self.lease), e)),
        }
    }

    /// Frees the lease at a stop, so a standby takes over at once instead of a lease later.
    async fn release(&self, state: &State) {
        let (Some(mut lease), Some(_)) = (state.lease.clone(), state.renewed) else {
            return;
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        match self.api.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.lease, "released the lease"),
            Err(error) => {
                tracing::info!(%error, lease = %self.lease, "could not release the lease; it expires by itself")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("a time")
    }

    #[test]
    fn an_outage_lasts_from_the_last_answer_to_the_next() {
        let mut contact = Contact::default();
        contact.answered(at(0));
        assert_eq!(contact.outage, None);
        contact.failed(at(5));
        contact.failed(at(60));
        assert_eq!(
            contact.outage,
            Some(LastOutage {
                lost_after: at(0),
                regained: None
            })
        );
        contact.answered(at(600));
        contact.answered(at(601));
        assert_eq!(contact.outage.and_then(|o| o.regained), Some(at(600)));
        contact.failed(at(700));
        assert_eq!(contact.outage.map(|o| o.lost_after), Some(at(601)), "a new outage");
    }

    #[test]
    fn a_run_started_afresh_in_an_outage_continues_it() {
        let mut contact = Contact::inherited(Some(at(10)));
        contact.failed(at(30));
        assert_eq!(contact.outage.map(|o| o.lost_after), Some(at(10)));
        contact.answered(at(300));
        assert_eq!(
            contact.outage,
            Some(LastOutage {
                lost_after: at(10),
                regained: Some(at(300))
            })
        );
        assert_eq!(Contact::inherited(None).outage, None);
    }
}
