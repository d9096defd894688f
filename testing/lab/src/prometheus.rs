//! The lab's metrics: a node exporter on every node (`<node>/node-exporter`, in the node's
//! namespace on its IP, so a crashed or cut-off node stops reporting as a real one does) serving
//! the node exporter's metric names from figures the lab sets, and a real Prometheus (Debian's,
//! lab process `prometheus`, on the host bridge so nodes reach it too) that scrapes them every
//! second and evaluates recording rules every second.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Serialize;

use crate::{Error, Lab, Result, binaries::rebalancing_dir, error::io, process::ProcessSpec, wait};

/// Where each node exporter listens, on its node's IP.
pub const EXPORTER_PORT: u16 = 9100;

/// What a node reports: utilization and pressure as fractions (0 to 1).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct NodeFigures {
    pub cpu: f64,
    pub cpu_pressure: f64,
    pub memory: f64,
    pub memory_pressure: f64,
}

impl Default for NodeFigures {
    fn default() -> Self {
        Self {
            cpu: 0.2,
            cpu_pressure: 0.0,
            memory: 0.3,
            memory_pressure: 0.0,
        }
    }
}

impl NodeFigures {
    pub fn cpu(cpu: f64) -> Self {
        Self { cpu, ..Self::default() }
    }
}

/// A node exporter in miniature: counters advance at the rates the figures file gives (read at
/// every scrape). It also serves the two kube-state-metrics series the recording rules read for
/// its node (role and allocatable memory), labelled with `node` as kube-state-metrics labels them.
const EXPORTER: &str = r##"
import http.server, json, sys, time
figures_path, node, address, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
CPUS = 4
MEMORY = 16 * 2**30
state = {"at": None, "idle": 0.0, "cpu_wait": 0.0, "memory_wait": 0.0}

def figures():
    try:
        with open(figures_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}

def exposition():
    now = time.monotonic()
    f = figures()
    elapsed = 0.0 if state["at"] is None else now - state["at"]
    state["at"] = now
    clamp = lambda v: min(max(float(v), 0.0), 1.0)
    state["idle"] += elapsed * (1 - clamp(f.get("cpu", 0.2)))
    state["cpu_wait"] += elapsed * clamp(f.get("cpu_pressure", 0.0))
    state["memory_wait"] += elapsed * clamp(f.get("memory_pressure", 0.0))
    lines = ["# TYPE node_cpu_seconds_total counter"]
    for cpu in range(CPUS):
        lines.append('node_cpu_seconds_total{cpu="%d",mode="idle"} %f' % (cpu, state["idle"]))
    lines += [
        "# TYPE node_pressure_cpu_waiting_seconds_total counter",
        "node_pressure_cpu_waiting_seconds_total %f" % state["cpu_wait"],
        "# TYPE node_pressure_memory_waiting_seconds_total counter",
        "node_pressure_memory_waiting_seconds_total %f" % state["memory_wait"],
        "# TYPE node_memory_MemAvailable_bytes gauge",
        "node_memory_MemAvailable_bytes %d" % int(MEMORY * (1 - clamp(f.get("memory", 0.3)))),
        "# TYPE kube_node_role gauge",
        'kube_node_role{node="%s",role="worker"} 1' % node,
        "# TYPE kube_node_status_allocatable gauge",
        'kube_node_status_allocatable{node="%s",resource="memory",unit="byte"} %d' % (node, MEMORY),
    ]
    return ("\n".join(lines) + "\n").encode()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = exposition()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

http.server.HTTPServer((address, port), Handler).serve_forever()
"##;

impl Lab {
    fn figures_file(&self, node: &str) -> PathBuf {
        self.dir().join("metrics").join(format!("{node}.json"))
    }

    /// Sets what `node`'s exporter reports from its next scrape on.
    pub fn set_node_figures(&self, node: &str, figures: NodeFigures) -> Result<()> {
        self.inner.index(node)?;
        let path = self.figures_file(node);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let partial = path.with_extension("json.partial");
        let text = serde_json::to_string(&figures).map_err(|e| Error::Invalid(e.to_string()))?;
        std::fs::write(&partial, text).map_err(io(format!("writing {}", partial.display())))?;
        std::fs::rename(&partial, &path).map_err(io(format!("writing {}", path.display())))
    }

