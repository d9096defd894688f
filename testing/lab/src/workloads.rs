//! Workloads the tests, the demo and the benchmarks run in a lab.

/// The stand-in for a VM: a one-replica StatefulSet in namespace `vm` with a ReadWriteOnce
/// volume from the lab's storage class. Its pod is `db-0`.
pub const STATEFULSET: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: vm}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 30
      containers: [{name: db, image: registry.example/db:1}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: lab-rwo
      resources: {requests: {storage: 1Gi}}
"#;

/// A kubeadm-style etcd member of `node`: a mirror pod `component=etcd` in kube-system (the
/// kubelet's copy of a static pod), whose readiness kwok keeps like a kubelet would. The lab's
/// real etcd is one process on the host; these pods give the cluster what a kubeadm cluster shows.
pub fn etcd_mirror_pod(node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: etcd-{node}
  namespace: kube-system
  labels: {{component: etcd, tier: control-plane}}
  annotations: {{kubernetes.io/config.mirror: lab, kubernetes.io/config.source: file}}
spec:
  nodeName: {node}
  hostNetwork: true
  priorityClassName: system-node-critical
  tolerations: [{{operator: Exists}}]
  containers: [{{name: etcd, image: registry.k8s.io/etcd:3.6.0-0}}]
"#
    )
}

/// OpenShift's stand-in for the etcd member of `node`: a guard pod `app=guard` in openshift-etcd,
/// which OpenShift keeps Ready while the member on its node is healthy (behind the
/// `etcd-guard-pdb` budget); kwok keeps it Ready here.
pub fn etcd_guard_pod(node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: etcd-guard-{node}
  namespace: openshift-etcd
  labels: {{app: guard}}
spec:
  nodeName: {node}
  hostNetwork: true
  tolerations: [{{operator: Exists}}]
  containers: [{{name: guard, image: quay.io/openshift/origin-cli:4.16}}]
"#
    )
}

/// The stateful stand-in as a real process, for real nodes: the same `db` StatefulSet, whose
/// container appends synced records (its pod's UID, a sequence number, a time) to its volume
/// (see testing/lab/node-images/writer); [`crate::data_witness`] reads them.
pub const WRITER_STATEFULSET: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: vm}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: db
        image: lab.nodemedic.io/writer:1
        imagePullPolicy: Never
        env:
        - {name: INSTANCE, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
        - {name: INTERVAL, value: 100ms}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: lab-rwo
      resources: {requests: {storage: 1Gi}}
"#;
