//! The fence agent's options for one node, as medik8s builds them (shared < node parameters <
//! secrets, `{{.NodeName}}` templating, `--action` defaulting to reboot), checked against the
//! agent's metadata, and written for its standard input so no secret reaches argv.

use std::collections::{BTreeMap, BTreeSet};

use super::metadata::{Metadata, suggest};

pub(crate) const NODE_NAME_PLACEHOLDER: &str = "{{.NodeName}}";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Reboot,
    Off,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Reboot => "reboot",
            Action::Off => "off",
        }
    }
}

/// Where one node's options come from.
#[derive(Clone, Default)]
pub(crate) struct Sources<'a> {
    pub node: &'a str,
    pub shared: BTreeMap<String, String>,
    /// Parameter → node → value (medik8s's `nodeparameters`).
    pub per_node: BTreeMap<String, BTreeMap<String, String>>,
    pub shared_secret: BTreeMap<String, String>,
    pub node_secret: BTreeMap<String, String>,
}

/// The options for one run: long option (without `--`) → value, and which came from secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Options {
    pub action: Action,
    pub values: BTreeMap<String, String>,
    pub secret: BTreeSet<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParameterError {
    #[error("{name} is set both in the spec and in a secret: define each parameter once")]
    Duplicate { name: String },
    #[error(
        "no parameter is node-specific: use {NODE_NAME_PLACEHOLDER} in a shared parameter or secret value, or set nodeparameters"
    )]
    NothingNodeSpecific,
    #[error("--action={0} is not supported: use reboot or off")]
    Action(String),
    #[error(
        "--{0} cannot come from a secret or --option: nodemedic sets the action of each step; put --action in the spec"
    )]
    Reserved(String),
    #[error("the value of --{0} spans several lines: remove the line break")]
    Multiline(String),
    #[error("{agent} has no option --{name}{}", .suggestion.as_ref().map(|s| format!("; did you mean --{s}?")).unwrap_or_default())]
    Unknown {
        agent: String,
        name: String,
        suggestion: Option<String>,
    },
}

fn option_name(key: &str) -> String {
    key.trim_start_matches('-').to_owned()
}

fn render(value: &str, node: &str) -> (String, bool) {
    (
        value.replace(NODE_NAME_PLACEHOLDER, node),
        value.contains(NODE_NAME_PLACEHOLDER),
    )
}

fn looks_secret(name: &str) -> bool {
    ["passw", "token", "secret"].iter().any(|s| name.contains(s))
}

/// Merges the sources for `sources.node`.
pub(crate) fn build(sources: &Sources<'_>) -> Result<Options, ParameterError> {
    let mut values = BTreeMap::new();
    let mut node_specific = false;
    for (key, value) in &sources.shared {
        let (value, templated) = render(value, sources.node);
        node_specific |= templated;
        values.insert(option_name(key), value);
    }
    for (key, nodes) in &sources.per_node {
        if let Some(value) = nodes.get(sources.node) {
            node_specific = true;
            values.insert(option_name(key), render(value, sources.node).0);
        }
    }
    let mut secrets = BTreeMap::new();
    for (key, value) in sources.shared_secret.iter().chain(&sources.node_secret) {
        // A secret written with `echo` ends in a newline the agent would strip anyway.
        let (value, templated) = render(value.trim_end_matches(['\r', '\n']), sources.node);
        node_specific |= templated;
        secrets.insert(option_name(key), value);
    }
    // The agent reads one option per line and keeps the last action it reads: neither a line
    // break in a value nor an action from a secret may change what a step does.
    if let Some(name) = secrets
        .keys()
        .chain(values.keys())
        .find(|k| *k == "option")
        .or_else(|| secrets.keys().find(|k| *k == "action"))
    {
        return Err(ParameterError::Reserved(name.clone()));
    }
    if let Some((name, _)) = values.iter().chain(&secrets).find(|(_, v)| v.contains(['\r', '\n'])) {
        return Err(ParameterError::Multiline(name.clone()));
    }
    node_specific |= !sources.node_secret.is_empty();
    if let Some(name) = secrets.keys().find(|k| values.contains_key(*k)) {
        return Err(ParameterError::Duplicate {
            name: format!("--{name}"),
        });
    }
    if !node_specific {
        return Err(ParameterError::NothingNodeSpecific);
    }
    let action = match values.remove("action").as_deref() {
        None | Some("reboot") => Action::Reboot,
        Some("off") => Action::Off,
        Some(other) => return Err(ParameterError::Action(other.to_owned())),
    };
    // Older templates keep passwords in the spec: they are secrets all the same.
    let secret = secrets
        .keys()
        .chain(values.keys().filter(|k| looks_secret(k)))
        .cloned()
        .collect();
    values.extend(secrets);
    Ok(Options { action, values, secret })
}

