//! The webhook's own certificates, no cert-manager needed: a CA kept in a Secret in the
//! controller's namespace (so every replica, and every restart, serves under the one CA the
//! ValidatingWebhookConfiguration trusts) and a serving certificate each replica issues itself.

use std::{collections::BTreeMap, net::IpAddr, str::FromStr, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

use crate::{
    CallContext, Error, Result,
    pki::{Authority, Leaf, Pem},
};

/// The Secret holding the webhook CA (type kubernetes.io/tls).
pub const CA_SECRET: &str = "nodemedic-webhook-ca";
const CA_DAYS: i64 = 3650;
const LEAF_DAYS: i64 = 365;
/// Serving certificates are short-lived next to their validity: a replica that ran for a year
/// must not serve an expired one.
const LEAF_RENEWAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A name the serving certificate is also valid for (`--webhook-extra-san`): a DNS name, or an
/// IP address (e.g. 127.0.0.1 when the API server calls the webhook by URL on the same host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum San {
    Dns(String),
    Ip(IpAddr),
}

impl FromStr for San {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(ip) = s.parse() {
            return Ok(Self::Ip(ip));
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if s.len() <= 253 && s.split('.').all(label_ok) {
            Ok(Self::Dns(s.to_owned()))
        } else {
            Err(format!(
                "{s:?} is neither an IP address nor a DNS name (lowercase letters, digits, '-' and '.'), e.g. 127.0.0.1 or webhook.example.com"
            ))
        }
    }
}

/// The names the serving certificate covers: the Service's in-cluster DNS names (the API server
/// calls `<service>.<namespace>.svc`), then the extra ones.
pub(crate) fn serving_names(service: &str, namespace: &str, extra: &[San]) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    let mut ips = Vec::new();
    for name in extra {
        match name {
            San::Dns(d) if !dns.contains(d) => dns.push(d.clone()),
            San::Ip(ip) if !ips.contains(ip) => ips.push(*ip),
            _ => {}
        }
    }
    (dns, ips)
}

/// Whether to issue a new serving certificate: none yet, the CA in the Secret changed (someone
/// deleted it and a replica made a new one), or the current one is due for renewal.
pub(crate) fn reissue(serving_ca: Option<&str>, secret_ca: &str, leaf_age: Option<Duration>) -> bool {
    serving_ca != Some(secret_ca) || leaf_age.is_none_or(|age| age >= LEAF_RENEWAL)
}

/// The CA's PEM from the Secret's data.
pub(crate) fn ca_from_secret(secret: &Secret) -> Result<Pem, String> {
    let data = secret.data.clone().unwrap_or_default();
    let field = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| format!("Secret {CA_SECRET} has no {k}; delete it and the controller makes a new CA"))
    };
    Ok(Pem {
        cert: field("tls.crt")?,
        key: field("tls.key")?,
    })
}

/// The CA from its Secret, made and stored first if there is none. Replicas starting together
/// race to create it; the loser reads the winner's.
pub async fn authority(client: &Client, namespace: &str) -> Result<Pem> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let read = || async {
        secrets
            .get_opt(CA_SECRET)
            .await
            .with_context(|| format!("reading Secret {namespace}/{CA_SECRET}"))
    };
    if let Some(secret) = read().await? {
        return ca_from_secret(&secret).map_err(Error::Webhook);
    }
    let made = Authority::new("nodemedic admission webhook CA", CA_DAYS).map_err(|e| Error::Webhook(e.to_string()))?;
    let pem = made.pem().clone();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), ByteString(pem.cert.clone().into_bytes())),
            ("tls.key".to_owned(), ByteString(pem.key.clone().into_bytes())),
        ])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = CA_SECRET, "created the admission webhook CA");
            Ok(pem)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => match read().await? {
            Some(secret) => ca_from_secret(&secret).map_err(Error::Webhook),
            None => Err(Error::Webhook(format!(
                "Secret {namespace}/{CA_SECRET} existed and then did not; trying again"
            ))),
        },
        Err(e) => Err(Error::call(format!("creating Secret {namespace}/{CA_SECRET}"), e)),
    }
}

