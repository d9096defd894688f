//! ReadWriteOnce storage as in a real cluster, and the at-most-one witness.

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    events::v1::Event as K8sEvent,
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
};
use nodemedic_lab::{Event, Lab, LabConfig, Timings, timeline::Entry, wait};

use crate::support::{has_taint, logs, unknown_within};

pub(crate) use nodemedic_lab::workloads::STATEFULSET;

pub(crate) async fn running_pod(client: &Client, name: &str, not_on: Option<&str>) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), "vm");
    wait::until(&format!("pod {name} Running"), Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get_opt(name).await?;
            Ok(pod.filter(|p| {
                let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none();
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                running && not_on.is_none_or(|n| node != Some(n))
            }))
        }
    })
    .await
    .expect("pod running")
}

/// The timeline's entry for `pod` turning Running. The timeline learns it from its own watch,
/// which may lag behind the read that just saw the pod Running.
async fn recorded_running(lab: &Lab, pod: &Pod) -> Entry {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    wait::until(
        "the timeline to record the pod Running",
        Duration::from_secs(15),
        || {
            let uid = uid.clone();
            async move {
                Ok(lab.timeline().entries().into_iter().find(
                    |e| matches!(&e.event, Event::PodPhase { pod, phase, .. } if pod.uid == uid && phase == "Running"),
                ))
            }
        },
    )
    .await
    .expect("recorded")
}

pub(crate) fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).expect("scheduled")
}

async fn attachment_on(client: &Client, node: &str) -> Option<VolumeAttachment> {
    let vas = Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?;
    vas.items
        .into_iter()
        .find(|va| va.spec.node_name == node && va.metadata.deletion_timestamp.is_none())
}

async fn force_delete(client: &Client, pod: &Pod) {
    let name = pod.metadata.name.as_deref().expect("name");
    Api::<Pod>::namespaced(client.clone(), "vm")
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("force delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_moves_only_once_its_old_attachment_is_gone_and_the_witness_catches_an_unsafe_move() {
    logs();
    // Both moves below delete an attachment by hand, which the attach-detach controller only
    // notices at its next sync: every 2 s here instead of Kubernetes' minute.
    let timings = Timings {
        attach_detach_sync: Duration::from_secs(2),
        ..Timings::fast()
    };
    let lab = Lab::start(LabConfig::seed().with_timings(timings))
        .await
        .expect("lab starts");
    let client = lab.client();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("vm".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    lab.apply_yaml(STATEFULSET).expect("statefulset");
    let first = running_pod(&client, "db-0", None).await;
    let a = node_of(&first);
    let va_a = attachment_on(&client, &a)
        .await
        .expect("the volume is attached to the pod's node");
    assert_eq!(va_a.status.as_ref().map(|s| s.attached), Some(true));

    // Safe sequence: power the node off, delete the pod; the replacement waits for the volume.
    lab.crash(&a).await.expect("crash");
    // As a remediator would: act once the cluster sees the node as gone (and the scheduler
    // avoids it).
    lab.wait_ready_status(&a, "Unknown", unknown_within(&lab))
        .await
        .expect("Unknown");
    wait::until("unreachable taint", Duration::from_secs(15), || async {
        Ok(has_taint(&lab, &a, "node.kubernetes.io/unreachable")
            .await
            .then_some(()))
    })
    .await
    .expect("tainted");
    force_delete(&client, &first).await;
    let events = Api::<K8sEvent>::namespaced(client.clone(), "vm");
    let refused = wait::until(
        "the attach-detach controller to refuse a second attachment",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await?;
                Ok(list
                    .items
                    .into_iter()
                    .find(|e| e.note.as_deref().is_some_and(|n| n.contains("Multi-Attach"))))
            }
        },
    )
    .await
    .expect("Multi-Attach refusal");
    let replacement = Api::<Pod>::namespaced(client.clone(), "vm")
        .get("db-0")
        .await
        .expect("replacement");
    assert_ne!(replacement.metadata.uid, first.metadata.uid);
    assert_eq!(
        replacement.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending"),
        "pending while the old attachment exists: {refused:?}"
    );

    let deleted_at = jiff::Timestamp::now();
    Api::<VolumeAttachment>::all(client.clone())
        .delete(va_a.metadata.name.as_deref().expect("name"), &DeleteParams::default())
        .await
        .expect("delete the old attachment");
    let second = running_pod(&client, "db-0", Some(&a)).await;
    let b = node_of(&second);
    let running = recorded_running(&lab, &second).await;
    assert!(
        running.at > deleted_at,
        "Running only after the old attachment was deleted"
    );
    let violations = nodemedic_lab::witness::check(&lab.timeline().entries());
    assert!(violations.is_empty(), "a move after power-off is safe: {violations:?}");

    // Unsafe sequence: the node is only cut off (still running the pod) when its pod and
    // attachment are deleted. The pod starts elsewhere: the witness must say so.
    lab.partition(&[&b]).await.expect("partition");
    lab.wait_ready_status(&b, "Unknown", unknown_within(&lab))
        .await
        .expect("Unknown");
    wait::until("unreachable taint", Duration::from_secs(15), || async {
        Ok(has_taint(&lab, &b, "node.kubernetes.io/unreachable")
            .await
            .then_some(()))
    })
    .await
    .expect("tainted");
    force_delete(&client, &second).await;
    let va_b = attachment_on(&client, &b).await.expect("attached to b");
    Api::<VolumeAttachment>::all(client.clone())
        .delete(va_b.metadata.name.as_deref().expect("name"), &DeleteParams::default())
        .await
        .expect("delete");
    let third = running_pod(&client, "db-0", Some(&b)).await;
    recorded_running(&lab, &third).await;
    let violations = nodemedic_lab::witness::check(&lab.timeline().entries());
    assert!(
        violations
            .iter()
            .any(|v| v.started.uid == third.metadata.uid.clone().unwrap_or_default() && v.still_running_on == b),
        "the witness reports the second writer: {violations:?}\n{}",
        lab.timeline().render()
    );
}
