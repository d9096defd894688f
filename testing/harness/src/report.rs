//! A node failure's report: the timeline as text, as JSON, and as a self-contained HTML page with
//! a chart (one lane per node and per workload, the milestones marked).

use jiff::Timestamp;
use nodemedic_lab::timeline::{Entry, Event, describe};
use serde_json::json;

use crate::story::{Milestone, Reached, Subject};

pub struct Report {
    pub title: String,
    pub subject: Subject,
    pub nodes: Vec<String>,
    pub entries: Vec<Entry>,
    pub milestones: Vec<Reached>,
    /// The at-most-one witness's findings (empty: the workload never ran twice).
    pub violations: Vec<String>,
}

impl Report {
    fn origin(&self) -> Timestamp {
        self.milestones
            .first()
            .map(|r| r.at)
            .or_else(|| self.entries.first().map(|e| e.at))
            .unwrap_or_else(Timestamp::now)
    }

    fn since(&self, at: Timestamp) -> f64 {
        (at - self.origin()).total(jiff::Unit::Second).unwrap_or(0.0)
    }

    fn at(&self, m: Milestone) -> Option<Timestamp> {
        self.milestones.iter().find(|r| r.milestone == m).map(|r| r.at)
    }

    /// From the power loss to the workload Running elsewhere.
    pub fn recovery_seconds(&self) -> Option<f64> {
        self.at(Milestone::WorkloadRunningElsewhere).map(|t| self.since(t))
    }

