//! The detector's member as foca (SWIM) sees it: its identity and its configuration from the
//! settings. foca is a state machine without I/O; the agents give it its transport and timers.

use std::{
    collections::BTreeSet,
    num::{NonZeroU8, NonZeroUsize},
    time::Duration,
};

use foca::{Codec, Message, OwnedNotification, PostcardCodec};

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

/// How often a member announces itself to the registered members it is not in touch with
/// ([`announce_to`]).
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);

/// foca's configuration for these settings. A member wrongly declared down is told so, and
/// joins again under its next generation; one that never hears it is forgotten after foca's
/// `remove_down_after`, and its next message then makes it a member again.
pub fn config(settings: &DetectorSettings) -> foca::Config {
    let mut config = foca::Config::simple();
    config.notify_down_members = true;
    config.probe_period = settings.probe_period;
    config.probe_rtt = settings.probe_rtt;
    config.num_indirect_probes =
        NonZeroUsize::new(usize::from(settings.indirect_probes).max(1)).unwrap_or(NonZeroUsize::MIN);
    config.suspect_to_down_after = settings.suspect_to_down_after;
    config.max_transmissions = NonZeroU8::new(10).unwrap_or(NonZeroU8::MIN);
    config
}

/// Whether foca is taking part in the cluster, as its notifications tell: it is once some member
/// answered its current identity, and is not after it joined again under a new generation (it
/// starts over, disconnected, its probing stopped) or saw every member go down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    connected: bool,
}

impl Standing {
    pub fn heard(&mut self, notification: &OwnedNotification<Peer>) {
        match notification {
            OwnedNotification::Active => self.connected = true,
            OwnedNotification::Idle | OwnedNotification::Rejoin(_) | OwnedNotification::Defunct => {
                self.connected = false;
            }
            _ => {}
        }
    }

    pub fn connected(&self) -> bool {
        self.connected
    }
}

/// The registered members `me` announces itself to on its periodic tick (every
/// [`ANNOUNCE_EVERY`]); each answers with the members it knows, under their current generations.
///
/// - Those its detector does not count as active (never heard from, or declared down): a node
///   that was cut off has every other member down and probes no one, and the others have it down
///   too, so neither side would ever speak first.
/// - While it is not connected, every one of them. After a stall of every member at once (a
///   starved machine, a paused VM), each declares the others down and joins again under a new
///   generation, disconnected and probing nothing, and the members it still lists as alive are
///   identities their owners have left: messages to them are dropped, none comes back, and the
///   detector would stay blind for good.
pub fn announce_to<'a>(
    me: &str,
    registered: impl IntoIterator<Item = &'a str>,
    members: impl IntoIterator<Item = (&'a Peer, foca::State)>,
    standing: Standing,
) -> Vec<String> {
    let active: BTreeSet<&str> = members
        .into_iter()
        .filter(|(_, state)| *state != foca::State::Down)
        .map(|(peer, _)| peer.node.as_str())
        .collect();
    registered
        .into_iter()
        .filter(|node| *node != me && (!standing.connected() || !active.contains(node)))
        .map(str::to_owned)
        .collect()
}

/// Whether a message foca asks to send to `to` may go. foca 1.0 sends its courtesy notice
/// "you were declared down" (`notify_down_members`) also when a suspicion timer finds the
/// suspicion refuted and declares nothing (`Timer::ChangeSuspectToDown` in its lib.rs sends it
/// whatever its condition found). The member told so leaves a healthy life and joins again under
/// a new generation, disconnected: every refuted suspicion on a slow link costs a rejoin, and a
/// few at once left a lab's detectors blind. A genuine notice goes to a member this detector
/// holds down, or to a life of it the detector no longer lists; one to a member it holds active
/// is dropped.
pub fn may_send<'a>(to: &Peer, data: &[u8], members: impl IntoIterator<Item = (&'a Peer, foca::State)>) -> bool {
    let notice = PostcardCodec
        .decode_header(&mut &data[..])
        .is_ok_and(|header: foca::Header<Peer>| header.message == Message::TurnUndead);
    !notice
        || !members
            .into_iter()
            .any(|(peer, state)| peer == to && state != foca::State::Down)
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

    fn peer(node: &str, generation: u64) -> Peer {
        Peer {
            node: node.into(),
            generation,
        }
    }

    fn connected() -> Standing {
        let mut standing = Standing::default();
        standing.heard(&OwnedNotification::Active);
        standing
    }

    #[test]
    fn in_touch_it_announces_only_to_the_members_it_does_not_count_active() {
        let (b, c) = (peer("b", 1), peer("c", 1));
        let members = [(&b, foca::State::Alive), (&c, foca::State::Down)];
        let to = announce_to("a", ["a", "b", "c", "d"], members, connected());
        assert_eq!(to, ["c", "d"]);
    }

    #[test]
    fn out_of_touch_it_announces_to_every_registered_member_but_itself() {
        let (b, c) = (peer("b", 1), peer("c", 1));
        let members = [(&b, foca::State::Alive), (&c, foca::State::Suspect)];
        let mut standing = connected();
        standing.heard(&OwnedNotification::Rejoin(peer("a", 2)));
        assert!(!standing.connected());
        assert_eq!(announce_to("a", ["a", "b", "c"], members, standing), ["b", "c"]);
        let mut idle = connected();
        idle.heard(&OwnedNotification::Idle);
        assert_eq!(announce_to("a", ["a", "b", "c"], [], idle), ["b", "c"]);
        assert_eq!(announce_to("a", ["a", "b"], [], Standing::default()), ["b"]);
    }

    fn encoded(message: Message<Peer>, to: &Peer) -> Vec<u8> {
        let header = foca::Header {
            src: peer("a", 1),
            src_incarnation: 0,
            dst: to.clone(),
            message,
        };
        let mut bytes = Vec::new();
        PostcardCodec.encode_header(&header, &mut bytes).expect("encodes");
        bytes
    }

    #[test]
    fn a_down_notice_goes_only_to_a_member_held_down_or_no_longer_listed() {
        let (b, c, d) = (peer("b", 1), peer("c", 1), peer("d", 1));
        let members = [
            (&b, foca::State::Alive),
            (&c, foca::State::Down),
            (&d, foca::State::Suspect),
        ];
        let notice = |to: &Peer| may_send(to, &encoded(Message::TurnUndead, to), members);
        assert!(!notice(&b), "b refuted its suspicion: it is alive");
        assert!(!notice(&d), "d is only suspected");
        assert!(notice(&c), "c was declared down");
        assert!(notice(&peer("b", 0)), "a life of b the detector no longer lists");
        assert!(notice(&peer("e", 1)), "a member the detector does not know");
        assert!(may_send(&b, &encoded(Message::Ping(1), &b), members));
        assert!(
            may_send(&b, b"not foca", members),
            "what is not a notice is not foca's to judge here"
        );
    }

    #[test]
    fn the_settings_carry_over() {
        let settings = DetectorSettings::default();
        let config = config(&settings);
        assert_eq!(config.probe_period, settings.probe_period);
        assert_eq!(config.probe_rtt, settings.probe_rtt);
        assert_eq!(config.num_indirect_probes.get(), 3);
        assert_eq!(config.suspect_to_down_after, settings.suspect_to_down_after);
        assert!(config.notify_down_members);
    }
}
