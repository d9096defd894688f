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
