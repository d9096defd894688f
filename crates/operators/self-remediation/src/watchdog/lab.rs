//! The lab's watchdog: a unix socket the lab serves from the host. `timeout <ms>` on connect,
//! then `k` to feed, `V` to disarm, `R` to reset now.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::PathBuf,
    time::Duration,
};

use super::{Watchdog, WatchdogError};

pub struct LabWatchdog {
    path: PathBuf,
    stream: UnixStream,
    timeout: Duration,
}

impl LabWatchdog {
    pub fn connect(path: PathBuf) -> Result<Self, WatchdogError> {
        let io = |source| WatchdogError::Io {
            path: path.clone(),
            source,
        };
        let stream = UnixStream::connect(&path).map_err(io)?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
        let mut greeting = String::new();
        BufReader::new(stream.try_clone().map_err(io)?)
            .read_line(&mut greeting)
            .map_err(io)?;
        let timeout = greeting
            .strip_prefix("timeout ")
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| WatchdogError::Unusable {
                path: path.clone(),
                why: format!("unexpected greeting {greeting:?}"),
            })?;
        Ok(Self { path, stream, timeout })
    }

    fn send(&mut self, line: &[u8]) -> Result<(), WatchdogError> {
        self.stream.write_all(line).map_err(|source| WatchdogError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

impl Watchdog for LabWatchdog {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn feed(&mut self) -> Result<(), WatchdogError> {
        self.send(b"k\n")
    }

    fn disarm(&mut self) -> Result<(), WatchdogError> {
        self.send(b"V\n")
    }

    fn reboot_now(&mut self) -> Result<(), WatchdogError> {
        self.send(b"R\n")
    }

    fn describe(&self) -> String {
        format!("lab watchdog {} ({}s)", self.path.display(), self.timeout.as_secs_f64())
    }
}
