//! The objects that run the descheduler for a KubeDescheduler, built from the rendered policy
//! and arguments (no I/O): the same Deployment a cluster runs is what the lab runs as a process.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy},
        core::v1::{
            Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction,
            PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
            ServiceAccount, Volume, VolumeMount,
        },
        rbac::v1::{ClusterRoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use kube::Resource;
use nodemedic_api::descheduler::KubeDescheduler;
use sha2::{Digest, Sha256};

use crate::decide::deployment::{POLICY_DIR, POLICY_KEY};

/// The Deployment, its ServiceAccount and its policy ConfigMap, in the KubeDescheduler's namespace.
pub(crate) const DESCHEDULER: &str = "descheduler";
pub(crate) const POLICY_CONFIGMAP: &str = "descheduler-policy";
/// The ClusterRole (shipped in the chart) with the descheduler's rights.
pub(crate) const CLUSTER_ROLE: &str = "nodemedic-descheduler";
/// Marks everything the operator makes (the lab finds the Deployment by it).
pub(crate) const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "nodemedic-descheduler");
/// The policy's hash on the pod template: a new policy rolls the descheduler.
pub(crate) const POLICY_HASH: &str = "descheduler.nodemedic.io/policy-hash";
/// The descheduler's default secure port (metrics, /healthz).
const SECURE_PORT: i32 = 10258;
/// Where the executable is in the upstream image.
pub(crate) const COMMAND: &str = "/bin/descheduler";

pub(crate) fn cluster_role_binding_name(namespace: &str) -> String {
    format!("{CLUSTER_ROLE}-{namespace}")
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), DESCHEDULER.to_owned()),
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
    ])
}

fn owned(kd: &KubeDescheduler, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: kd.meta().namespace.clone(),
        labels: Some(labels()),
        owner_references: kd.controller_owner_ref(&()).map(|o: OwnerReference| vec![o]),
        ..ObjectMeta::default()
    }
}

pub(crate) fn service_account(kd: &KubeDescheduler) -> ServiceAccount {
    ServiceAccount {
        metadata: owned(kd, DESCHEDULER),
        ..ServiceAccount::default()
    }
}

/// Cluster-scoped, so it cannot be owned by the namespaced KubeDescheduler: the operator's
/// finalizer deletes it.
pub(crate) fn cluster_role_binding(namespace: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(cluster_role_binding_name(namespace)),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: CLUSTER_ROLE.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: DESCHEDULER.into(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    }
}

pub(crate) fn policy_config_map(kd: &KubeDescheduler, policy_yaml: &str) -> ConfigMap {
    ConfigMap {
        metadata: owned(kd, POLICY_CONFIGMAP),
        data: Some(BTreeMap::from([(POLICY_KEY.to_owned(), policy_yaml.to_owned())])),
        ..ConfigMap::default()
    }
}

pub(crate) fn policy_hash(policy_yaml: &str, args: &[String]) -> String {
    let mut hash = Sha256::new();
    hash.update(policy_yaml.as_bytes());
    for arg in args {
        hash.update([0]);
        hash.update(arg.as_bytes());
    }
    hex::encode(&hash.finalize()[..8])
}

pub(crate) fn deployment(
    kd: &KubeDescheduler,
    image: &str,
    args: Vec<String>,
    hash: &str,
    replicas: i32,
) -> Deployment {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_owned(), DESCHEDULER.to_owned())]);
    let restricted = SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    };
    let container = Container {
        name: DESCHEDULER.into(),
        image: Some(image.to_owned()),
        command: Some(vec![COMMAND.into()]),
        args: Some(args),
        volume_mounts: Some(vec![VolumeMount {
            name: "policy".into(),
            mount_path: POLICY_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("50m".into())),
                ("memory".to_owned(), Quantity("128Mi".into())),
            ])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted),
        // As the upstream chart: its metrics and health on the secure port.
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: SECURE_PORT,
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(SECURE_PORT),
                scheme: Some("HTTPS".into()),
                ..HTTPGetAction::default()
            }),
            initial_delay_seconds: Some(3),
            period_seconds: Some(10),
            ..Probe::default()
        }),
        ..Container::default()
    };
    Deployment {
        metadata: owned(kd, DESCHEDULER),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            // One descheduler at a time: two would evict against the same limits twice.
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..DeploymentStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    annotations: Some(BTreeMap::from([(POLICY_HASH.to_owned(), hash.to_owned())])),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(DESCHEDULER.into()),
                    priority_class_name: Some("system-cluster-critical".into()),
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "policy".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: POLICY_CONFIGMAP.into(),
                            ..ConfigMapVolumeSource::default()
                        }),
                        ..Volume::default()
                    }]),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

#[cfg(test)]
mod tests {
    use nodemedic_api::descheduler::KubeDeschedulerSpec;

    use super::*;

    fn kd() -> KubeDescheduler {
        let mut kd = KubeDescheduler::new("cluster", KubeDeschedulerSpec::default());
        kd.metadata.namespace = Some("openshift-kube-descheduler-operator".into());
        kd.metadata.uid = Some("uid-1".into());
        kd
    }

    #[test]
    fn the_deployment_mounts_the_policy_where_the_arguments_read_it_and_is_owned() {
        let args = vec![format!("--policy-config-file={POLICY_DIR}/{POLICY_KEY}")];
        let deployment = deployment(&kd(), "registry.k8s.io/descheduler/descheduler:v0.36.0", args, "abc", 1);
        let owner = &deployment.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("KubeDescheduler", Some(true)));
        let pod = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        let container = &pod.containers[0];
        assert_eq!(container.command.as_deref(), Some(&[COMMAND.to_owned()][..]));
        let mount = &container.volume_mounts.as_ref().expect("mounts")[0];
        assert_eq!(mount.mount_path, POLICY_DIR);
        let volume = &pod.volumes.as_ref().expect("volumes")[0];
        assert_eq!(
            volume.config_map.as_ref().map(|c| c.name.as_str()),
            Some(POLICY_CONFIGMAP)
        );
        assert_eq!(pod.service_account_name.as_deref(), Some(DESCHEDULER));
    }

    #[test]
    fn a_new_policy_or_new_arguments_change_the_hash() {
        let args = vec!["-v=2".to_owned()];
        let base = policy_hash("a: 1", &args);
        assert_eq!(base, policy_hash("a: 1", &args));
        assert_ne!(base, policy_hash("a: 2", &args));
        assert_ne!(base, policy_hash("a: 1", &["-v=4".to_owned()]));
    }

    #[test]
    fn the_binding_grants_only_the_descheduler_role_to_its_account() {
        let binding = cluster_role_binding("ns-a");
        assert_eq!(binding.metadata.name.as_deref(), Some("nodemedic-descheduler-ns-a"));
        assert_eq!(binding.role_ref.name, CLUSTER_ROLE);
        let subject = &binding.subjects.as_ref().expect("subjects")[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (DESCHEDULER, Some("ns-a"))
        );
    }
}
