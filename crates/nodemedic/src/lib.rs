//! What the `nodemedic` binary shares with its end-to-end tests and the single-role executables
//! (`nodemedic-controller`, `nodemedic-agent`): the processes' entry points ([`controller`],
//! [`agent`]), the steps that install nodemedic into a lab and run the stateful stand-in for a VM
//! ([`scenario`]), and the story of a node failure read from the lab timeline ([`story`],
//! [`report`]).

pub mod agent;
pub mod bench;
pub mod chaos;
pub mod controller;
pub mod process;
pub mod report;
pub mod scenario;
pub mod story;