/// A serving certificate for `dns` and `ips`, signed by the CA.
pub fn serving(ca: &Pem, dns: &[String], ips: &[IpAddr]) -> Result<Pem> {
    let authority = Authority::from_pem(ca).map_err(|e| {
        Error::Webhook(format!(
            "Secret {CA_SECRET} does not hold a usable CA ({e}); delete it and the controller makes a new one"
        ))
    })?;
    let leaf = Leaf {
        common_name: dns.first().cloned().unwrap_or_else(|| "nodemedic-webhook".into()),
        dns_names: dns.to_vec(),
        ips: ips.to_vec(),
        server: true,
        valid_days: LEAF_DAYS,
        ..Default::default()
    };
    authority.issue(&leaf).map_err(|e| Error::Webhook(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_service_names_come_first_then_the_extra_ones_once() {
        let extra: Vec<San> = ["127.0.0.1", "webhook.example.com", "127.0.0.1", "::1"]
            .iter()
            .map(|s| s.parse().expect("valid"))
            .collect();
        let (dns, ips) = serving_names("nodemedic-webhook", "workload-availability", &extra);
        assert_eq!(
            dns,
            [
                "nodemedic-webhook.workload-availability.svc",
                "nodemedic-webhook.workload-availability.svc.cluster.local",
                "webhook.example.com"
            ]
        );
        assert_eq!(
            ips,
            ["127.0.0.1".parse::<IpAddr>().expect("ip"), "::1".parse().expect("ip")]
        );
    }

    #[test]
    fn a_bad_extra_name_says_what_is_accepted() {
        for bad in ["", "Web_hook", "-a.b", "a..b", "http://x"] {
            let error = bad.parse::<San>().expect_err(bad);
            assert!(error.contains("neither an IP address nor a DNS name"), "{error}");
        }
    }

    #[test]
    fn a_secret_without_its_key_says_how_to_recover() {
        let secret = Secret {
            data: Some(BTreeMap::from([("tls.crt".to_owned(), ByteString(b"x".to_vec()))])),
            ..Default::default()
        };
        let error = ca_from_secret(&secret).expect_err("no key");
        assert!(error.contains("no tls.key") && error.contains("delete it"), "{error}");
    }

    #[test]
    fn a_serving_certificate_is_signed_by_the_stored_ca_for_the_names() {
        let ca = Authority::new("test", 1).expect("ca").pem().clone();
        let (dns, ips) = serving_names("svc", "ns", &["127.0.0.1".parse().expect("ip")]);
        let leaf = serving(&ca, &dns, &ips).expect("issued");
        assert!(leaf.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let broken = Pem {
            cert: "junk".into(),
            key: ca.key,
        };
        let error = serving(&broken, &dns, &ips).expect_err("junk CA").to_string();
        assert!(error.contains("does not hold a usable CA"), "{error}");
    }

    #[test]
    fn renewal_follows_the_ca_and_the_age() {
        assert!(reissue(None, "ca", None));
        assert!(!reissue(Some("ca"), "ca", Some(Duration::from_secs(60))));
        assert!(reissue(Some("old"), "ca", Some(Duration::from_secs(60))));
        assert!(reissue(Some("ca"), "ca", Some(LEAF_RENEWAL)));
    }

    proptest! {
        /// A certificate is never kept past its renewal age or under another CA than the stored one.
        #[test]
        fn never_keeps_a_stale_certificate(serving in proptest::option::of("[ab]"), secret in "[ab]", age in proptest::option::of(0u64..2 * LEAF_RENEWAL.as_secs())) {
            let age = age.map(Duration::from_secs);
            let keep = !reissue(serving.as_deref(), &secret, age);
            if keep {
                prop_assert_eq!(serving.as_deref(), Some(secret.as_str()));
                prop_assert!(age.is_some_and(|a| a < LEAF_RENEWAL));
            }
        }

        /// Every extra name ends up in the certificate, whatever the mix.
        #[test]
        fn every_extra_name_is_covered(octets in proptest::collection::vec(any::<u8>(), 0..5), names in proptest::collection::vec("[a-z][a-z0-9]{0,8}(\\.[a-z]{1,5}){0,2}", 0..5)) {
            let mut extra: Vec<San> = octets.iter().map(|o| San::Ip(IpAddr::from([10, 0, 0, *o]))).collect();
            extra.extend(names.iter().map(|n| n.parse::<San>().expect("generated names are valid")));
            let (dns, ips) = serving_names("s", "n", &extra);
            for name in &extra {
                match name {
                    San::Dns(d) => prop_assert!(dns.contains(d)),
                    San::Ip(ip) => prop_assert!(ips.contains(ip)),
                }
            }
            prop_assert_eq!(&dns[..2], &["s.n.svc".to_owned(), "s.n.svc.cluster.local".to_owned()]);
        }
    }
}
