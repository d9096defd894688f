//! Fence Agents Remediation: power-fences nodes through their BMC with the ClusterLabs fence agents.

pub mod decide;
