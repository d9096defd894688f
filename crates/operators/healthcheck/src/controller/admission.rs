//! The `/validate-nodehealthcheck` webhook: a DELETE is judged on the status of the object being
//! deleted, an UPDATE on the old object's status and what the new one changes; both come with
//! the request, so there is nothing to read.

use kube::core::admission::Operation;
use nodemedic_api::healthcheck::NodeHealthCheck;
use nodemedic_kube::admission::{self, Request, Verdict};

use crate::decide::admission::{on_delete, on_update};

pub const PATH: &str = "/validate-nodehealthcheck";

pub fn validate(request: &Request) -> Verdict {
    let unchecked = |why: String| {
        Verdict::Unchecked(format!(
            "nodemedic could not check NodeHealthCheck {} for remediations in flight: {why}",
            request.name
        ))
    };
    match request.operation {
        Operation::Delete => match admission::object::<NodeHealthCheck>(request) {
            Ok(check) => on_delete(&request.name, check.status.as_ref()),
            Err(why) => unchecked(why),
        },
        Operation::Update => match (
            admission::old_object::<NodeHealthCheck>(request),
            admission::object::<NodeHealthCheck>(request),
        ) {
            (Ok(Some(old)), Ok(new)) => on_update(&request.name, &old, &new),
            (Ok(None), _) => Verdict::Allowed,
            (Err(why), _) | (_, Err(why)) => unchecked(why),
        },
        _ => Verdict::Allowed,
    }
}
