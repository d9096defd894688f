//! The lab's networks: a node bridge (one network namespace per node, joined by a veth), and a
//! management bridge for the BMCs that no partition touches. Faults are nftables tables inside a
//! node's namespace, so they cut exactly that node's traffic and nothing on the host.

use std::{collections::BTreeMap, net::Ipv4Addr};

use crate::{Result, cmd};

/// Name of the nftables table faults use inside a node's namespace.
const FAULT_TABLE: &str = "nodemedic_fault";

/// Node indices the node bridge has addresses for: .11 to .254.
pub(crate) const NODE_SLOTS: usize = 244;

/// Every lab's pod networks: 10.64.0.0/10, a /18 per lab (by its slot), a /26 per node (by its
/// index). Real nodes' pods are routed by these on the host, so no two labs on the machine may
/// share one.
pub(crate) const POD_NETWORKS: &str = "10.64.0.0/10";

/// The pod network of the node at `index` in the lab of `slot` (kwok's announces it; a real
/// node's pods are addressed from it).
fn pod_cidr(slot: u8, index: usize) -> String {
    let offset = (u32::from(slot) << 14) | ((index as u32 & 0xff) << 6);
    let base = u32::from(Ipv4Addr::new(10, 64, 0, 0)) + offset;
    format!("{}/26", Ipv4Addr::from(base))
}

#[derive(Clone, Debug)]
pub(crate) struct Network {
    pub id: String,
    pub slot: u8,
    pub bridge: String,
    pub mgmt_bridge: String,
}

impl Network {
    /// Picks the first 10.213.<slot>.0/24 that no interface on this host uses.
    pub(crate) fn plan(id: &str) -> Result<Self> {
        let used = cmd::run("ip", &["-4", "-o", "addr", "show"])?;
        let slot = (1..=250u8)
            .find(|s| !used.contains(&format!(" 10.213.{s}.")) && !used.contains(&format!(" 10.214.{s}.")))
            .ok_or_else(|| crate::Error::Invalid("no free 10.213.x.0/24 subnet for a lab".into()))?;
        Ok(Self {
            id: id.to_owned(),
            slot,
            bridge: format!("nm{id}"),
            mgmt_bridge: format!("nm{id}m"),
        })
    }

