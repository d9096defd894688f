//! Self Node Remediation: node agents that fence themselves, and the manager that recovers their workloads.
