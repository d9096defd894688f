//! The data witness: reads what the writer (the stateful stand-in on real nodes) synced to its
//! volume and finds what "never two writers" and "nothing synced is lost" forbid, from the data
//! alone. A record is one whole line `<instance> <sequence> <unix nanoseconds>`; the instance is
//! the writing pod's UID; each instance goes on from the sequence of the last record it found.
//!
//! - **Two writers**: after a new instance's first record, a record of an older instance.
//! - **A lost record**: a record read at one look is gone at a later one, or the sequence skips
//!   or repeats (each record is synced before the next is written, so the file holds every
//!   sequence number once, in order).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// One synced record.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Record {
    pub instance: String,
    pub sequence: u64,
    pub nanos: i64,
}

/// What the witness found wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum DataViolation {
    /// A record of `older` after `newer` wrote its first.
    TwoWriters { older: String, newer: String, record: u64 },
    /// A record seen at an earlier look is gone.
    Lost { instance: String, sequence: u64 },
    /// The sequence does not go on by one: `after` is followed by `next`.
    Gap { after: u64, next: u64 },
}

impl std::fmt::Display for DataViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TwoWriters { older, newer, record } => write!(
                f,
                "two writers: record {record} of instance {older} was written after instance {newer} had started writing"
            ),
            Self::Lost { instance, sequence } => {
                write!(
                    f,
                    "lost: record {sequence} of instance {instance} was synced, then was gone"
                )
            }
            Self::Gap { after, next } => write!(
                f,
                "the sequence jumps from {after} to {next}: a record was lost or written twice"
            ),
        }
    }
}

/// The file's whole records, in file order; a torn last line (the power went mid-write) is not
/// one, nor is a line that does not parse.
pub fn parse(text: &str) -> Vec<Record> {
    let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    whole
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let record = Record {
                instance: fields.next()?.to_owned(),
                sequence: fields.next()?.parse().ok()?,
                nanos: fields.next()?.parse().ok()?,
            };
            fields.next().is_none().then_some(record)
        })
        .collect()
}

/// The violations in one look at the records.
pub fn check(records: &[Record]) -> Vec<DataViolation> {
    let mut violations = Vec::new();
    // Instances in the order they started writing.
    let mut started: Vec<&str> = Vec::new();
    for (index, record) in records.iter().enumerate() {
        let instance = record.instance.as_str();
        match started.iter().position(|i| *i == instance) {
            None => started.push(instance),
            Some(position) if position + 1 < started.len() => violations.push(DataViolation::TwoWriters {
                older: instance.to_owned(),
                newer: started[started.len() - 1].to_owned(),
                record: record.sequence,
            }),
            Some(_) => {}
        }
        if let Some(previous) = index.checked_sub(1).map(|i| &records[i])
            && record.sequence != previous.sequence + 1
        {
            violations.push(DataViolation::Gap {
                after: previous.sequence,
                next: record.sequence,
            });
        }
    }
    violations
}

/// A witness of one volume's records file, looked at as often as a test likes.
#[derive(Debug)]
pub struct DataWitness {
    path: PathBuf,
    seen: BTreeSet<(String, u64)>,
}

impl DataWitness {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            seen: BTreeSet::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file: its records now, and every violation of this look (records seen at an
    /// earlier look and gone now among them).
    pub fn look(&mut self) -> (Vec<Record>, Vec<DataViolation>) {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let records = parse(&text);
        let now: BTreeSet<(String, u64)> = records.iter().map(|r| (r.instance.clone(), r.sequence)).collect();
        let mut violations: Vec<DataViolation> = self
            .seen
            .difference(&now)
            .map(|(instance, sequence)| DataViolation::Lost {
                instance: instance.clone(),
                sequence: *sequence,
            })
            .collect();
        violations.extend(check(&records));
        self.seen.extend(now);
        (records, violations)
    }
}

impl crate::Lab {
    /// A witness of the records the writer keeps on the volume bound to claim `namespace/claim`
    /// (its directory on the host, whichever real node it is published on).
    pub async fn data_witness(&self, namespace: &str, claim: &str) -> crate::Result<DataWitness> {
        use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
        use kube::Api;
        let claim_object = Api::<PersistentVolumeClaim>::namespaced(self.client(), namespace)
            .get(claim)
            .await?;
        let volume = claim_object
            .spec
            .and_then(|s| s.volume_name)
            .ok_or_else(|| crate::Error::Invalid(format!("claim {namespace}/{claim} is not bound yet")))?;
        let handle = Api::<PersistentVolume>::all(self.client())
            .get(&volume)
            .await?
            .spec
            .and_then(|s| s.csi)
            .map(|csi| csi.volume_handle)
            .ok_or_else(|| crate::Error::Invalid(format!("volume {volume} is not one of the lab's CSI volumes")))?;
        Ok(DataWitness::new(
            crate::real_node::csi::volumes_dir(self.dir())
                .join(handle)
                .join("records"),
        ))
    }

