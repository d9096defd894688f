//! One fence-agent run per remediation at a time, in the background: up to `retrycount` attempts
//! `retryinterval` apart. Each attempt is written to the CR's status as it ends, which also wakes
//! its reconciler; the outcome stays here, keyed by the CR's uid, for the decision to read.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::Api;
use nodemedic_api::fence_agents::{FenceAgentsRemediation, FenceAttempt};
use nodemedic_kube::CallContext;
use tokio::task::AbortHandle;

use super::metrics::{ActionLabels, AttemptLabels, Metrics};
use crate::{
    agent::{Agents, Attempt},
    decide::fencing::{Run, RunOutcome, Step},
};

struct Entry {
    step: Step,
    outcome: Option<RunOutcome>,
    task: AbortHandle,
}

#[derive(Clone, Default)]
pub(super) struct Runs(Arc<Mutex<HashMap<String, Entry>>>);

/// Everything one run needs.
pub(super) struct Job {
    pub api: Api<FenceAgentsRemediation>,
    pub name: String,
    pub agent: String,
    pub step: Step,
    pub action: &'static str,
    /// The exit code that means the step worked.
    pub expect: i32,
    pub stdin: String,
    pub secrets: BTreeSet<String>,
    pub attempts: u32,
    pub interval: Duration,
    pub timeout: Duration,
    /// Attempts already recorded in the status (a run continues the count).
    pub recorded: i32,
    pub events: nodemedic_kube::events::Events,
    pub on: k8s_openapi::api::core::v1::ObjectReference,
}

impl Runs {
    pub(super) fn state(&self, uid: &str) -> Run {
        let Ok(all) = self.0.lock() else { return Run::Idle };
        match all.get(uid) {
            None => Run::Idle,
            Some(Entry {
                step, outcome: None, ..
            }) => Run::Running(*step),
            Some(Entry {
                step,
                outcome: Some(outcome),
                ..
            }) => Run::Finished(*step, outcome.clone()),
        }
    }

    /// Stops the run (if any) and forgets it.
    pub(super) fn cancel(&self, uid: &str) {
        if let Ok(mut all) = self.0.lock()
            && let Some(entry) = all.remove(uid)
        {
            entry.task.abort();
        }
    }

    pub(super) fn start(&self, uid: &str, job: Job, agents: Agents, metrics: Metrics) {
        self.cancel(uid);
        let Ok(mut all) = self.0.lock() else { return };
        let step = job.step;
        let runs = self.clone();
        let key = uid.to_owned();
        let task = tokio::spawn(async move { run(&job, &agents, &metrics, &runs, &key).await });
        all.insert(
            uid.to_owned(),
            Entry {
                step,
                outcome: None,
                task: task.abort_handle(),
            },
        );
    }

    fn finish(&self, uid: &str, step: Step, outcome: RunOutcome) {
        if let Ok(mut all) = self.0.lock()
            && let Some(entry) = all.get_mut(uid)
            && entry.step == step
        {
            entry.outcome = Some(outcome);
        }
    }
}

/// Runs the attempts. The outcome is stored before the last attempt is written to the status,
/// so the reconcile that write wakes reads it.
async fn run(job: &Job, agents: &Agents, metrics: &Metrics, runs: &Runs, uid: &str) {
    let attempts = job.attempts.max(1);
    for n in 1..=attempts {
        let attempt = agents.attempt(&job.agent, &job.stdin, &job.secrets, job.timeout).await;
        let ok = attempt.exit_code == Some(job.expect);
        observe(metrics, job, &attempt, ok);
        tracing::info!(
            remediation = %job.name, agent = %job.agent, action = job.action, attempt = n, of = job.attempts,
            exit_code = ?attempt.exit_code, timed_out = attempt.timed_out, message = %attempt.message,
            "fence agent attempt"
        );
        if !ok {
            job.events
                .warning(
                    &job.on,
                    "FenceAgentAttemptFailed",
                    format!("attempt {n} of {attempts}: {}", explain(job, &attempt)),
                )
                .await;
        }
        if ok {
            runs.finish(uid, job.step, RunOutcome::Succeeded);
        } else if n == attempts {
            let message = format!("{} (after {attempts} attempts)", explain(job, &attempt));
            runs.finish(
                uid,
                job.step,
                RunOutcome::Failed {
                    timed_out: attempt.timed_out,
                    message,
                },
            );
        }
        if let Err(e) = record(job, &attempt, job.recorded + n as i32).await {
            tracing::warn!(remediation = %job.name, error = %e, "could not record a fence agent attempt");
        }
        if ok {
            return;
        }
        if n < attempts {
            tokio::time::sleep(job.interval).await;
        }
    }
}

fn explain(job: &Job, a: &Attempt) -> String {
    match (job.step, a.exit_code) {
        (Step::ConfirmingOff, Some(0)) => format!(
            "{} --action=status still reports the node powered on after it was powered off",
            job.agent
        ),
        (_, Some(code)) => format!("{} --action={} exited {code}: {}", job.agent, job.action, a.message),
        (_, None) => format!("{} --action={}: {}", job.agent, job.action, a.message),
    }
}

fn observe(metrics: &Metrics, job: &Job, a: &Attempt, ok: bool) {
    let result = match (ok, a.timed_out) {
        (true, _) => "success",
        (false, true) => "timeout",
        (false, false) => "failure",
    };
    metrics
        .attempts
        .get_or_create(&AttemptLabels {
            agent: job.agent.clone(),
            action: job.action.into(),
            result: result.into(),
        })
        .inc();
    metrics
        .attempt_seconds
        .get_or_create(&ActionLabels {
            agent: job.agent.clone(),
            action: job.action.into(),
        })
        .observe(a.duration.as_secs_f64());
}

/// Writes the attempt count and the last attempt (exit code and the agent's scrubbed verdict),
/// over whatever else the status holds now: read afresh, and again on a conflict with the
/// reconciler's writes.
async fn record(job: &Job, a: &Attempt, count: i32) -> nodemedic_kube::Result<()> {
    let last = FenceAttempt {
        action: job.action.into(),
        exit_code: a.exit_code,
        message: a.message.clone(),
        finished: Some(nodemedic_kube::time::now()),
    };
    let current = job
        .api
        .get_opt(&job.name)
        .await
        .with_context(|| format!("reading FenceAgentsRemediation {} to record an attempt", job.name))?;
    let Some(current) = current else { return Ok(()) };
    nodemedic_kube::status::update(&job.api, &current, |status, _| {
        let changed = status.attempts != Some(count) || status.last_attempt.as_ref() != Some(&last);
        status.attempts = Some(count);
        status.last_attempt = Some(last.clone());
        changed
    })
    .await?;
    Ok(())
}