/// Every option must be one the agent knows.
pub(crate) fn check(options: &Options, meta: &Metadata) -> Result<(), ParameterError> {
    match options.values.keys().find(|name| !meta.options.contains_key(*name)) {
        Some(name) => Err(ParameterError::Unknown {
            agent: meta.agent.clone(),
            name: name.clone(),
            suggestion: suggest(meta, name),
        }),
        None => Ok(()),
    }
}

/// The agent's standard input for `action`: one `name=value` per line in the names the agent
/// reads (flags as `name=1`).
pub(crate) fn stdin(options: &Options, meta: &Metadata, action: &str) -> String {
    let mut lines = vec![format!("action={action}")];
    for (name, value) in &options.values {
        let Some(known) = meta.options.get(name) else { continue };
        let value = if known.flag && value.is_empty() {
            "1"
        } else {
            value.as_str()
        };
        lines.push(format!("{}={value}", known.stdin_name));
    }
    lines.join("\n") + "\n"
}

/// Why a node's options cannot be used yet, or at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// A Secret the spec names does not exist (yet): the remediation waits for it (created late,
    /// or by a tool that syncs Secrets in), where medik8s's admission refuses the remediation.
    SecretMissing(String),
    /// Anything else: the remediation fails, and an escalating health check moves on.
    Invalid(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SecretMissing(why) | Self::Invalid(why) => f.write_str(why),
        }
    }
}

/// The options with secret values masked, for status, events and logs.
/// Debug output masks secrets too, so no `{:?}` can print one.
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe(self))
    }
}

