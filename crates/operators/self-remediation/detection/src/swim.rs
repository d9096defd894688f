//! The detector's member as foca (SWIM) sees it: its identity and its configuration from the
//! settings. foca is a state machine without I/O; the agents give it its transport and timers.

use std::num::{NonZeroU8, NonZeroUsize};

use serde::{Deserialize, Serialize};

use crate::{DetectorSettings, DetectorState};

/// A member: the node its agent runs on, and which of that agent's lives this is. A restarted
/// agent, or one that learns the others declared it down, joins again with a later generation,
/// which wins over the earlier one (same node, so foca keeps only one of them).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Peer {
    pub node: String,
    pub generation: u64,
}

impl foca::Identity for Peer {
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            node: self.node.clone(),
            generation: self.generation.wrapping_add(1),
        })
    }

    fn addr(&self) -> String {
        self.node.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

/// foca's configuration for these settings. A member wrongly declared down is forgotten after
/// foca's `remove_down_after`; its next message then makes it a member again.
pub fn config(settings: &DetectorSettings) -> foca::Config {
    let mut config = foca::Config::simple();
    config.probe_period = settings.probe_period;
    config.probe_rtt = settings.probe_rtt;
    config.num_indirect_probes =
        NonZeroUsize::new(usize::from(settings.indirect_probes).max(1)).unwrap_or(NonZeroUsize::MIN);
    config.suspect_to_down_after = settings.suspect_to_down_after;
    config.max_transmissions = NonZeroU8::new(10).unwrap_or(NonZeroU8::MIN);
    config
}

/// What foca's member state means to an observer.
pub fn detector_state(state: foca::State) -> DetectorState {
    match state {
        foca::State::Alive => DetectorState::Alive,
        foca::State::Suspect => DetectorState::Suspect,
        foca::State::Down => DetectorState::Down,
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity;

    use super::*;

    #[test]
    fn a_later_generation_of_the_same_node_wins() {
        let first = Peer {
            node: "node-1".into(),
            generation: 7,
        };
        let next = first.renew().expect("renewable");
        assert_eq!(next.addr(), first.addr());
        assert!(next.win_addr_conflict(&first));
        assert!(!first.win_addr_conflict(&next));
    }

    #[test]
    fn the_settings_carry_over() {
        let settings = DetectorSettings::default();
        let config = config(&settings);
        assert_eq!(config.probe_period, settings.probe_period);
        assert_eq!(config.probe_rtt, settings.probe_rtt);
        assert_eq!(config.num_indirect_probes.get(), 3);
        assert_eq!(config.suspect_to_down_after, settings.suspect_to_down_after);
    }
}
