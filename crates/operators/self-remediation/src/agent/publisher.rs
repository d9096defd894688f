//! Writes the agent's registration in the background, so the licence loop never waits on a write
//! (a write stuck on a slow API server would hold back the next licence read), and retries until
//! the newest wanted registration has landed (a lost acceptance or acknowledgement would hold a
//! remediation or a membership change back for ever).

use std::{sync::Arc, time::Duration};

use kube::Client;
use tokio::{sync::watch, task::JoinHandle};

use super::register;
use crate::registration::Published;

/// Between failed writes.
const RETRY: Duration = Duration::from_secs(1);

pub(super) struct Publisher {
    wanted: watch::Sender<Option<Published>>,
    landed: Arc<watch::Sender<Option<Published>>>,
    task: JoinHandle<()>,
}

impl Publisher {
    /// Writes with `client` (a fail-fast one: a write never blocks for long).
    pub(super) fn spawn(client: Client, namespace: String) -> Self {
        let (wanted, mut wants) = watch::channel(None::<Published>);
        let landed = Arc::new(watch::Sender::new(None));
        let written = landed.clone();
        let task = tokio::spawn(async move {
            loop {
                let want = wants.borrow_and_update().clone();
                if let Some(want) = want
                    && written.borrow().as_ref() != Some(&want)
                {
                    match register::register(&client, &namespace, &want).await {
                        Ok(()) => {
                            written.send_replace(Some(want));
                        }
                        Err(error) => {
                            tracing::debug!(%error, "cannot write the registration; trying again");
                            tokio::time::sleep(RETRY).await;
                        }
                    }
                    continue;
                }
                if wants.changed().await.is_err() {
                    return;
                }
            }
        });
        Self { wanted, landed, task }
    }

    /// Asks for `published` to be written (replacing anything not written yet).
    pub(super) fn want(&self, published: &Published) {
        self.wanted.send_replace(Some(published.clone()));
    }

    /// Waits up to `timeout` for `published` to be what the registration says (as far as this
    /// process wrote it); returns whether it is.
    pub(super) async fn landed(&self, published: &Published, timeout: Duration) -> bool {
        let mut landed = self.landed.subscribe();
        tokio::time::timeout(timeout, landed.wait_for(|l| l.as_ref() == Some(published)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Writes it again even if it landed before (the registration went away).
    pub(super) fn rewrite(&self, published: &Published) {
        self.landed.send_replace(None);
        self.want(published);
    }

    /// Stops once what was wanted has landed, or after `grace`: nothing this process wrote lands
    /// after a later write (each write is conditional on the registration it read, so a late
    /// one fails).
    pub(super) async fn stop(self, grace: Duration) {
        drop(self.wanted);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(grace, self.task).await.is_err() {
            abort.abort();
        }
    }
}
