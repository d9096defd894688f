//! What the `nodemedic` binary shares with the single-role executables (`nodemedic-controller`,
//! `nodemedic-agent`): the processes' entry points ([`controller`], [`agent`]) and their common
//! set-up ([`process`]).

pub mod agent;
pub mod controller;
pub(crate) mod process;
