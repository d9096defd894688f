//! nodemedic's test tooling around the lab: the steps that install nodemedic into a lab and run
//! the stateful stand-in for a VM ([`scenario`]), the story of a node failure read from the lab
//! timeline ([`story`], [`report`]), the benchmarks' measures ([`bench`]), the fault campaign
//! ([`chaos`]) and the source every report names ([`provenance`]). Shared by the `nodemedic-lab`
//! executable and the end-to-end tests; nothing here ships in an image.

pub mod bench;
pub mod bundle;
pub mod chaos;
pub mod chart_defaults;
pub mod fleet;
pub mod images;
pub mod product;
pub mod provenance;
pub mod real_nodes;
pub mod report;
pub mod scenario;
pub mod story;