pub(crate) fn describe(options: &Options) -> String {
    let shown: Vec<String> = options
        .values
        .iter()
        .map(|(k, v)| {
            if options.secret.contains(k) {
                format!("--{k}=<secret>")
            } else {
                format!("--{k}={v}")
            }
        })
        .collect();
    format!("--action={} {}", options.action.as_str(), shown.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::metadata::{REDFISH_SAMPLE, parse};
    use proptest::prelude::*;

    pub(super) fn seed(node: &str) -> Sources<'_> {
        Sources {
            node,
            shared: [
                ("--systems-uri", "/redfish/v1/Systems/1"),
                ("--hostname", "{{.NodeName}}.mgmt.kemo.labs"),
                ("--action", "reboot"),
                ("--username", "ansible"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            shared_secret: [("--password".to_owned(), "n0tPassword".to_owned())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_seed_template_renders_its_node_and_fails_on_hostname_like_fence_agents_4_12() {
        let options = build(&seed("node-1")).expect("builds");
        assert_eq!(options.values["hostname"], "node-1.mgmt.kemo.labs");
        assert_eq!(options.action, Action::Reboot);
        let meta = parse(REDFISH_SAMPLE).expect("metadata");
        let error = check(&options, &meta).expect_err("--hostname is unknown");
        assert_eq!(
            error.to_string(),
            "fence_redfish has no option --hostname; did you mean --ip?"
        );
    }

    #[test]
    fn secrets_go_to_stdin_and_never_into_descriptions() {
        let mut sources = seed("node-1");
        let host = sources.shared.remove("--hostname").expect("hostname");
        sources.shared.insert("--ip".into(), host);
        sources.shared.insert("--ssl-insecure".into(), String::new());
        let options = build(&sources).expect("builds");
        let meta = parse(REDFISH_SAMPLE).expect("metadata");
        check(&options, &meta).expect("every option known");
        let input = stdin(&options, &meta, "status");
        assert!(
            input.contains("action=status\n")
                && input.contains("password=n0tPassword\n")
                && input.contains("ssl_insecure=1\n"),
            "{input}"
        );
        assert!(!describe(&options).contains("n0tPassword"), "{}", describe(&options));
    }

    #[test]
    fn each_misconfiguration_is_its_own_error() {
        let mut duplicate = seed("n");
        duplicate.shared_secret.insert("--username".into(), "x".into());
        assert_eq!(
            build(&duplicate),
            Err(ParameterError::Duplicate {
                name: "--username".into()
            })
        );
        let mut fixed = seed("n");
        fixed.shared.insert("--hostname".into(), "bmc.example".into());
        assert_eq!(build(&fixed), Err(ParameterError::NothingNodeSpecific));
        let mut per_node = fixed.clone();
        per_node
            .per_node
            .insert("--ipport".into(), [("n".to_owned(), "6230".to_owned())].into());
        assert!(build(&per_node).is_ok(), "a node parameter is node-specific");
        let mut action = seed("n");
        action.shared.insert("--action".into(), "on".into());
        assert_eq!(build(&action), Err(ParameterError::Action("on".into())));
        let mut from_secret = seed("n");
        from_secret.shared_secret.insert("--action".into(), "reboot".into());
        assert_eq!(build(&from_secret), Err(ParameterError::Reserved("action".into())));
        let mut injected = seed("n");
        injected
            .shared_secret
            .insert("--password".into(), "pw\naction=reboot".into());
        assert_eq!(build(&injected), Err(ParameterError::Multiline("password".into())));
    }

    #[test]
    fn a_trailing_newline_is_dropped_and_spec_passwords_are_secrets_too() {
        let mut sources = seed("n");
        sources.shared_secret.insert("--password".into(), "pw\n".into());
        assert_eq!(build(&sources).expect("valid").values["password"], "pw");
        let mut in_spec = seed("n");
        in_spec.shared_secret.clear();
        in_spec.shared.insert("--password".into(), "hunter2".into());
        let options = build(&in_spec).expect("valid");
        assert!(options.secret.contains("password"));
        assert!(!format!("{options:?} {}", describe(&options)).contains("hunter2"));
    }

    proptest! {
        /// Precedence: a node parameter overrides the shared one; a node secret overrides the shared
        /// secret; the result never mentions a secret value outside stdin.
        #[test]
        fn precedence_and_secrecy(shared in "[a-z]{1,8}", node_value in "[a-z]{1,8}", secret in "[A-Z0-9]{12}", node_secret in "[A-Z0-9]{12}") {
            let sources = Sources {
                node: "n",
                shared: [("--ip".to_owned(), shared)].into(),
                per_node: [("--ip".to_owned(), [("n".to_owned(), node_value.clone())].into())].into(),
                shared_secret: [("--password".to_owned(), secret.clone())].into(),
                node_secret: [("--password".to_owned(), node_secret.clone())].into(),
            };
            let options = build(&sources).expect("builds");
            prop_assert_eq!(&options.values["ip"], &node_value);
            prop_assert_eq!(&options.values["password"], &node_secret);
            let described = describe(&options);
            prop_assert!(!described.contains(&secret) && !described.contains(&node_secret));
        }
    }
}

#[cfg(test)]
mod real_agents {
    use super::*;
    use crate::decide::metadata::parse;

    fn metadata_of(agent: &str) -> Metadata {
        let out = std::process::Command::new(agent)
            .args(["-o", "metadata"])
            .output()
            .expect("the fence agents are installed (make setup)");
        parse(&String::from_utf8_lossy(&out.stdout)).expect("metadata parses")
    }

    #[test]
    fn the_installed_fence_redfish_rejects_the_seed_template_s_hostname() {
        let options = build(&super::tests::seed("node-1")).expect("builds");
        let error = check(&options, &metadata_of("fence_redfish")).expect_err("unknown option");
        assert_eq!(
            error.to_string(),
            "fence_redfish has no option --hostname; did you mean --ip?"
        );
    }

    #[test]
    fn the_installed_fence_ipmilan_knows_the_options_users_write() {
        let meta = metadata_of("fence_ipmilan");
        for option in ["ip", "username", "password", "lanplus", "ipport", "action"] {
            assert!(
                meta.options.contains_key(option),
                "--{option} missing from {:?}",
                meta.options.keys()
            );
        }
        assert!(meta.options["lanplus"].flag);
    }
}
