//! Installing CRDs so the lab's single API server serves them at once. kube-apiserver delays every
//! create of a custom resource by 2 s while its CRD's `Established` condition is less than 2 s
//! old (so that, in a highly available control plane, a follow-up request to another API server
//! that has not seen the CRD yet does not fail). The lab has one API server: once a CRD is
//! established, the lab backdates that condition, so a test's first create is not held up.

use std::time::Duration;

use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::{Result, wait};

/// How far back the lab sets `Established`: beyond the 2 s hold, whose check truncates to seconds.
const BACKDATE: Duration = Duration::from_secs(10);

/// Server-side applies the CRDs and waits until each is established (and backdated).
pub(crate) async fn install(client: &Client, crds: Vec<CustomResourceDefinition>) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply("nodemedic-lab").force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    for name in names {
        wait::until(&format!("CRD {name} Established"), Duration::from_secs(30), || {
            let (api, name) = (api.clone(), name.clone());
            async move { Ok(established(&api.get(&name).await?).then_some(())) }
        })
        .await?;
    }
    backdate_established(client).await
}

/// Waits until every CRD the API server has is established, then backdates the condition.
/// `kubectl wait --for=condition=Established crd --all` is no such wait: it fails at once on a
/// CRD created a moment ago whose status has no conditions yet ("<nil> is of the type <nil>",
/// ci-20261207T055047Z), where this waits on.
pub(crate) async fn all_established(client: &Client) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    wait::until("every CRD Established", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            Ok(api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .all(established)
                .then_some(()))
        }
    })
    .await?;
    backdate_established(client).await
}

impl crate::Lab {
    /// Returns once every CRD of the cluster is established and serves creates at once (see
    /// [`all_established`]): after CRDs applied with `kubectl`.
    pub async fn crds_established(&self) -> Result<()> {
        all_established(&self.client()).await
    }
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

/// Backdates the `Established` condition of every established CRD that turned so recently that
/// kube-apiserver would still hold creates. A conflict with the API server's own status writers
/// (which keep a transition time they did not change) is retried.
pub(crate) async fn backdate_established(client: &Client) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let recent = jiff::Timestamp::now() - jiff::SignedDuration::try_from(BACKDATE).unwrap_or_default();
    let past = Time(recent - jiff::SignedDuration::from_secs(1));
    wait::until(
        "CRDs' Established conditions backdated",
        Duration::from_secs(30),
        || {
            let (api, past) = (api.clone(), past.clone());
            async move {
                let mut left = 0;
                for crd in api.list(&ListParams::default()).await?.items {
                    let Some(mut conditions) = crd.status.as_ref().and_then(|s| s.conditions.clone()) else {
                        continue;
                    };
                    let Some(condition) = conditions
                        .iter_mut()
                        .find(|c| c.type_ == "Established" && c.status == "True")
                    else {
                        continue;
                    };
                    if condition.last_transition_time.as_ref().is_some_and(|t| t.0 < recent) {
                        continue;
                    }
                    condition.last_transition_time = Some(past.clone());
                    let patch = json!({"metadata": {"resourceVersion": crd.metadata.resource_version},
                                   "status": {"conditions": conditions}});
                    let name = crd.metadata.name.clone().unwrap_or_default();
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 409 => left += 1,
                        Err(error) => return Err(error.into()),
                    }
                }
                Ok((left == 0).then_some(()))
            }
        },
    )
    .await
}