    pub fn text(&self) -> String {
        let mut out = String::from("timeline (seconds after the power loss):\n");
        for r in &self.milestones {
            out.push_str(&format!(
                "  {:>7.1}s  {}\n",
                self.since(r.at),
                r.milestone.describe(&self.subject.node, &self.subject.pod)
            ));
        }
        if let Some(total) = self.recovery_seconds() {
            out.push_str(&format!(
                "time to recovery ({} Running elsewhere): {total:.1}s\n",
                self.subject.pod
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "title": self.title,
            "node": self.subject.node,
            "pod": self.subject.pod,
            "milestones": self.milestones.iter().map(|r| json!({
                "milestone": r.milestone,
                "at": r.at.to_string(),
                "seconds": self.since(r.at),
                "detail": r.detail,
            })).collect::<Vec<_>>(),
            "recoverySeconds": self.recovery_seconds(),
            "witnessOk": self.violations.is_empty(),
            "violations": self.violations,
            "timeline": self.entries,
        })
    }

    pub fn html(&self) -> String {
        let end = self.entries.last().map(|e| self.since(e.at)).unwrap_or(1.0).max(1.0);
        let start = self.entries.first().map(|e| self.since(e.at)).unwrap_or(0.0).min(0.0);
        let chart = Chart { start, end };
        let mut lanes = Vec::new();
        for node in &self.nodes {
            lanes.push((node.clone(), self.node_segments(node, end)));
        }
        lanes.push((self.subject.pod.clone(), self.pod_segments(end)));
        let svg = chart.svg(&lanes, &self.marks());
        let rows: String = self
            .entries
            .iter()
            .map(|e| {
                format!(
                    "<tr><td class=\"t\">{:.2}</td><td>{}</td></tr>\n",
                    self.since(e.at),
                    escape(&describe(&e.event))
                )
            })
            .collect();
        let steps: String = self
            .milestones
            .iter()
            .enumerate()
            .map(|(i, r)| {
                format!(
                    "<li><b>{}</b> +{:.1}s {}</li>\n",
                    i + 1,
                    self.since(r.at),
                    escape(&r.milestone.describe(&self.subject.node, &self.subject.pod))
                )
            })
            .collect();
        let verdict = if self.violations.is_empty() {
            format!("{} never ran on two nodes at once (witness)", escape(&self.subject.pod))
        } else {
            format!("WITNESS VIOLATIONS: {}", escape(&self.violations.join("; ")))
        };
        let total = self
            .recovery_seconds()
            .map(|t| format!("time to recovery: {t:.1}s"))
            .unwrap_or_else(|| "the workload did not come back".into());
        format!(
            r#"<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }} td {{ padding: 1px 8px; }} td.t {{ text-align: right; color: #666; }}
</style></head><body>
<h1>{title}</h1>
<p><b>{total}</b>. {verdict}.</p>
{svg}
<ol>
{steps}</ol>
<h2>Everything the lab saw (seconds after the power loss)</h2>
<table>
{rows}</table>
</body></html>
"#,
            title = escape(&self.title),
        )
    }

    fn marks(&self) -> Vec<(f64, String)> {
        self.milestones
            .iter()
            .enumerate()
            .map(|(i, r)| (self.since(r.at), (i + 1).to_string()))
            .collect()
    }

    fn node_segments(&self, node: &str, end: f64) -> Vec<Segment> {
        let (mut powered, mut ready) = (true, true);
        let mut changes = vec![(self.chart_start(), state(powered, ready))];
        for e in &self.entries {
            match &e.event {
                Event::Power { node: n, on, .. } if n == node => powered = *on,
                Event::NodeReady { node: n, status, .. } if n == node => ready = status == "True",
                _ => continue,
            }
            changes.push((self.since(e.at), state(powered, ready)));
        }
        segments(changes, end)
    }

    fn pod_segments(&self, end: f64) -> Vec<Segment> {
        let mut changes = vec![(self.chart_start(), (String::new(), ""))];
        for e in &self.entries {
            let next = match &e.event {
                Event::PodPhase { pod, node, phase, .. } if pod.to_string() == self.subject.pod => {
                    let class = if phase == "Running" { "running" } else { "pending" };
                    (format!("{phase} on {}", node.as_deref().unwrap_or("-")), class)
                }
                Event::PodDeleting { pod, node } if pod.to_string() == self.subject.pod => {
                    (format!("deleting on {}", node.as_deref().unwrap_or("-")), "terminating")
                }
                Event::PodGone { pod, .. } if pod.to_string() == self.subject.pod => (String::new(), ""),
                _ => continue,
            };
            changes.push((self.since(e.at), next));
        }
        segments(changes, end)
    }

    fn chart_start(&self) -> f64 {
        self.entries.first().map(|e| self.since(e.at)).unwrap_or(0.0).min(0.0)
    }
}

fn state(powered: bool, ready: bool) -> (String, &'static str) {
    match (powered, ready) {
        (false, _) => ("powered off".into(), "off"),
        (true, true) => ("Ready".into(), "ready"),
        (true, false) => ("NotReady".into(), "notready"),
    }
}

struct Segment {
    from: f64,
    to: f64,
    label: String,
    class: &'static str,
}

/// Consecutive states as segments; an empty class is a gap (nothing there).
fn segments(changes: Vec<(f64, (String, &'static str))>, end: f64) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for (i, (from, (label, class))) in changes.iter().enumerate() {
        let to = changes.get(i + 1).map(|c| c.0).unwrap_or(end);
        if class.is_empty() || to <= *from {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.class == *class && last.label == *label && (last.to - from).abs() < 1e-9 => last.to = to,
            _ => out.push(Segment {
                from: *from,
                to,
                label: label.clone(),
                class,
            }),
        }
    }
    out
}

struct Chart {
    start: f64,
    end: f64,
}

/// Inside the SVG, so the chart keeps its colours when copied out of the page.
const SVG_STYLE: &str = "<style>.ready { fill: #4caf50; } .notready { fill: #ff9800; } .off { fill: #9e9e9e; } \
.running { fill: #2196f3; } .pending { fill: #fbc02d; } .terminating { fill: #e53935; } \
.mark { stroke: #333; stroke-dasharray: 3 3; } text { font-size: 11px; font-family: sans-serif; }</style>";

const LABEL_W: f64 = 150.0;
const PLOT_W: f64 = 850.0;
const LANE_H: f64 = 30.0;

impl Chart {
    fn x(&self, t: f64) -> f64 {
        LABEL_W + (t - self.start) / (self.end - self.start).max(1e-9) * PLOT_W
    }

    fn svg(&self, lanes: &[(String, Vec<Segment>)], marks: &[(f64, String)]) -> String {
        let height = 30.0 + LANE_H * lanes.len() as f64 + 25.0;
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\">\n{SVG_STYLE}\n",
            LABEL_W + PLOT_W + 10.0
        );
        for (i, (name, segments)) in lanes.iter().enumerate() {
            let y = 20.0 + LANE_H * i as f64;
            out.push_str(&format!("<text x=\"4\" y=\"{}\">{}</text>\n", y + 18.0, escape(name)));
            for s in segments {
                let (x0, x1) = (self.x(s.from), self.x(s.to));
                out.push_str(&format!(
                    "<rect class=\"{}\" x=\"{x0:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\"><title>{}</title></rect>\n",
                    s.class,
                    y + 4.0,
                    (x1 - x0).max(0.5),
                    LANE_H - 8.0,
                    escape(&s.label)
                ));
                if x1 - x0 > 70.0 {
                    out.push_str(&format!(
                        "<text x=\"{:.1}\" y=\"{}\" fill=\"#fff\">{}</text>\n",
                        x0 + 4.0,
                        y + 19.0,
                        escape(&s.label)
                    ));
                }
            }
        }
        let bottom = 20.0 + LANE_H * lanes.len() as f64;
        for (t, label) in marks {
            let x = self.x(*t);
            out.push_str(&format!(
                "<line class=\"mark\" x1=\"{x:.1}\" y1=\"14\" x2=\"{x:.1}\" y2=\"{bottom}\"/><text x=\"{:.1}\" y=\"12\">{label}</text>\n",
                x - 3.0
            ));
        }
        let ticks = 10;
        for k in 0..=ticks {
            let t = self.start + (self.end - self.start) * k as f64 / ticks as f64;
            out.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{}\">{t:.0}s</text>\n",
                self.x(t) - 8.0,
                bottom + 16.0
            ));
        }
        out.push_str("</svg>");
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodemedic_lab::PodId;

