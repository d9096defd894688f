//! The lab's side of its BMCs: a Unix socket on which a BMC reports each power change of its
//! node before it answers its own client, one line per connection:
//!
//! - `off <node>\n`: the lab powers the node off (kills its processes) and only then answers
//!   `ok\n`, so a BMC never reports Off while the node still runs;
//! - `on <node>\n`: the lab answers `ok\n` at once and boots the node in the background (a
//!   real BMC reports On when power is applied, long before the OS is up), unless it is already
//!   powered or booting.
//!
//! Anything else gets `error <why>\n`, which the BMC turns into a failed request.

use std::{path::Path, sync::Arc};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    task::JoinHandle,
};

use crate::{Error, Result, error::io, lab::Inner};

pub(crate) fn serve(inner: Arc<Inner>, path: &Path) -> Result<JoinHandle<()>> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(io(format!("binding the BMC socket {}", path.display())))?;
    Ok(tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(inner.clone(), stream));
        }
    }))
}

async fn answer(inner: Arc<Inner>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return;
    }
    let reply = match act(&inner, line.trim()).await {
        Ok(()) => "ok\n".to_owned(),
        Err(error) => {
            tracing::warn!(%error, request = line.trim(), "a BMC's power report failed");
            format!("error {}\n", error.to_string().replace('\n', " "))
        }
    };
    let _ = write.write_all(reply.as_bytes()).await;
}

async fn act(inner: &Arc<Inner>, request: &str) -> Result<()> {
    let (verb, node) = request
        .split_once(' ')
        .ok_or_else(|| Error::Invalid(format!("not a BMC report: {request:?}")))?;
    inner.index(node)?;
    let (inner, node) = (inner.clone(), node.to_owned());
    match verb {
        "off" => {
            tracing::info!(%node, "BMC powers the node off");
            // Killing the node's processes blocks (it reaps them), so off the runtime's threads.
            tokio::task::spawn_blocking(move || inner.power_off(&node, "bmc"))
                .await
                .map_err(|e| Error::Invalid(format!("BMC power-off task failed: {e}")))?
        }
        "on" => {
            let powered = inner
                .conditions
                .lock()
                .map_err(|_| Error::Invalid("node table poisoned".into()))?
                .get(&node)
                .is_some_and(|c| c.powered);
            if !powered {
                tracing::info!(%node, "BMC powers the node on");
                tokio::spawn(async move {
                    if let Err(error) = inner.power_on(&node, "bmc").await {
                        tracing::warn!(%error, %node, "BMC power-on failed");
                    }
                });
            }
            Ok(())
        }
        other => Err(Error::Invalid(format!("unknown BMC report {other:?}"))),
    }
}
