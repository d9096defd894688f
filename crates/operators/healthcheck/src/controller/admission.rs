//! The `/validate-nodehealthcheck` webhook: a DELETE is judged on the status of the object being
//! deleted, which the API server sends along, so there is nothing to read.

use nodemedic_api::healthcheck::NodeHealthCheck;
use nodemedic_kube::admission::{self, Request, Verdict};

use crate::decide::admission::on_delete;

pub const PATH: &str = "/validate-nodehealthcheck";

pub fn validate(request: &Request) -> Verdict {
    if request.operation != kube::core::admission::Operation::Delete {
        return Verdict::Allowed;
    }
    match admission::object::<NodeHealthCheck>(request) {
        Ok(check) => on_delete(&request.name, check.status.as_ref()),
        Err(why) => Verdict::Unchecked(format!(
            "nodemedic could not check NodeHealthCheck {} for remediations in flight: {why}",
            request.name
        )),
    }
}
