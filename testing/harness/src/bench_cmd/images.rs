//! The images' sizes, as `make image` measured them (target/images/sizes.json): the OCI
//! archive, what a registry stores and a node pulls, against the goals; and the unpacked size.

use anyhow::Context;
use serde_json::{Value, json};

use super::{Section, verdict};

const MIB: f64 = 1024.0 * 1024.0;
/// (image, largest archive in MiB).
const GOALS: [(&str, f64); 2] = [("nodemedic-controller", 150.0), ("nodemedic-agent", 25.0)];

pub(super) fn run() -> anyhow::Result<Section> {
    let me = std::env::current_exe().context("locating this executable")?;
    // target/<profile>/nodemedic-lab -> target/images/sizes.json
    let path = me
        .parent()
        .and_then(|profile| profile.parent())
        .map(|target| target.join("images").join("sizes.json"))
        .context("finding the target directory")?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (run `make image` first)", path.display()))?;
    let sizes: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let mut markdown = String::from(
        "## Images\n\n| image | archive (MiB) | goal | unpacked (MiB) | verdict |\n|---|---|---|---|---|\n",
    );
    let mut out = json!({});
    for (image, goal) in GOALS {
        let archive = sizes[image]["archive_bytes"]
            .as_f64()
            .with_context(|| format!("{} has no size for {image}", path.display()))?
            / MIB;
        let unpacked = sizes[image]["unpacked_bytes"].as_f64().unwrap_or(0.0) / MIB;
        let met = archive <= goal;
        markdown.push_str(&format!(
            "| {image} | {archive:.1} | ≤ {goal:.0} | {unpacked:.1} | {} |\n",
            verdict(met)
        ));
        out[image] = json!({"archiveMib": archive, "unpackedMib": unpacked, "goalMib": goal, "met": met});
    }
    Ok(Section {
        name: "images",
        json: out,
        markdown,
    })
}
