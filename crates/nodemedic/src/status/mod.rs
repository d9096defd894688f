//! `nodemedic status` (also `kubectl nodemedic`): one table of nodes with their health, the
//! checks that select them, remediations in flight and maintenance; `--watch` keeps it live.

mod balance;
mod view;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use nodemedic_api::{
    fence_agents::FenceAgentsRemediation, healthcheck::NodeHealthCheck, maintenance::NodeMaintenance,
    self_remediation::SelfNodeRemediation,
};
use serde::de::DeserializeOwned;

pub(crate) use view::{Snapshot, rows, table};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
    Yaml,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Keep the view updated as nodes, checks, remediations and maintenance change.
    #[arg(short, long)]
    pub watch: bool,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

pub(crate) fn run(args: StatusArgs) -> anyhow::Result<()> {
    nodemedic_kube::logging::init_with_default(false, "warn,kube_client=off");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(status(args))
}

/// All objects of a kind; an API the cluster does not serve (CRD not installed) is empty.
pub(crate) async fn all<K>(client: &Client) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match Api::<K>::all(client.clone()).list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("listing {}", K::plural(&()))),
    }
}

/// Events, for the descheduler's evictions: none when the user may not list them (the view is
/// still worth having).
async fn events(client: &Client) -> anyhow::Result<Vec<k8s_openapi::api::events::v1::Event>> {
    match all::<k8s_openapi::api::events::v1::Event>(client).await {
        Err(e)
            if e.downcast_ref::<kube::Error>()
                .is_some_and(|k| matches!(k, kube::Error::Api(s) if s.code == 403)) =>
        {
            Ok(Vec::new())
        }
        other => other,
    }
}

/// The self-remediation agents' registrations, wherever nodemedic runs.
pub(crate) async fn registrations(client: &Client) -> anyhow::Result<Vec<Lease>> {
    let selector = ListParams::default().labels(&nodemedic_self_remediation::registration::registrations_selector());
    Ok(Api::<Lease>::all(client.clone())
        .list(&selector)
        .await
        .context("listing the agents' registrations")?
        .items)
}

async fn snapshot(client: &Client) -> anyhow::Result<Snapshot> {
    let (nodes, checks, self_remediations, fence_remediations, maintenances, registrations, events) = tokio::try_join!(
        all::<Node>(client),
        all::<NodeHealthCheck>(client),
        all::<SelfNodeRemediation>(client),
        all::<FenceAgentsRemediation>(client),
        all::<NodeMaintenance>(client),
        registrations(client),
        events(client),
    )?;
    Ok(Snapshot {
        nodes,
        checks,
        self_remediations,
        fence_remediations,
        maintenances,
        registrations,
        events,
    })
}

fn render(snapshot: &Snapshot, format: Format) -> anyhow::Result<String> {
    let rows = &rows(snapshot, jiff::Timestamp::now());
    // JSON and YAML stay one list of rows for scripts; the warnings go to stderr there.
    let warnings = view::warnings(snapshot);
    if format != Format::Table {
        warnings.iter().for_each(|w| eprintln!("{w}"));
    }
    Ok(match format {
        Format::Table => {
            table(rows)
                + &balance::section(&balance::recent_evictions(&snapshot.events, jiff::Timestamp::now()))
                + &warnings.iter().map(|w| format!("\n{w}")).collect::<String>()
        }
        Format::Json => format!("{}\n", serde_json::to_string_pretty(rows)?),
        Format::Yaml => serde_saphyr::to_string(&rows.to_vec())?,
    })
}

/// Any change to the kinds the view shows (a tick per change, after the initial lists).
fn changes<K>(client: &Client) -> BoxStream<'static, ()>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .backoff(nodemedic_kube::backoff::prompt())
        .touched_objects()
        .map(|_| ())
        .boxed()
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let config = nodemedic_kube::client::infer_config().await?;
    let client = nodemedic_kube::client::client(config)?;
    let show = |snapshot: &Snapshot| -> anyhow::Result<String> { render(snapshot, args.output) };
    if !args.watch {
        print!("{}", show(&snapshot(&client).await?)?);
        return Ok(());
    }
    let mut ticks = futures::stream::select_all([
        changes::<Node>(&client),
        changes::<NodeHealthCheck>(&client),
        changes::<SelfNodeRemediation>(&client),
        changes::<FenceAgentsRemediation>(&client),
        changes::<NodeMaintenance>(&client),
    ]);
    // Ages move even when nothing else does.
    let mut clock = tokio::time::interval(Duration::from_secs(5));
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        // A failed list (the API server restarting) is reported and retried, not fatal.
        match snapshot(&client).await.and_then(|s| show(&s)) {
            Ok(text) => match args.output {
                // Redraw in place, as `watch` would.
                Format::Table => print!("\x1b[2J\x1b[H{text}"),
                // One document per update, for tools that read a stream.
                Format::Json | Format::Yaml => println!("{text}---"),
            },
            Err(error) => eprintln!("{error:#}; retrying"),
        }
        tokio::select! {
            _ = ticks.next() => {
                // A burst of changes (a drain, a remediation's steps) redraws once.
                tokio::time::sleep(Duration::from_millis(300)).await;
                while let Some(Some(())) = futures::FutureExt::now_or_never(ticks.next()) {}
            }
            _ = clock.tick() => {}
            _ = &mut interrupted => return Ok(()),
        }
    }
}
