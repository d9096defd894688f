//! The `/validate-nodemaintenance` webhook: reads what a new NodeMaintenance is judged on (the
//! other NodeMaintenances, the node) and asks [`crate::decide::admission`].

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, ResourceExt, api::ListParams, core::admission::Operation};
use nodemedic_api::maintenance::NodeMaintenance;
use nodemedic_kube::{
    CallContext,
    admission::{self, Request, Verdict},
};

use crate::decide::admission::{Maintenance, on_create, on_update};

pub const PATH: &str = "/validate-nodemaintenance";

fn facts(nm: &NodeMaintenance) -> Maintenance {
    Maintenance {
        name: nm.name_any(),
        node: nm.spec.node_name.clone(),
        deleting: nm.metadata.deletion_timestamp.is_some(),
    }
}

/// `client` should fail fast: an answer after the API server's webhook timeout is no answer.
pub async fn validate(client: Client, request: Request) -> Verdict {
    let unchecked = |why: String| Verdict::Unchecked(format!("nodemedic could not check this NodeMaintenance: {why}"));
    let new = match admission::object::<NodeMaintenance>(&request) {
        Ok(nm) => facts(&nm),
        Err(why) => return unchecked(why),
    };
    match request.operation {
        Operation::Create => match others_and_node(&client, &new.node).await {
            Ok((others, exists)) => on_create(&new, &others, exists),
            Err(e) => unchecked(e.to_string()),
        },
        Operation::Update => match admission::old_object::<NodeMaintenance>(&request) {
            Ok(Some(old)) => on_update(&facts(&old), &new),
            Ok(None) => Verdict::Allowed,
            Err(why) => unchecked(why),
        },
        _ => Verdict::Allowed,
    }
}

/// Both reads at once and within [`READS_WITHIN`]: the API server gives the webhook 5 s, and an
/// answer after that is never seen (failurePolicy Ignore admits without a word).
async fn others_and_node(client: &Client, node: &str) -> nodemedic_kube::Result<(Vec<Maintenance>, bool)> {
    let nodes = Api::<Node>::all(client.clone());
    let maintenances = Api::<NodeMaintenance>::all(client.clone());
    let every = ListParams::default();
    let reads = async { tokio::join!(maintenances.list(&every), nodes.get_metadata_opt(node)) };
    let Ok((others, exists)) = tokio::time::timeout(READS_WITHIN, reads).await else {
        return Err(nodemedic_kube::Error::Timeout {
            what: format!("reading the NodeMaintenances and node {node}"),
            after: READS_WITHIN,
        });
    };
    let others = others.context("listing NodeMaintenances")?;
    let exists = exists.with_context(|| format!("reading node {node}"))?.is_some();
    Ok((others.items.iter().map(facts).collect(), exists))
}

const READS_WITHIN: std::time::Duration = std::time::Duration::from_secs(4);
