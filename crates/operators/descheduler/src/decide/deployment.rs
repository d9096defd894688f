//! How the upstream descheduler is started: its arguments, the same in a pod and in the lab.

use nodemedic_api::descheduler::{KubeDeschedulerSpec, LogLevel, Mode};

use super::render::Invalid;

/// Where the policy ConfigMap is mounted in the descheduler's container.
pub(crate) const POLICY_DIR: &str = "/policy-dir";
/// The ConfigMap key holding the policy.
pub(crate) const POLICY_KEY: &str = "policy.yaml";

/// The descheduler's command line after its executable.
pub fn descheduler_args(spec: &KubeDeschedulerSpec) -> Result<Vec<String>, Invalid> {
    let interval = match spec.descheduling_interval_seconds {
        Some(seconds) if seconds > 0 => seconds,
        _ => {
            return Err(Invalid {
                field: "spec.deschedulingIntervalSeconds",
                message: "is not set: say how often the descheduler runs, in seconds (e.g. 3600)".into(),
            });
        }
    };
    let custom = spec.profile_customizations.clone().unwrap_or_default();
    let mut args = vec![
        format!("--policy-config-file={POLICY_DIR}/{POLICY_KEY}"),
        "--logging-format=text".to_owned(),
        format!("--descheduling-interval={interval}s"),
    ];
    if custom.dev_enable_evictions_in_background || spec.profiles.iter().any(|p| p.is_kubevirt()) {
        // A KubeVirt VM's eviction is answered 429 "Eviction triggered evacuation" and becomes a
        // live migration: counted as an eviction in progress, not a failure.
        args.push("--feature-gates=EvictionsInBackground=true".to_owned());
    }
    if spec.mode == Mode::Predictive {
        args.push("--dry-run=true".to_owned());
    }
    args.push(format!("-v={}", verbosity(spec.log_level)));
    Ok(args)
}

fn verbosity(level: Option<LogLevel>) -> u8 {
    match level {
        Some(LogLevel::Debug) => 4,
        Some(LogLevel::Trace) => 6,
        Some(LogLevel::TraceAll) => 8,
        Some(LogLevel::Normal | LogLevel::Unset) | None => 2,
    }
}
