//! nodemedic on real nodes, installed as users install it: a lab of real kubelets importing the
//! images `make image` builds, `helm install` of the shipped chart, the writer StatefulSet and
//! its data witness. Shared by the end-to-end tests, the demo and the recovery benchmark.

use std::{path::Path, process::Command, time::Duration};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::Api;
use nodemedic_lab::{
    Error, Lab, LabConfig, NodeSpec, Result,
    data_witness::{DataViolation, DataWitness, Record},
    tools_dir, wait, workloads,
};

use crate::{
    images::Images,
    scenario::{self, NS},
};

/// The seed's three nodes.
pub const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const INSTALLED: Duration = Duration::from_secs(180);

/// The seed's three nodes, real (control-plane and worker each), importing nodemedic's images
/// (those beside the product executable `exe`, see [`Images::of`]) at every boot, with the
/// lab's ReadWriteOnce volumes.
pub fn config(exe: &Path) -> Result<LabConfig> {
    let images = Images::of(exe)?;
    let mut config = LabConfig::new(NODES.iter().map(|n| NodeSpec::control_plane_worker(n).real()).collect());
    config.persistent_volumes = 2;
    config.node_images = vec![images.controller, images.agent];
    Ok(config)
}

/// How a lab installs nodemedic, and why each value: the default health check's conditions last
/// 2 s instead of 300 s, and self remediation runs on the lab's timings (`patch`, e.g.
/// [`scenario::FAST_CONFIG`]: API checks every second, a 5 s safe time) instead of the seed's
/// minutes, so a scenario takes seconds; `without_default_check` turns the default check (self
/// remediation) off, where a scenario brings its own (fencing through fence agents, say). The
/// images, their tags and every other value are the chart's.
pub fn values(patch: &str, without_default_check: bool) -> Result<Vec<String>> {
    let patch: serde_json::Value =
        serde_json::from_str(patch).map_err(|e| Error::Invalid(format!("a SelfNodeRemediationConfig patch: {e}")))?;
    // Helm merges the patch into the chart's own spec: what the patch leaves out of the chart's
    // timing and detector defaults is removed (null), so the lab runs the patch alone.
    let mut spec = patch["spec"].clone();
    for chart_default in ["watchdogTimeout", "peerDetection"] {
        if spec.get(chart_default).is_none() {
            spec[chart_default] = serde_json::Value::Null;
        }
    }
    let mut values = vec![
        format!("defaultHealthCheck.unhealthyConditions={}", scenario::test_conditions()),
        format!("selfNodeRemediationConfig.spec={spec}"),
    ];
    if without_default_check {
        values.push("defaultHealthCheck.enabled=false".into());
    }
    Ok(values)
}

/// `helm install` of charts/nodemedic as shipped into nodemedic's namespace, with `values`
/// (`--set-json` pairs); returns once both controller replicas and an agent on every node are
/// ready.
pub async fn helm_install(lab: &Lab, values: &[String]) -> Result<()> {
    lab.wait_node_images(INSTALLED).await?;
    scenario::create_namespace(&lab.client(), NS).await?;
    helm(lab, &["install"], values)?;
    installed(lab).await
}

/// `helm upgrade --reuse-values` of the release [`helm_install`] installed, with `values` on top.
pub fn helm_upgrade(lab: &Lab, values: &[String]) -> Result<()> {
    helm(lab, &["upgrade", "--reuse-values"], values)
}

fn helm(lab: &Lab, verb: &[&str], values: &[String]) -> Result<()> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/nodemedic");
    let command = format!("helm {}", verb.join(" "));
    let mut helm = Command::new(tools_dir().join("helm"));
    helm.args(verb)
        .arg("nodemedic")
        .arg(&chart)
        .args(["--namespace", NS, "--kubeconfig"])
        .arg(lab.kubeconfig());
    for value in values {
        helm.args(["--set-json", value]);
    }
    let out = helm.output().map_err(|e| Error::Command {
        command: command.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command,
            detail: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

async fn installed(lab: &Lab) -> Result<()> {
    let deployments = Api::<Deployment>::namespaced(lab.client(), NS);
    wait::until("the controller's two replicas ready", INSTALLED, || async {
        let ready = deployments.get_opt("nodemedic-controller").await?;
        Ok(ready
            .and_then(|d| d.status?.ready_replicas)
            .filter(|r| *r == 2)
            .map(|_| ()))
    })
    .await?;
    let daemon_sets = Api::<DaemonSet>::namespaced(lab.client(), NS);
    let nodes = lab.nodes().len() as i32;
    wait::until("an agent ready on every node", INSTALLED, || async {
        let agents = daemon_sets.get_opt("nodemedic-agent").await?;
        Ok(agents
            .and_then(|d| d.status)
            .filter(|s| s.number_ready == nodes)
            .map(|_| ()))
    })
    .await
}

/// The writer StatefulSet running with more than a few records synced: its node and the witness
/// of its volume.
pub async fn start_writer(lab: &Lab) -> Result<(String, DataWitness)> {
    scenario::create_namespace(&lab.client(), "vm").await?;
    lab.apply_yaml(workloads::WRITER_STATEFULSET)?;
    let node = lab.writer_running(None, INSTALLED).await?;
    let mut witness = lab.data_witness("vm", "data-db-0").await?;
    records(&mut witness, 5, 1, INSTALLED).await?;
    Ok((node, witness))
}

/// Waits until the volume holds more than `than` records of `writers` instances; a violation of
/// the data witness at any look ends the wait with an error.
pub async fn records(witness: &mut DataWitness, than: usize, writers: usize, timeout: Duration) -> Result<Vec<Record>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let (records, violations) = witness.look();
        if !violations.is_empty() {
            return Err(violated(witness, &violations));
        }
        let instances: std::collections::BTreeSet<&str> = records.iter().map(|r| r.instance.as_str()).collect();
        if records.len() > than && instances.len() == writers {
            return Ok(records);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!(
                    "more than {than} records of {writers} writers in {}",
                    witness.path().display()
                ),
                seconds: timeout.as_secs(),
                last: Some(format!("{} records of {} writers", records.len(), instances.len())),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The data witness's verdict as an error.
pub fn violated(witness: &DataWitness, violations: &[DataViolation]) -> Error {
    let said: Vec<String> = violations.iter().map(ToString::to_string).collect();
    Error::Invalid(format!(
        "the data witness ({}): {}",
        witness.path().display(),
        said.join("; ")
    ))
}

/// The writer's last record of instance `before` and the first of the instance after it.
pub fn handover<'a>(records: &'a [Record], before: &str) -> Option<(&'a Record, &'a Record)> {
    let last = records.iter().rev().find(|r| r.instance == before)?;
    let first = records
        .iter()
        .find(|r| r.instance != before && r.sequence > last.sequence)?;
    Some((last, first))
}
