//! What a fence agent accepts, from its own `-o metadata`: each long option users write
//! (`--username`) and the name the agent reads on standard input (`username`), and which options
//! are flags.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentOption {
    /// The name the agent reads on standard input.
    pub stdin_name: String,
    pub flag: bool,
}

/// An agent's options by long option name (without the leading `--`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    pub agent: String,
    pub options: BTreeMap<String, AgentOption>,
}

/// Parses `<resource-agent>` metadata. A deprecated parameter never shadows a current one with
/// the same long option (fence_redfish's `login` and `username` both read `--username`).
pub(crate) fn parse(xml: &str) -> Result<Metadata, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("unreadable agent metadata: {e}"))?;
    let root = doc.root_element();
    let mut meta = Metadata {
        agent: root.attribute("name").unwrap_or_default().to_owned(),
        options: BTreeMap::new(),
    };
    for parameter in root.descendants().filter(|n| n.has_tag_name("parameter")) {
        let Some(name) = parameter.attribute("name") else {
            continue;
        };
        let deprecated = parameter.attribute("deprecated") == Some("1");
        let flag = parameter
            .children()
            .any(|c| c.has_tag_name("content") && c.attribute("type") == Some("boolean"));
        let Some(getopt) = parameter
            .children()
            .find(|c| c.has_tag_name("getopt"))
            .and_then(|g| g.attribute("mixed"))
        else {
            continue;
        };
        for long in long_options(getopt) {
            let entry = AgentOption {
                stdin_name: name.to_owned(),
                flag,
            };
            match meta.options.get(&long) {
                Some(_) if deprecated => {}
                _ => {
                    meta.options.insert(long, entry);
                }
            }
        }
    }
    Ok(meta)
}

/// `-a, --ip=[ip]` → `ip`; `--ssl-insecure` → `ssl-insecure`.
fn long_options(getopt: &str) -> Vec<String> {
    getopt
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("--"))
        .map(|o| o.split('=').next().unwrap_or_default().to_owned())
        .filter(|o| !o.is_empty())
        .collect()
}

/// Names users commonly reach for that the agents spell differently.
const SYNONYMS: &[(&str, &str)] = &[
    ("hostname", "ip"),
    ("host", "ip"),
    ("address", "ip"),
    ("user", "username"),
    ("login", "username"),
    ("passwd", "password"),
];

/// The closest known option to an unknown one (a known synonym, else by edit distance), for
/// "did you mean".
pub(crate) fn suggest(meta: &Metadata, unknown: &str) -> Option<String> {
    if let Some((_, known)) = SYNONYMS
        .iter()
        .find(|(s, k)| *s == unknown && meta.options.contains_key(*k))
    {
        return Some((*known).to_owned());
    }
    meta.options
        .keys()
        .map(|k| (distance(k, unknown), k))
        .filter(|(d, k)| *d <= (k.len().max(unknown.len()) / 2).max(2))
        .min()
        .map(|(_, k)| k.clone())
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
pub(crate) const REDFISH_SAMPLE: &str = r#"<?xml version="1.0" ?>
<resource-agent name="fence_redfish" shortdesc="I/O Fencing agent for Redfish" >
<parameters>
	<parameter name="action" unique="0" required="1"><getopt mixed="-o, --action=[action]" /><content type="string" default="reboot"  /></parameter>
	<parameter name="ip" unique="0" required="0" obsoletes="ipaddr"><getopt mixed="-a, --ip=[ip]" /><content type="string"  /></parameter>
	<parameter name="ipaddr" unique="0" required="0" deprecated="1"><getopt mixed="-a, --ip=[ip]" /><content type="string"  /></parameter>
	<parameter name="login" unique="0" required="1" deprecated="1"><getopt mixed="-l, --username=[name]" /><content type="string"  /></parameter>
	<parameter name="username" unique="0" required="1" obsoletes="login"><getopt mixed="-l, --username=[name]" /><content type="string"  /></parameter>
	<parameter name="password" unique="0" required="0" obsoletes="passwd"><getopt mixed="-p, --password=[password]" /><content type="string"  /></parameter>
	<parameter name="ssl_insecure" unique="0" required="0"><getopt mixed="--ssl-insecure" /><content type="boolean"  /></parameter>
	<parameter name="systems_uri" unique="0" required="0"><getopt mixed="--systems-uri=[URI]" /><content type="string"  /></parameter>
</parameters>
</resource-agent>"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_to_the_names_the_agent_reads_and_current_names_win() {
        let meta = parse(REDFISH_SAMPLE).expect("metadata");
        assert_eq!(meta.agent, "fence_redfish");
        assert_eq!(meta.options["username"].stdin_name, "username");
        assert_eq!(meta.options["ip"].stdin_name, "ip");
        assert_eq!(meta.options["systems-uri"].stdin_name, "systems_uri");
        assert!(meta.options["ssl-insecure"].flag);
        assert!(!meta.options.contains_key("hostname"));
    }

    #[test]
    fn an_unknown_option_gets_the_closest_known_one() {
        let meta = parse(REDFISH_SAMPLE).expect("metadata");
        assert_eq!(suggest(&meta, "usrname").as_deref(), Some("username"));
        assert_eq!(suggest(&meta, "systems-url").as_deref(), Some("systems-uri"));
        assert_eq!(suggest(&meta, "zzzzzzzzzzzzzz"), None);
        assert_eq!(
            suggest(&meta, "hostname").as_deref(),
            Some("ip"),
            "the seed template's mistake"
        );
    }
}