    /// The host's address on the node bridge, where the API server listens.
    pub(crate) fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, 1)
    }

    /// The pod network of this lab's node at `index`.
    pub(crate) fn pod_cidr(&self, index: usize) -> String {
        pod_cidr(self.slot, index)
    }

    pub(crate) fn node_ip(&self, index: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, 11 + index as u8)
    }

    /// A fixed, locally administered MAC for bridge `which` (1: nodes, 2: management).
    fn bridge_mac(&self, which: u8) -> String {
        format!("02:6e:6d:{:02x}:{which:02x}:01", self.slot)
    }

    /// The host's address on the management bridge.
    pub(crate) fn mgmt_host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 214, self.slot, 1)
    }

    /// The BMC of the node with this index, on the management bridge.
    pub(crate) fn bmc_ip(&self, index: usize) -> Result<Ipv4Addr> {
        u8::try_from(101 + index)
            .ok()
            .filter(|last| *last < 255)
            .map(|last| Ipv4Addr::new(10, 214, self.slot, last))
            .ok_or_else(|| crate::Error::Invalid(format!("no BMC address for node number {index}")))
    }

    /// Gives the host the BMC's address on the management bridge, so a BMC emulator on the host
    /// can listen there; it goes away with the bridge.
    pub(crate) fn add_bmc_address(&self, index: usize) -> Result<Ipv4Addr> {
        let ip = self.bmc_ip(index)?;
        cmd::run("ip", &["addr", "add", &format!("{ip}/24"), "dev", &self.mgmt_bridge])?;
        Ok(ip)
    }

    /// Takes a BMC's address off the management bridge (its node left the lab).
    pub(crate) fn remove_bmc_address(&self, index: usize) {
        if let Ok(ip) = self.bmc_ip(index) {
            cmd::run_quietly("ip", &["addr", "del", &format!("{ip}/24"), "dev", &self.mgmt_bridge]);
        }
    }

    pub(crate) fn netns(&self, node: &str) -> String {
        format!("nm{}-{node}", self.id)
    }

    pub(crate) fn create_bridges(&self) -> Result<()> {
        for (bridge, ip, which) in [
            (&self.bridge, self.host_ip(), 1),
            (&self.mgmt_bridge, self.mgmt_host_ip(), 2),
        ] {
            // A bridge without an address of its own takes its lowest port's, so a node added
            // or removed could change the host's MAC under every node's ARP entry for the API
            // server: tens of seconds of failed connects on the others (seed 47, trials 20 and
            // 22: the two survivors lost the API at a node's removal and fenced themselves).
            let mac = self.bridge_mac(which);
            cmd::run("ip", &["link", "add", bridge, "address", &mac, "type", "bridge"])?;
            cmd::run("ip", &["addr", "add", &format!("{ip}/24"), "dev", bridge])?;
            cmd::run("ip", &["link", "set", bridge, "up"])?;
        }
        Ok(())
    }

    pub(crate) fn create_node(&self, node: &str, index: usize) -> Result<()> {
        let ns = self.netns(node);
        let host_end = format!("nm{}v{index}", self.id);
        let node_end = format!("nm{}p{index}", self.id);
        cmd::run("ip", &["netns", "add", &ns])?;
        cmd::run(
            "ip",
            &["link", "add", &host_end, "type", "veth", "peer", "name", &node_end],
        )?;
        cmd::run("ip", &["link", "set", &node_end, "netns", &ns])?;
        cmd::run("ip", &["-n", &ns, "link", "set", &node_end, "name", "eth0"])?;
        cmd::run(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", self.node_ip(index)),
                "dev",
                "eth0",
            ],
        )?;
        cmd::run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        cmd::run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        cmd::run("ip", &["link", "set", &host_end, "master", &self.bridge])?;
        cmd::run("ip", &["link", "set", &host_end, "up"])?;
        Ok(())
    }

    /// Drops every packet of `node` except to and from `allowed` (its partition's members),
    /// its pods' included: what it forwards for them may reach only the members and their pods.
    pub(crate) fn cut_off(&self, node: &str, allowed: &[Ipv4Addr]) -> Result<()> {
        let mut members: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        let pods: Vec<String> = allowed.iter().filter_map(|ip| self.pod_cidr_of(*ip)).collect();
        let (set, forwarded) = if members.is_empty() {
            (String::new(), String::new())
        } else {
            let list = members.join(", ");
            members.extend(pods);
            let with_pods = members.join(", ");
            (
                format!("ip saddr {{ {list} }} accept\n"),
                format!("ip daddr {{ {with_pods} }} accept\nip saddr {{ {with_pods} }} accept\n"),
            )
        };
        let out_set = set.replace("saddr", "daddr");
        let rules = format!(
            "table inet {FAULT_TABLE} {{\n\
             chain input {{ type filter hook input priority 0; policy accept; iifname \"lo\" accept\n{set}drop\n}}\n\
             chain output {{ type filter hook output priority 0; policy accept; oifname \"lo\" accept\n{out_set}drop\n}}\n\
             chain forward {{ type filter hook forward priority 0; policy accept;\n{forwarded}drop\n}}\n}}\n"
        );
        self.replace_fault_rules(node, &rules)
    }

    /// Drops only the node's traffic to and from the API server (its pods' too); peers stay
    /// reachable.
    pub(crate) fn isolate_from(&self, node: &str, api: Ipv4Addr, port: u16) -> Result<()> {
        let to_api = format!("ip daddr {api} tcp dport {port} drop");
        let from_api = format!("ip saddr {api} tcp sport {port} drop");
        let rules = format!(
            "table inet {FAULT_TABLE} {{\n\
             chain input {{ type filter hook input priority 0; policy accept; {from_api}\n}}\n\
             chain output {{ type filter hook output priority 0; policy accept; {to_api}\n}}\n\
             chain forward {{ type filter hook forward priority 0; policy accept; {to_api}\n{from_api}\n}}\n}}\n"
        );
        self.replace_fault_rules(node, &rules)
    }

    /// The pod network of the node at `ip` on the node bridge.
    fn pod_cidr_of(&self, ip: Ipv4Addr) -> Option<String> {
        let [a, b, slot, last] = ip.octets();
        ((a, b, slot) == (10, 213, self.slot) && last >= 11).then(|| self.pod_cidr(usize::from(last - 11)))
    }

    /// Lets a real node forward its pods' packets, routes its pod network to it from the host
    /// (the API server reaches its pods: webhooks, the aggregator), and makes the host its
    /// gateway: a Service's cluster IP is routed before kube-proxy's rules rewrite it.
    pub(crate) fn forward_pods(&self, node: &str, index: usize) -> Result<()> {
        let ns = self.netns(node);
        let gateway = self.host_ip().to_string();
        cmd::run("ip", &["netns", "exec", &ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        cmd::run("ip", &["-n", &ns, "route", "replace", "default", "via", &gateway])?;
        let via = self.node_ip(index).to_string();
        cmd::run(
            "ip",
            &[
                "route",
                "replace",
                &self.pod_cidr(index),
                "via",
                &via,
                "dev",
                &self.bridge,
            ],
        )?;
        Ok(())
    }

    /// Routes the pod network of the real node at `index` to it from the other nodes'
    /// namespaces (pod to pod, no overlay).
    pub(crate) fn route_pods_from(&self, index: usize, from: &[&str]) -> Result<()> {
        let (cidr, via) = (self.pod_cidr(index), self.node_ip(index).to_string());
        for other in from {
            cmd::run(
                "ip",
                &["-n", &self.netns(other), "route", "replace", &cidr, "via", &via],
            )?;
        }
        Ok(())
    }

    /// Removes the node's fault rules, if it has any. Tried a few times because a simulated
    /// power-off kills every process in the node's namespace, `nft` included, and one may land
    /// in the middle of a heal.
    pub(crate) fn heal(&self, node: &str) -> Result<()> {
        let ns = self.netns(node);
        let list = ["netns", "exec", &ns, "nft", "list", "tables"];
        let delete = ["netns", "exec", &ns, "nft", "delete", "table", "inet", FAULT_TABLE];
        let mut attempts_left = 3;
        loop {
            let attempt = cmd::run("ip", &list).and_then(|tables| {
                if tables.contains(FAULT_TABLE) {
                    cmd::run("ip", &delete).map(drop)
                } else {
                    Ok(())
                }
            });
            match attempt {
                Ok(()) => return Ok(()),
                Err(error) if attempts_left == 0 => return Err(error),
                Err(error) => {
                    tracing::debug!(%error, node, "removing the fault rules failed; trying again");
                    attempts_left -= 1;
                    // Past the sweep that killed it.
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            }
        }
    }

    fn replace_fault_rules(&self, node: &str, rules: &str) -> Result<()> {
        self.heal(node)?;
        cmd::run_with_stdin(
            "ip",
            &["netns", "exec", &self.netns(node), "nft", "-f", "-"],
            Some(rules),
        )?;
        Ok(())
    }

    /// Brings the node's interface up or down: a machine without power answers nothing, not
    /// even a refused connection.
    pub(crate) fn set_link(&self, node: &str, up: bool) -> Result<()> {
        let state = if up { "up" } else { "down" };
        cmd::run("ip", &["-n", &self.netns(node), "link", "set", "eth0", state])?;
        Ok(())
    }

    /// Every process running in the node's namespace.
    pub(crate) fn pids(&self, node: &str) -> Vec<i32> {
        cmd::run("ip", &["netns", "pids", &self.netns(node)])
            .map(|out| out.split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Removes one node's veth and namespace (its processes should be gone first).
    pub(crate) fn destroy_node(&self, node: &str, index: usize) {
        // Deleting the host end removes the pair now; a namespace's own removal is deferred
        // until the kernel drops its last reference.
        cmd::run_quietly("ip", &["link", "del", &format!("nm{}v{index}", self.id)]);
        cmd::run_quietly("ip", &["netns", "del", &self.netns(node)]);
    }

    /// Removes every node's namespace (by name, with its index) and both bridges.
    pub(crate) fn destroy(&self, nodes: &BTreeMap<String, usize>) {
        for (node, index) in nodes {
            self.destroy_node(node, *index);
        }
        cmd::run_quietly("ip", &["link", "del", &self.bridge]);
        cmd::run_quietly("ip", &["link", "del", &self.mgmt_bridge]);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn pod_networks_are_distinct_across_labs_and_nodes_and_inside_the_pod_networks() {
        assert_eq!(pod_cidr(1, 0), "10.64.64.0/26");
        assert_eq!(pod_cidr(1, 1), "10.64.64.64/26");
        assert_eq!(pod_cidr(2, 0), "10.64.128.0/26");
        let mut seen = BTreeSet::new();
        for slot in [1u8, 2, 17, 250] {
            for index in 0..NODE_SLOTS {
                let cidr = pod_cidr(slot, index);
                let base: Ipv4Addr = cidr.trim_end_matches("/26").parse().expect("an address");
                let [a, b, ..] = base.octets();
                assert!(a == 10 && (64..128).contains(&b), "{cidr} is outside {POD_NETWORKS}");
                assert!(seen.insert(cidr.clone()), "{cidr} given twice");
            }
        }
    }
}
