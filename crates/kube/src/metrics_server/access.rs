//! Who may read the metrics: the caller's bearer token authenticated by the API server
//! (TokenReview) and the caller authorized for `get` on the path (SubjectAccessReview), as
//! controller-runtime's and the API server's own metrics endpoints do. Grant it with a
//! ClusterRole rule `nonResourceURLs: ["/metrics"], verbs: ["get"]` (the chart's
//! `nodemedic-metrics-reader`).
//!
//! Answers are kept for a short while, so a Prometheus scraping every few seconds costs the API
//! server two reviews per token per [`ALLOWED_FOR`], not two per scrape.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};

/// How long an answer is reused: an allowed caller's, and a refused one's (a revoked grant or a
/// new one takes effect within this).
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Answers kept at most; past it the oldest half goes (a scraper's few tokens fit many times).
const KEPT: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Allowed,
    /// No token, or one the API server does not know: 401.
    Unauthenticated(String),
    /// Known, not allowed: 403.
    Forbidden(String),
    /// The API server could not be asked: 503, and nothing is kept.
    Unavailable(String),
}

impl Decision {
    fn kept_for(&self) -> Option<Duration> {
        match self {
            Self::Allowed => Some(ALLOWED_FOR),
            Self::Unauthenticated(_) | Self::Forbidden(_) => Some(REFUSED_FOR),
            Self::Unavailable(_) => None,
        }
    }
}

/// The token from an `Authorization` header's value, if it is a bearer token.
pub(crate) fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Answers reused while fresh, keyed by a digest of the token and the path (never the token).
#[derive(Default)]
pub(crate) struct Kept(Mutex<HashMap<[u8; 32], (Instant, Decision)>>);

impl Kept {
    fn key(token: &str, path: &str) -> [u8; 32] {
        let mut digest = Sha256::new();
        digest.update(token.as_bytes());
        digest.update([0]);
        digest.update(path.as_bytes());
        digest.finalize().into()
    }

    pub(crate) fn get(&self, token: &str, path: &str, now: Instant) -> Option<Decision> {
        let kept = self.0.lock().ok()?;
        let (at, decision) = kept.get(&Self::key(token, path))?;
        let fresh = decision.kept_for().is_some_and(|d| now.duration_since(*at) < d);
        fresh.then(|| decision.clone())
    }

    pub(crate) fn put(&self, token: &str, path: &str, now: Instant, decision: &Decision) {
        if decision.kept_for().is_none() {
            return;
        }
        let Ok(mut kept) = self.0.lock() else { return };
        if kept.len() >= KEPT {
            let mut ages: Vec<Instant> = kept.values().map(|(at, _)| *at).collect();
            ages.sort();
            let cut = ages[ages.len() / 2];
            kept.retain(|_, (at, _)| *at > cut);
        }
        kept.insert(Self::key(token, path), (now, decision.clone()));
    }
}

/// Asks the API server who the token is and whether they may `get` the path.
pub(crate) struct Guard {
    client: Client,
    kept: Kept,
}

impl Guard {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            kept: Kept::default(),
        }
    }

    pub(crate) async fn decide(&self, authorization: Option<&str>, path: &str) -> Decision {
        let Some(token) = bearer(authorization) else {
            return Decision::Unauthenticated("send a ServiceAccount token: Authorization: Bearer <token>".into());
        };
        if let Some(kept) = self.kept.get(token, path, Instant::now()) {
            return kept;
        }
        let decision = self.ask(token, path).await;
        self.kept.put(token, path, Instant::now(), &decision);
        decision
    }

    async fn ask(&self, token: &str, path: &str) -> Decision {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) => reviewed.status.unwrap_or_default(),
            Err(e) => return Decision::Unavailable(format!("authenticating the token (TokenReview): {e}")),
        };
        let user = match (reviewed.authenticated, reviewed.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Decision::Unauthenticated(
                    reviewed
                        .error
                        .unwrap_or_else(|| "the API server does not know this token".into()),
                );
            }
        };
        self.authorize(user, path).await
    }

    async fn authorize(&self, user: UserInfo, path: &str) -> Decision {
        let name = user.username.clone().unwrap_or_default();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) if reviewed.status.as_ref().is_some_and(|s| s.allowed) => Decision::Allowed,
            Ok(_) => Decision::Forbidden(format!(
                "{name} may not get {path}: bind it to a ClusterRole allowing nonResourceURLs [\"{path}\"], verbs [\"get\"] (the chart's nodemedic-metrics-reader)"
            )),
            Err(e) => Decision::Unavailable(format!("authorizing {name} (SubjectAccessReview): {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn answers_are_reused_while_fresh_and_an_unavailable_api_server_is_asked_again() {
        let kept = Kept::default();
        let now = Instant::now();
        kept.put("t", "/metrics", now, &Decision::Allowed);
        assert_eq!(
            kept.get("t", "/metrics", now + ALLOWED_FOR / 2),
            Some(Decision::Allowed)
        );
        assert_eq!(kept.get("t", "/metrics", now + ALLOWED_FOR), None);
        assert_eq!(kept.get("t", "/other", now), None);
        assert_eq!(kept.get("u", "/metrics", now), None);
        let refused = Decision::Forbidden("no".into());
        kept.put("u", "/metrics", now, &refused);
        assert_eq!(kept.get("u", "/metrics", now + REFUSED_FOR / 2), Some(refused));
        assert_eq!(kept.get("u", "/metrics", now + REFUSED_FOR), None);
        kept.put("v", "/metrics", now, &Decision::Unavailable("down".into()));
        assert_eq!(kept.get("v", "/metrics", now), None);
    }

    #[test]
    fn the_kept_answers_stay_bounded() {
        let kept = Kept::default();
        let start = Instant::now();
        for i in 0..(KEPT * 3) {
            kept.put(
                &format!("token-{i}"),
                "/metrics",
                start + Duration::from_millis(i as u64),
                &Decision::Allowed,
            );
        }
        assert!(kept.0.lock().expect("lock").len() <= KEPT);
        let last = start + Duration::from_millis((KEPT * 3 - 1) as u64);
        assert_eq!(
            kept.get(&format!("token-{}", KEPT * 3 - 1), "/metrics", last),
            Some(Decision::Allowed)
        );
    }
}
