//! What the `nodemedic` binary shares with its end-to-end tests: the steps that install
//! nodemedic into a lab and run the stateful stand-in for a VM ([`scenario`]).

pub mod scenario;
