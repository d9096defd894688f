//! Which source a report's figures come from: the commit checked out where `nodemedic-lab` ran,
//! and whether the tracked files differed from it (a dirty tree's figures are not that commit's).
//! Read from `git` in the working directory when the run starts; outside a checkout, or without
//! `git`, every field says "unknown" rather than failing the run.

use std::process::Command;

use serde::Serialize;

/// The state of the tracked files against the commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tree {
    Clean,
    Dirty,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The commit checked out (short hash), or "unknown".
    pub commit: String,
    pub tree: Tree,
    /// The tracked files changed from the commit, staged or not (empty unless dirty).
    pub changed_files: Vec<String>,
}

/// How many changed files a markdown header names before it counts the rest.
const NAMED_IN_HEADER: usize = 10;

impl Source {
    /// The working directory's checkout.
    pub fn of_working_directory() -> Source {
        let commit = git(&["rev-parse", "--short", "HEAD"]).map(|out| out.trim().to_owned());
        let status = git(&["status", "--porcelain=v1", "--untracked-files=no"]);
        match (commit, status) {
            (Some(commit), Some(status)) => Source::from_status(commit, &status),
            (Some(commit), None) => Source {
                commit,
                tree: Tree::Unknown,
                changed_files: Vec::new(),
            },
            (None, _) => Source {
                commit: "unknown".into(),
                tree: Tree::Unknown,
                changed_files: Vec::new(),
            },
        }
    }

    /// `commit` with the tree `git status --porcelain=v1` described.
    pub fn from_status(commit: String, porcelain: &str) -> Source {
        let changed_files: Vec<String> = porcelain.lines().filter_map(changed_path).collect();
        Source {
            commit,
            tree: if changed_files.is_empty() {
                Tree::Clean
            } else {
                Tree::Dirty
            },
            changed_files,
        }
    }

    /// For a report's header: "abc1234 (clean tree)", "abc1234 with uncommitted changes to 2
    /// tracked files (a.rs, b.rs): a dirty tree", "unknown".
    pub fn describe(&self) -> String {
        match self.tree {
            Tree::Clean => format!("{} (clean tree)", self.commit),
            Tree::Unknown => format!("{} (tree state unknown)", self.commit),
            Tree::Dirty => {
                let n = self.changed_files.len();
                let mut named = self
                    .changed_files
                    .iter()
                    .take(NAMED_IN_HEADER)
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                if n > NAMED_IN_HEADER {
                    named.push_str(&format!(" and {} more", n - NAMED_IN_HEADER));
                }
                let files = if n == 1 { "file" } else { "files" };
                format!(
                    "{} **dirty**: uncommitted changes to {n} tracked {files} ({named})",
                    self.commit
                )
            }
        }
    }

    /// The fields, for a report's JSON object.
    pub fn json_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        }
    }
}

/// The path of one line of `git status --porcelain=v1` (`XY path`, or `XY from -> to` for a
/// rename: the new path).
fn changed_path(line: &str) -> Option<String> {
    let path = line.get(3..)?.trim();
    let path = path.rsplit(" -> ").next().unwrap_or(path);
    (!path.is_empty()).then(|| path.to_owned())
}

/// `git args` in the working directory: its standard output when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_change_is_a_clean_tree() {
        let s = Source::from_status("abc1234".into(), "");
        assert_eq!(s.tree, Tree::Clean);
        assert_eq!(s.describe(), "abc1234 (clean tree)");
        assert_eq!(
            serde_json::Value::Object(s.json_fields()),
            serde_json::json!({"commit": "abc1234", "tree": "clean", "changedFiles": []})
        );
    }

    #[test]
    fn staged_unstaged_and_renamed_files_make_it_dirty_and_are_named() {
        let status = " M testing/harness/src/lib.rs\nM  Makefile\nR  old.rs -> new.rs\n D gone.md\n";
        let s = Source::from_status("abc1234".into(), status);
        assert_eq!(s.tree, Tree::Dirty);
        assert_eq!(
            s.changed_files,
            ["testing/harness/src/lib.rs", "Makefile", "new.rs", "gone.md"]
        );
        let header = s.describe();
        assert!(
            header.starts_with("abc1234 **dirty**: uncommitted changes to 4 tracked files"),
            "{header}"
        );
        assert!(header.contains("`new.rs`"), "{header}");
    }

    #[test]
    fn a_long_list_is_cut_in_the_header_but_kept_whole() {
        let status: String = (0..12).map(|i| format!(" M f{i}.rs\n")).collect();
        let s = Source::from_status("abc1234".into(), &status);
        assert_eq!(s.changed_files.len(), 12);
        assert!(s.describe().ends_with(" and 2 more)"), "{}", s.describe());
    }
}