    #[test]
    fn the_page_has_a_lane_per_node_and_workload_and_the_numbers() {
        let at = |s| Timestamp::from_second(s).expect("time");
        let pod = PodId {
            namespace: "vm".into(),
            name: "db-0".into(),
            uid: "u".into(),
        };
        let entries = vec![
            Entry {
                at: at(0),
                revision: None,
                event: Event::PodPhase {
                    pod: pod.clone(),
                    node: Some("node-2".into()),
                    phase: "Running".into(),
                    claims: vec![],
                    stateful: true,
                },
            },
            Entry {
                at: at(10),
                revision: None,
                event: Event::Power {
                    node: "node-2".into(),
                    on: false,
                    cause: "crash".into(),
                },
            },
            Entry {
                at: at(30),
                revision: None,
                event: Event::PodGone {
                    pod: pod.clone(),
                    node: Some("node-2".into()),
                },
            },
            Entry {
                at: at(34),
                revision: None,
                event: Event::PodPhase {
                    pod,
                    node: Some("node-1".into()),
                    phase: "Running".into(),
                    claims: vec![],
                    stateful: true,
                },
            },
        ];
        let subject = Subject {
            node: "node-2".into(),
            pod: "vm/db-0".into(),
        };
        let report = Report {
            title: "demo <test>".into(),
            milestones: crate::story::milestones(&entries, &subject),
            subject,
            nodes: vec!["node-1".into(), "node-2".into()],
            entries,
            violations: vec![],
        };
        assert_eq!(report.recovery_seconds(), Some(24.0));
        let html = report.html();
        assert!(html.contains("demo &lt;test&gt;"));
        for lane in ["node-1", "node-2", "vm/db-0"] {
            assert!(html.contains(&format!(">{lane}</text>")), "{lane}");
        }
        assert!(html.contains("class=\"off\""), "the powered-off stretch is drawn");
        assert!(html.contains("Running on node-1"));
        assert!(html.contains("time to recovery: 24.0s"));
        assert_eq!(report.json()["witnessOk"], true);
        assert!(report.text().contains("24.0s"));
    }
}
