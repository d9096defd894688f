//! The control-plane processes: etcd on tmpfs, kube-apiserver on the node bridge, and
//! kube-controller-manager and kube-scheduler with the lab's failure timings.

use std::{net::Ipv4Addr, path::Path};

use crate::{Timings, binaries::Binaries, pki::LabPki, process::ProcessSpec};

pub(crate) const API_PORT: u16 = 6443;

/// Where the lab's etcd listens: a loopback address of the lab's own (127.213.<slot>.1, from its
/// network slot), out of its nodes' reach, on etcd's usual ports. A port the kernel handed out as
/// free (bind to port 0, then close) could be any process's by the time etcd bound it, and was
/// another's once with four labs starting side by side (ci-20261206T231226Z: "bind: address
/// already in use").
pub(crate) struct EtcdAddress(pub Ipv4Addr);

impl EtcdAddress {
    pub(crate) fn of_lab(host_ip: Ipv4Addr) -> Self {
        let [_, b, c, d] = host_ip.octets();
        Self(Ipv4Addr::new(127, b, c, d))
    }

    fn client(&self) -> String {
        format!("http://{}:2379", self.0)
    }

    fn peer(&self) -> String {
        format!("http://{}:2380", self.0)
    }
}

pub(crate) fn etcd(bins: &Binaries, data_dir: &Path, address: &EtcdAddress) -> ProcessSpec {
    let client = address.client();
    let peer = address.peer();
    ProcessSpec::new(
        &bins.etcd,
        [
            "--name=lab".to_owned(),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=lab={peer}"),
            "--listen-metrics-urls=".to_owned(),
            // Data lives on tmpfs and dies with the lab: fsync buys nothing.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ],
    )
}

/// What the API server's audit log records: every request nodemedic makes (the controller's
/// ServiceAccount and the agents), with its verb and resource, once it completes (for a watch:
/// once it starts). Benchmarks count them; nothing else is logged.
pub(crate) fn audit_policy() -> String {
    format!(
        r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:{}", "nodemedic:agents"]
- level: None
"#,
        nodemedic_api::names::DEFAULT_NAMESPACE
    )
}

pub(crate) struct Audit<'a> {
    pub policy: &'a Path,
    pub log: &'a Path,
}

/// The API server's admission configuration: Pod Security admission enforcing `level` in every
/// namespace without a label of its own (as a hardened cluster does), kube-system exempt.
pub(crate) fn pod_security_admission(level: &str) -> String {
    format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: "{level}"
      enforce-version: latest
      warn: "{level}"
      warn-version: latest
    exemptions:
      namespaces: [kube-system]
"#
    )
}

pub(crate) fn apiserver(
    bins: &Binaries,
    pki: &LabPki,
    ip: Ipv4Addr,
    etcd: &EtcdAddress,
    timings: &Timings,
    audit: &Audit<'_>,
    admission: Option<&Path>,
) -> ProcessSpec {
    let p = |f: &str| pki.path(f).display().to_string();
    let admission = admission.map(|file| format!("--admission-control-config-file={}", file.display()));
    ProcessSpec::new(
        &bins.kube_apiserver,
        [
            format!("--etcd-servers={}", etcd.client()),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={API_PORT}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
            format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
            // Node names resolve nowhere here; their addresses are on the node bridge.
            "--kubelet-preferred-address-types=InternalIP".into(),
            // Webhook Services are reached at their endpoints (pods on real nodes, routed from
            // the host): the host runs no kube-proxy for their cluster IPs.
            "--enable-aggregator-routing=true".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            format!(
                "--default-unreachable-toleration-seconds={}",
                timings.toleration_seconds
            ),
            format!("--default-not-ready-toleration-seconds={}", timings.toleration_seconds),
            "--profiling=false".into(),
            format!("--audit-policy-file={}", audit.policy.display()),
            format!("--audit-log-path={}", audit.log.display()),
            "--audit-log-format=json".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .chain(admission),
    )
}

pub(crate) fn controller_manager(bins: &Binaries, pki: &LabPki, kubeconfig: &Path, timings: &Timings) -> ProcessSpec {
    let p = |f: &str| pki.path(f).display().to_string();
    ProcessSpec::new(
        &bins.kube_controller_manager,
        [
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
            format!("--node-monitor-period={}ms", timings.node_monitor_period.as_millis()),
            format!(
                "--node-monitor-grace-period={}ms",
                timings.node_monitor_grace.as_millis()
            ),
            format!(
                "--attach-detach-reconcile-sync-period={}ms",
                timings.attach_detach_sync.as_millis()
            ),
            format!("--root-ca-file={}", p("ca.crt")),
            format!("--service-account-private-key-file={}", p("sa.key")),
            "--use-service-account-credentials=false".into(),
            format!("--cluster-signing-cert-file={}", p("ca.crt")),
            format!("--cluster-signing-key-file={}", p("ca.key")),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--v=1".into(),
        ],
    )
}

pub(crate) fn scheduler(bins: &Binaries, kubeconfig: &Path) -> ProcessSpec {
    ProcessSpec::new(
        &bins.kube_scheduler,
        [
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--v=1".into(),
        ],
    )
}
