//! AdmissionReview (admission.k8s.io/v1) in and out, and the verdict an operator's admission
//! decision returns. Pure: the webhook server ([`crate::webhook`]) does the I/O.

use kube::core::{
    DynamicObject, Status,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
};

/// What the API server sends a validating webhook.
pub type Request = AdmissionRequest<DynamicObject>;

/// An admission decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Refused; the message goes to whoever made the request, so it says what to do instead.
    Denied(String),
    /// Let through without the check, with this warning to the requester: the facts could not
    /// be read. A webhook that is down lets everything through (failurePolicy Ignore), so one
    /// that cannot check must not be stricter than that.
    Unchecked(String),
}

/// The request inside an AdmissionReview body.
pub fn parse(body: &[u8]) -> Result<Request, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| {
        format!("the body is not an AdmissionReview (admission.k8s.io/v1; register the webhook with admissionReviewVersions [v1]): {e}")
    })?;
    review
        .try_into()
        .map_err(|_| "the AdmissionReview has no request: only the API server's reviews are answered".to_owned())
}

/// The AdmissionReview answering `request` with `verdict`.
pub(crate) fn respond(request: &Request, verdict: &Verdict) -> AdmissionReview<DynamicObject> {
    let mut response = AdmissionResponse::from(request);
    match verdict {
        Verdict::Allowed => {}
        Verdict::Denied(message) => {
            response = response.deny(message);
            // Without a code the API server answers 403 anyway; with a reason clients can match it.
            response.result = Status::failure(message, "Forbidden").with_code(403);
        }
        Verdict::Unchecked(why) => response.warnings = Some(vec![why.clone()]),
    }
    response.into_review()
}

/// The object a CREATE or UPDATE makes, or the one a DELETE removes, as `K`.
pub fn object<K>(request: &Request) -> Result<K, String>
where
    K: kube::Resource + serde::de::DeserializeOwned,
{
    let object = request
        .object
        .clone()
        .or_else(|| request.old_object.clone())
        .ok_or("the request carries no object")?;
    object
        .try_parse()
        .map_err(|e| format!("the object is not a valid {}: {e}", request.kind.kind))
}

/// The object as it was before an UPDATE or DELETE, as `K`.
pub fn old_object<K>(request: &Request) -> Result<Option<K>, String>
where
    K: kube::Resource + serde::de::DeserializeOwned,
{
    request
        .old_object
        .clone()
        .map(|o| o.try_parse())
        .transpose()
        .map_err(|e| format!("the old object is not a valid {}: {e}", request.kind.kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::Operation;
    use serde_json::json;

    fn review(operation: &str, object: serde_json::Value, old: serde_json::Value) -> Vec<u8> {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
                "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
                "name": "nm-1", "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object, "oldObject": old, "dryRun": false
            }
        })
        .to_string()
        .into_bytes()
    }

    fn nm(node: &str) -> serde_json::Value {
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance", "metadata": {"name": "nm-1"}, "spec": {"nodeName": node}})
    }

    #[test]
    fn a_denial_keeps_the_uid_and_says_why_with_403() {
        let request = parse(&review("CREATE", nm("w1"), serde_json::Value::Null)).expect("parses");
        assert_eq!(request.operation, Operation::Create);
        let answer = serde_json::to_value(respond(&request, &Verdict::Denied("no: do this".into()))).expect("json");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["message"], "no: do this");
        assert_eq!(answer["response"]["status"]["code"], 403);
    }

    #[test]
    fn allowed_and_unchecked_let_the_request_through() {
        let request = parse(&review("UPDATE", nm("w1"), nm("w1"))).expect("parses");
        let allowed = serde_json::to_value(respond(&request, &Verdict::Allowed)).expect("json");
        assert_eq!(allowed["response"]["allowed"], true);
        let unchecked =
            serde_json::to_value(respond(&request, &Verdict::Unchecked("could not read".into()))).expect("json");
        assert_eq!(unchecked["response"]["allowed"], true);
        assert_eq!(unchecked["response"]["warnings"], json!(["could not read"]));
    }

    #[test]
    fn the_objects_parse_as_their_kind() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let cm =
            |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": v}});
        let request = parse(&review("DELETE", serde_json::Value::Null, cm("old"))).expect("parses");
        assert_eq!(
            object::<ConfigMap>(&request).expect("old object").data.expect("data")["k"],
            "old"
        );
        let request = parse(&review("UPDATE", cm("new"), cm("old"))).expect("parses");
        assert_eq!(
            object::<ConfigMap>(&request).expect("object").data.expect("data")["k"],
            "new"
        );
        let old = old_object::<ConfigMap>(&request).expect("parses").expect("present");
        assert_eq!(old.data.expect("data")["k"], "old");
        let broken = parse(&review(
            "CREATE",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": 7}),
            serde_json::Value::Null,
        ))
        .expect("parses");
        let error = object::<ConfigMap>(&broken).expect_err("data is not a map");
        assert!(error.contains("not a valid NodeMaintenance"), "{error}");
    }

    #[test]
    fn bad_bodies_say_what_was_expected() {
        let error =
            parse(br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#).expect_err("no request");
        assert!(error.contains("no request"), "{error}");
        let error = parse(b"not json").expect_err("not json");
        assert!(error.contains("admissionReviewVersions [v1]"), "{error}");
    }
}
