//! The lab cluster's certificates and kubeconfigs, written under `<lab>/pki`.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use nodemedic_kube::pki::{Authority, Leaf, key_pair_pem};

use crate::{Result, error::io};

pub struct LabPki {
    pub dir: PathBuf,
    pub ca: Authority,
}

impl LabPki {
    pub fn create(dir: &Path, api_ip: Ipv4Addr) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("creating the pki directory"))?;
        let ca = Authority::new("nodemedic-lab-ca", 30)?;
        let pki = Self {
            dir: dir.to_owned(),
            ca,
        };
        pki.write("ca.crt", &pki.ca.pem().cert)?;
        pki.write("ca.key", &pki.ca.pem().key)?;
        let server = pki.ca.issue(&Leaf {
            common_name: "kube-apiserver".into(),
            dns_names: [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(String::from)
            .to_vec(),
            ips: vec![
                IpAddr::V4(api_ip),
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            ],
            server: true,
            valid_days: 30,
            ..Leaf::default()
        })?;
        pki.write("apiserver.crt", &server.cert)?;
        pki.write("apiserver.key", &server.key)?;
        pki.issue_client("admin", "admin", &["system:masters"])?;
        // The API server's own identity towards real kubelets (logs, exec, port-forward).
        pki.issue_client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let sa = key_pair_pem()?;
        pki.write("sa.key", &sa.key)?;
        pki.write("sa.pub", &sa.cert)?;
        Ok(pki)
    }

    fn write(&self, name: &str, text: &str) -> Result<()> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A server certificate `<file>.crt`/`<file>.key` for `ip` (e.g. a BMC's); returns their paths.
    pub fn issue_server(&self, file: &str, ip: Ipv4Addr) -> Result<(PathBuf, PathBuf)> {
        let pem = self.ca.issue(&Leaf {
            common_name: ip.to_string(),
            ips: vec![IpAddr::V4(ip)],
            server: true,
            valid_days: 30,
            ..Leaf::default()
        })?;
        self.write(&format!("{file}.crt"), &pem.cert)?;
        self.write(&format!("{file}.key"), &pem.key)?;
        Ok((self.path(&format!("{file}.crt")), self.path(&format!("{file}.key"))))
    }

    /// A client certificate `<file>.crt`/`<file>.key` for `user` in `groups`.
    pub fn issue_client(&self, file: &str, user: &str, groups: &[&str]) -> Result<()> {
        let pem = self.ca.issue(&Leaf {
            common_name: user.into(),
            organizations: groups.iter().map(|g| g.to_string()).collect(),
            client: true,
            valid_days: 30,
            ..Leaf::default()
        })?;
        self.write(&format!("{file}.crt"), &pem.cert)?;
        self.write(&format!("{file}.key"), &pem.key)
    }

    /// A kubeconfig for the client certificate `<file>` against `server`.
    /// A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's).
    pub fn token_kubeconfig(&self, user: &str, token: &str, server: &str, path: &Path) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\n\
             contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {user}\ncurrent-context: lab\n",
            ca = self.path("ca.crt").display(),
        );
        std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
    }

    pub fn kubeconfig(&self, file: &str, server: &str, path: &Path) -> Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: {file}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n\
             contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: {file}\ncurrent-context: lab\n",
            ca = self.path("ca.crt").display(),
            crt = self.path(&format!("{file}.crt")).display(),
            key = self.path(&format!("{file}.key")).display(),
        );
        std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
    }
}
