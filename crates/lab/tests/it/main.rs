//! Lab tests: the lab itself, against the real control plane. Each test starts its own lab; the
//! lab serialises them (one at a time on the machine).

mod support;

mod bmc;
mod nodes;
mod storage;
mod teardown;
mod validation;
mod watchdog;
