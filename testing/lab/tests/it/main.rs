//! Lab tests: the lab itself, against the real control plane. Each test starts its own lab; the
//! lab serialises them (one at a time on the machine).

mod support;

mod bmc;
mod membership;
mod nodes;
mod real_nodes;
mod status_writer;
mod storage;
mod sysrq;
mod teardown;
mod validation;
mod validation_descheduler;
mod watchdog;
mod watchdog_device;