    /// The node the writer's pod (`vm/db-0`, of [`crate::workloads::WRITER_STATEFULSET`]) runs
    /// on, once it runs (and not on `not_on`).
    pub async fn writer_running(&self, not_on: Option<&str>, timeout: std::time::Duration) -> crate::Result<String> {
        use k8s_openapi::api::core::v1::Pod;
        let pods = kube::Api::<Pod>::namespaced(self.client(), "vm");
        crate::wait::until("db-0 running", timeout, || async {
            let Some(pod) = pods.get_opt("db-0").await? else {
                return Ok(None);
            };
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            Ok(node.filter(|n| running && Some(n.as_str()) != not_on))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(instance: &str, sequence: u64) -> Record {
        Record {
            instance: instance.into(),
            sequence,
            nanos: sequence as i64,
        }
    }

    fn text(records: &[Record]) -> String {
        records
            .iter()
            .map(|r| format!("{} {} {}\n", r.instance, r.sequence, r.nanos))
            .collect()
    }

    #[test]
    fn one_writer_after_another_is_fine_and_a_torn_line_is_no_record() {
        let file = format!("{}b 4 4", text(&[record("a", 1), record("a", 2), record("b", 3)]));
        let records = parse(&file);
        assert_eq!(records.len(), 3);
        assert!(check(&records).is_empty());
    }

    #[test]
    fn an_older_instance_writing_after_a_newer_one_started_is_two_writers() {
        let records = [record("a", 1), record("b", 2), record("a", 3)];
        assert_eq!(
            check(&records),
            vec![DataViolation::TwoWriters {
                older: "a".into(),
                newer: "b".into(),
                record: 3
            }]
        );
    }

    #[test]
    fn a_skipped_or_repeated_sequence_is_found() {
        assert_eq!(
            check(&[record("a", 1), record("a", 3)]),
            vec![DataViolation::Gap { after: 1, next: 3 }]
        );
        assert_eq!(
            check(&[record("a", 1), record("b", 1)]),
            vec![DataViolation::Gap { after: 1, next: 1 }]
        );
    }

    #[test]
    fn a_record_gone_since_an_earlier_look_is_lost() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("records");
        std::fs::write(&path, text(&[record("a", 1), record("a", 2)])).expect("write");
        let mut witness = DataWitness::new(&path);
        assert!(witness.look().1.is_empty());
        std::fs::write(&path, text(&[record("a", 1)])).expect("write");
        assert_eq!(
            witness.look().1,
            vec![DataViolation::Lost {
                instance: "a".into(),
                sequence: 2
            }]
        );
    }

    proptest! {
        /// Writers taking turns, each going on from the last record, never violate anything.
        #[test]
        fn writers_taking_turns_are_never_a_violation(turns in proptest::collection::vec(1usize..20, 1..8)) {
            let mut records = Vec::new();
            for (instance, count) in turns.iter().enumerate() {
                for _ in 0..*count {
                    let sequence = records.len() as u64 + 1;
                    records.push(record(&format!("i{instance}"), sequence));
                }
            }
            prop_assert!(check(&parse(&text(&records))).is_empty());
        }

        /// Any record of an earlier writer put after a later writer's first is found.
        #[test]
        fn a_late_record_of_an_earlier_writer_is_always_found(first in 1usize..10, second in 1usize..10) {
            let mut records: Vec<Record> = (1..=first as u64).map(|s| record("a", s)).collect();
            records.extend((1..=second as u64).map(|s| record("b", first as u64 + s)));
            records.push(record("a", (first + second) as u64 + 1));
            let found = check(&records);
            let is_two_writers = |v: &DataViolation| matches!(v, DataViolation::TwoWriters { .. });
            prop_assert!(found.iter().any(is_two_writers));
        }
    }
}