    /// Starts a node exporter on every node and Prometheus with `rules` (a rule file's YAML);
    /// returns Prometheus's URL once it has scraped every node.
    pub async fn start_prometheus(&self, rules: &str) -> Result<String> {
        let dir = self.dir().join("metrics");
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let exporter = dir.join("node_exporter.py");
        std::fs::write(&exporter, EXPORTER).map_err(io("writing the node exporter"))?;
        let mut targets = BTreeMap::new();
        for node in self.nodes() {
            if !self.figures_file(&node).exists() {
                self.set_node_figures(&node, NodeFigures::default())?;
            }
            let ip = self.node_ip(&node)?;
            let spec = ProcessSpec::new(
                "python3",
                [
                    exporter.display().to_string(),
                    self.figures_file(&node).display().to_string(),
                    node.clone(),
                    ip.to_string(),
                    EXPORTER_PORT.to_string(),
                ],
            );
            self.add_node_process(&node, "node-exporter", spec)?;
            targets.insert(node, format!("{ip}:{EXPORTER_PORT}"));
        }
        std::fs::write(dir.join("rules.yaml"), rules).map_err(io("writing the recording rules"))?;
        let config = config(&targets);
        std::fs::write(dir.join("prometheus.yaml"), config).map_err(io("writing the Prometheus configuration"))?;
        let port = crate::lab::free_port()?;
        let listen = format!("{}:{port}", self.api_ip());
        let binary = rebalancing_dir().join("prometheus");
        if !binary.exists() {
            return Err(Error::Invalid(format!(
                "{} is missing: run scripts/build-descheduler.sh (make setup does)",
                binary.display()
            )));
        }
        self.add_host_process(
            "prometheus",
            ProcessSpec::new(
                binary,
                [
                    format!("--config.file={}", dir.join("prometheus.yaml").display()),
                    format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
                    format!("--web.listen-address={listen}"),
                    "--storage.tsdb.retention.time=1h".to_owned(),
                    "--log.level=warn".to_owned(),
                ],
            ),
        )?;
        let url = format!("http://{listen}");
        let nodes = self.nodes().len();
        let inner = self.inner.clone();
        wait::until("Prometheus scraping every node", Duration::from_secs(60), || {
            let (url, inner) = (url.clone(), inner.clone());
            async move {
                if let Some(died) = crate::lab::process_died(&inner.resources, "prometheus") {
                    return Err(died);
                }
                let up = query(&url, "count(up{job=\"node\"} == 1)").await.unwrap_or_default();
                Ok((up.first().map(|(_, v)| *v as usize) == Some(nodes)).then_some(()))
            }
        })
        .await?;
        Ok(url)
    }
}

fn config(targets: &BTreeMap<String, String>) -> String {
    let mut text = String::from(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\nrule_files: [rules.yaml]\nscrape_configs:\n- job_name: node\n  static_configs:\n",
    );
    for (node, target) in targets {
        // The descheduler reads a node's samples by `instance` = the node's name.
        text.push_str(&format!(
            "  - targets: ['{target}']\n    labels: {{instance: '{node}'}}\n"
        ));
    }
    text
}

/// An instant query: each sample's `instance` (or "") and value.
pub async fn query(url: &str, promql: &str) -> Result<Vec<(String, f64)>> {
    let answer = crate::cmd::run(
        "curl",
        &[
            "-sS",
            "--max-time",
            "5",
            "-G",
            &format!("{url}/api/v1/query"),
            "--data-urlencode",
            &format!("query={promql}"),
        ],
    )?;
    let answer: serde_json::Value = serde_json::from_str(&answer).map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let instance = s["metric"]["instance"].as_str().unwrap_or_default().to_owned();
            let value = s["value"][1].as_str()?.parse().ok()?;
            Some((instance, value))
        })
        .collect())
}

/// A rule file with every group's evaluation interval set to `interval` (the lab's second).
pub fn with_interval(rules: &str, interval: &str) -> String {
    rules
        .lines()
        .map(|line| match line.trim_start().strip_prefix("interval:") {
            Some(_) => format!("{}interval: {interval}", &line[..line.len() - line.trim_start().len()]),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
