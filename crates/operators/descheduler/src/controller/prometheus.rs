//! Instant queries against Prometheus's HTTP API, through kube's own HTTP and TLS stack (a
//! client whose "cluster" is Prometheus), so the tainter adds no second client to the tree.

use std::collections::BTreeMap;

use kube::{Client, Config};
use serde::Deserialize;

use crate::{Error, Result};

#[derive(Clone)]
pub(crate) struct Prometheus {
    url: String,
    client: Client,
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<Sample>,
}

#[derive(Deserialize)]
struct Sample {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

impl Prometheus {
    /// `ca_pem`: the certificate authority of an https Prometheus, when not a public one.
    pub(crate) fn new(url: &str, ca_pem: Option<&[u8]>) -> Result<Self> {
        let failed = |why: String| Error::Prometheus {
            url: url.to_owned(),
            why,
        };
        let mut config = Config::new(url.parse().map_err(|e| failed(format!("not a URL: {e}")))?);
        if let Some(pem) = ca_pem {
            let certs = pem::parse_many(pem).map_err(|e| failed(format!("its CA is not PEM: {e}")))?;
            config.root_cert = Some(certs.into_iter().map(|c| c.into_contents()).collect());
        }
        config.read_timeout = Some(std::time::Duration::from_secs(10));
        let client = Client::try_from(config).map_err(|e| failed(e.to_string()))?;
        Ok(Self {
            url: url.to_owned(),
            client,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The query's value per `instance` label, as the descheduler reads it.
    pub(crate) async fn per_instance(&self, query: &str) -> Result<BTreeMap<String, f64>> {
        let failed = |why: String| Error::Prometheus {
            url: self.url.clone(),
            why,
        };
        let path = format!("/api/v1/query?query={}", encode(query));
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| failed(e.to_string()))?;
        let text = self
            .client
            .request_text(request)
            .await
            .map_err(|e| failed(format!("query {query:?} failed: {e}")))?;
        let answer: Answer = serde_json::from_str(&text).map_err(|e| failed(format!("unreadable answer: {e}")))?;
        if answer.status != "success" {
            return Err(failed(answer.error.unwrap_or(answer.status)));
        }
        let data = answer.data.ok_or_else(|| failed("an answer without data".into()))?;
        if data.result_type != "vector" {
            return Err(failed(format!(
                "query {query:?} gives a {}, not a vector of one sample per node",
                data.result_type
            )));
        }
        Ok(data
            .result
            .into_iter()
            .filter_map(|s| Some((s.metric.get("instance")?.clone(), s.value.1.parse().ok()?)))
            .collect())
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters stay).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_encoded_whole() {
        assert_eq!(
            super::encode("rate(x{mode=\"idle\"}[1m]) > 0.7"),
            "rate%28x%7Bmode%3D%22idle%22%7D%5B1m%5D%29%20%3E%200.7"
        );
    }
}
