//! What a watch event says about the contact with the API server (see decide::outage).

use kube::runtime::watcher;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Evidence {
    /// The API server answered from etcd: something was listed or changed.
    Answered,
    /// The API server could not be reached, failed, or was overloaded.
    Lost,
    /// Neither: a relist starting (with the default list-then-watch strategy no request is made
    /// yet), or a refusal the API server gives without etcd (403, 404, 410 Gone, a bad object).
    Nothing,
}

pub(super) fn evidence<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> Evidence {
    match event {
        Ok(watcher::Event::Init) => Evidence::Nothing,
        Ok(_) => Evidence::Answered,
        Err(watcher::Error::WatchError(status)) => by_status(status.code),
        Err(
            watcher::Error::InitialListFailed(error)
            | watcher::Error::WatchStartFailed(error)
            | watcher::Error::WatchFailed(error),
        ) => of_error(error),
        Err(watcher::Error::NoResourceVersion) => Evidence::Nothing,
    }
}

/// What a failed request says.
pub(super) fn of_error(error: &kube::Error) -> Evidence {
    match error {
        kube::Error::Api(status) => by_status(status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => Evidence::Lost,
        _ => Evidence::Nothing,
    }
}

fn by_status(code: u16) -> Evidence {
    match code {
        429 | 500..=599 => Evidence::Lost,
        _ => Evidence::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    type Event = Result<watcher::Event<()>, watcher::Error>;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status {
            code,
            ..Status::default()
        })
    }

    #[test]
    fn only_failures_for_want_of_the_api_are_losses() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost: Vec<Event> = vec![
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status(504)))),
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status(429)))),
            Err(watcher::Error::WatchFailed(kube::Error::ReadEvents(io()))),
            Err(watcher::Error::WatchError(status(500))),
        ];
        for event in &lost {
            assert_eq!(evidence(event), Evidence::Lost, "{event:?}");
        }
        let nothing: Vec<Event> = vec![
            Ok(watcher::Event::Init),
            Err(watcher::Error::WatchError(status(410))),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status(403)))),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status(410)))),
            Err(watcher::Error::NoResourceVersion),
        ];
        for event in &nothing {
            assert_eq!(evidence(event), Evidence::Nothing, "{event:?}");
        }
        for event in [
            Ok(watcher::Event::InitApply(())),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(())),
            Ok(watcher::Event::Delete(())),
        ] {
            assert_eq!(evidence(&event), Evidence::Answered);
        }
    }
}
