//! Rebalancing, as OpenShift's Kube Descheduler Operator does it: a KubeDescheduler's profiles
//! become a policy for the upstream descheduler (kubernetes-sigs/descheduler), which does the
//! descheduling; the soft tainter steers the scheduler away from hot nodes meanwhile.
//!
//! [`decide`] holds every decision as a pure function.

pub mod decide;
