use std::collections::BTreeSet;

use super::*;

/// The set of `members` (the cluster's tests use it too).
pub(in crate::cluster) fn set(members: &[&str]) -> BTreeSet<String> {
    members.iter().map(|member| (*member).to_owned()).collect()
}

#[test]
fn members_are_seeds_discovered_and_joined_minus_those_that_left() {
    let mut membership = Membership {
        seeds: set(&["a:1", "b:1"]),
        discovered: set(&["c:1"]),
        ..Membership::default()
    };
    assert_eq!(
        membership.members("me:1"),
        set(&["a:1", "b:1", "c:1", "me:1"])
    );
    membership.joined.insert("d:1".to_owned());
    membership.left.insert("b:1".to_owned());
    assert_eq!(
        membership.members("me:1"),
        set(&["a:1", "c:1", "d:1", "me:1"])
    );
    membership.leaving = true;
    assert_eq!(
        membership.members("me:1"),
        set(&["a:1", "c:1", "d:1"]),
        "a leaving node routes nothing to itself"
    );
}

#[test]
fn members_the_detector_found_down_are_off_the_ring_but_still_pinged() {
    let mut membership = Membership {
        seeds: set(&["a:1", "b:1"]),
        joined: set(&["c:1"]),
        ..Membership::default()
    };
    membership.down.insert("b:1".to_owned());
    assert_eq!(membership.members("me:1"), set(&["a:1", "c:1", "me:1"]));
    assert_eq!(
        membership.candidates("me:1"),
        set(&["a:1", "b:1", "c:1"]),
        "a member that is down is still pinged, so it can come back"
    );
}

#[test]
fn a_ping_answer_heals_a_mistaken_leave_and_a_missing_self() {
    let mut membership = Membership {
        seeds: set(&["b:1"]),
        ..Membership::default()
    };
    membership.left.insert("c:1".to_owned());
    assert_eq!(
        membership.probed("me:1"),
        set(&["b:1", "c:1"]),
        "a node said to have left is still pinged"
    );
    let theirs = |members: &[&str]| -> Vec<String> {
        members.iter().map(|member| (*member).to_owned()).collect()
    };
    // C answers with itself on its ring: the leave was spoofed or stale.
    let heard = membership.heard("me:1", "c:1", &theirs(&["c:1", "me:1"]));
    assert_eq!(
        heard,
        Heard {
            back: true,
            rejoin: false
        }
    );
    assert_eq!(membership.members("me:1"), set(&["b:1", "c:1", "me:1"]));
    // A node that really left (not on its own ring) stays left.
    membership.left.insert("d:1".to_owned());
    let heard = membership.heard("me:1", "d:1", &theirs(&["b:1", "me:1"]));
    assert_eq!(
        heard,
        Heard {
            back: false,
            rejoin: false
        }
    );
    assert!(!membership.members("me:1").contains("d:1"));
    // B's ring lacks this node: it joins B again, unless it is leaving itself.
    let heard = membership.heard("me:1", "b:1", &theirs(&["b:1", "c:1"]));
    assert_eq!(
        heard,
        Heard {
            back: false,
            rejoin: true
        }
    );
    membership.leaving = true;
    let heard = membership.heard("me:1", "b:1", &theirs(&["b:1", "c:1"]));
    assert_eq!(
        heard,
        Heard {
            back: false,
            rejoin: false
        }
    );
}
