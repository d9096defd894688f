//! A lab leaves nothing behind: not when dropped, not when its test panics.

use nodemedic_lab::{BmcOptions, Lab, LabConfig};

/// What of the lab `id` is still on the host: namespaces, links, processes, mounts, tmpfs.
pub(crate) fn leftovers(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    found.extend(
        String::from_utf8_lossy(&netns.stdout)
            .lines()
            .filter(|l| l.starts_with(&format!("nm{id}-")))
            .map(|l| format!("netns {l}")),
    );
    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip");
    found.extend(
        String::from_utf8_lossy(&links.stdout)
            .lines()
            .filter(|l| l.contains(&format!(" nm{id}")))
            .map(|l| format!("link {l}")),
    );
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&format!("nodemedic-labs/{id}")) || cmdline.contains(&format!("nodemedic-{id}")) {
            found.push(format!("process {cmdline}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    found.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&format!("/nodemedic-labs/{id}/")))
            .map(|l| format!("mount {l}")),
    );
    if std::path::Path::new(&format!("/dev/shm/nodemedic-{id}")).exists() {
        found.push("tmpfs directory".into());
    }
    // Every lab's processes share its cpu cgroup; a real node's are in the freezer's too.
    for hierarchy in ["cpu", "freezer"] {
        let cgroup = format!("/sys/fs/cgroup/{hierarchy}/nodemedic/{id}");
        if std::path::Path::new(&cgroup).exists() {
            found.push(format!("cgroup {cgroup}"));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lab_removes_every_process_namespace_bridge_and_file() {
    crate::support::logs();
    // With BMCs (processes on the host, addresses on the management bridge), one of them hung.
    let lab = Lab::start(LabConfig::workers(2).with_bmcs(BmcOptions::default()))
        .await
        .expect("lab starts");
    lab.partition(&["node-1"]).await.expect("partition");
    lab.hang_bmc("node-2").await.expect("hang a BMC");
    let id = lab.id().to_owned();
    let shared = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/nodemedic/{id}/host/cgroup.procs"));
    assert!(
        shared.is_ok_and(|pids| !pids.trim().is_empty()),
        "the lab's processes run in the lab's CPU share"
    );
    assert!(!leftovers(&id).is_empty(), "the probe sees a running lab");
    drop(lab);
    assert_eq!(leftovers(&id), Vec::<String>::new());
    assert!(!std::path::Path::new(&format!("/tmp/nodemedic-labs/{id}")).exists());
    // Its directory is removed by a process of its own, after the lab is gone.
    nodemedic_lab::wait::until(
        "the lab's directory removed",
        std::time::Duration::from_secs(120),
        || {
            let id = id.clone();
            async move {
                let removing = std::fs::read_dir("/tmp/nodemedic-labs-removing")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&format!("{id}-")));
                Ok((!removing).then_some(()))
            }
        },
    )
    .await
    .expect("the remover finishes");
}

#[test]
fn a_panicking_test_leaves_nothing_behind_but_its_logs() {
    crate::support::logs();
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let lab = Lab::start(LabConfig::workers(2)).await.expect("lab starts");
            tx.send(lab.id().to_owned()).expect("send");
            panic!("a deliberate failure inside a lab test");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let id = rx.recv().expect("the lab started");
    assert_eq!(leftovers(&id), Vec::<String>::new());
    let logs = std::path::PathBuf::from(format!("/tmp/nodemedic-labs/{id}/logs"));
    assert!(
        logs.join("kube-apiserver.log").exists(),
        "logs of a failed test are kept for reading"
    );
}
