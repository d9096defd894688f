//! `nodemedic doctor`: checks a cluster for what nodemedic needs and says, for each problem, how
//! to fix it. Exits non-zero when something blocks nodemedic from working.

mod checks;
mod facts;
mod gather;
mod rbac;

use clap::{Args, ValueEnum};
use serde::Serialize;

use checks::{Finding, Severity};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub(crate) struct DoctorArgs {
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
    /// The namespace nodemedic runs in (its controller's lease and agents' registrations).
    #[arg(short, long, default_value = nodemedic_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
}

pub(crate) fn run(args: DoctorArgs) -> anyhow::Result<()> {
    nodemedic_kube::logging::init_with_default(false, "warn,kube_client=off");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let facts = runtime.block_on(async {
        let config = nodemedic_kube::client::infer_config().await?;
        let client = nodemedic_kube::client::client(config)?;
        gather::facts(&client, &args.namespace).await
    })?;
    let findings = checks::findings(&facts);
    let report = Report::of(findings);
    print!("{}", render(&report, args.output)?);
    if report.blocking > 0 {
        anyhow::bail!("{} blocking finding(s)", report.blocking);
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct Report {
    findings: Vec<Finding>,
    blocking: usize,
    warnings: usize,
    ok: usize,
}

impl Report {
    fn of(findings: Vec<Finding>) -> Self {
        let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
        Self {
            blocking: count(Severity::Blocking),
            warnings: count(Severity::Warning),
            ok: count(Severity::Ok),
            findings,
        }
    }
}

fn render(report: &Report, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Table => table(report),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(report)?),
    })
}

fn table(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.findings {
        let marker = match f.severity {
            Severity::Blocking => "[BLOCKING]",
            Severity::Warning => "[warning] ",
            Severity::Ok => "[ok]      ",
        };
        out.push_str(&format!("{marker} {:<13} {}: {}\n", f.check, f.subject, f.message));
        if !f.fix.is_empty() {
            out.push_str(&format!("{:24}fix: {}\n", "", f.fix));
        }
    }
    out.push_str(&format!(
        "{} blocking, {} warnings, {} ok\n",
        report.blocking, report.warnings, report.ok
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(severity: Severity, fix: &str) -> Finding {
        Finding {
            severity,
            check: "agents",
            subject: "node node-1".into(),
            message: "something".into(),
            fix: fix.into(),
        }
    }

    #[test]
    fn the_table_shows_each_fix_under_its_finding_and_a_summary() {
        let report = Report::of(vec![
            finding(Severity::Blocking, "start the agent"),
            finding(Severity::Ok, ""),
        ]);
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[0].starts_with("[BLOCKING] agents        node node-1: something"),
            "{text}"
        );
        assert_eq!(lines[1].trim_start(), "fix: start the agent");
        assert!(lines[1].starts_with("    "));
        assert!(lines[2].starts_with("[ok]"));
        assert_eq!(lines[3], "1 blocking, 0 warnings, 1 ok");
        let json: serde_json::Value =
            serde_json::from_str(&render(&report, Format::Json).expect("JSON")).expect("parses");
        assert_eq!(json["blocking"], 1);
        assert_eq!(json["findings"][0]["severity"], "blocking");
        assert_eq!(json["findings"][0]["fix"], "start the agent");
    }
}
