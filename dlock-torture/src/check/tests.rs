//! The checker against hand-made histories.

use super::*;
use crate::nemesis::FaultRecord;
use crate::resource::Write;
use crate::target::{BACKENDS, FaultKind, TOPOLOGIES};

const S: u64 = 1_000_000_000;

fn ev(t: u64, client: u32, name: u32, what: What) -> Event {
    Event {
        t,
        client,
        task: 0,
        name,
        what,
    }
}

/// A hold by `client` of `kind` on name 0: asked at `asked`, granted at
/// `granted` with `token`, valid until `valid`, released at `released`.
fn hold(client: u32, kind: Kind, token: u64, times: [u64; 4]) -> Vec<Event> {
    let [asked, granted, valid, released] = times;
    vec![
        ev(asked, client, 0, What::Invoke { kind }),
        ev(
            granted,
            client,
            0,
            What::Granted {
                kind,
                token,
                valid_until: (valid > 0).then_some(valid),
            },
        ),
        ev(released, client, 0, What::Release),
        ev(released + 1, client, 0, What::Released { ok: true }),
    ]
}

fn judge(target: &Target, events: Vec<Event>, nemesis: &Record) -> Findings {
    judge_with_writes(target, events, nemesis, &[])
}

fn judge_with_writes(
    target: &Target,
    events: Vec<Event>,
    nemesis: &Record,
    writes: &[Write],
) -> Findings {
    check(
        events,
        &Seen {
            target,
            ttl: Duration::from_secs(2),
            lock_delay: Duration::ZERO,
            nemesis,
            kills: &[],
            writes,
            until_ns: 100 * S,
            names: 1,
        },
    )
}

#[test]
fn two_mutex_holders_at_once_are_caught_and_not_explained() {
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 9 * S, 5 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [2 * S, 3 * S, 9 * S, 4 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert_eq!(f.exclusion.len(), 1, "{f:?}");
    assert_eq!(f.exclusion[0].first, (1, 10));
    assert!(f.exclusion[0].explained_by.is_none());
    assert!(f.fencing.is_empty(), "{f:?}");
}

#[test]
fn a_hold_ends_at_its_validity_deadline_even_if_released_later() {
    // Client 1's lease ended at 2 s; it released (late) at 5 s.
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 2 * S, 5 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [S + 2, 3 * S, 9 * S, 4 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert!(f.exclusion.is_empty(), "{f:?}");
}

#[test]
fn readers_share_but_never_with_a_writer_and_permits_are_counted() {
    let mut events = hold(1, Kind::Read, 10, [S, S, 0, 5 * S]);
    events.extend(hold(2, Kind::Read, 11, [S, 2 * S, 0, 5 * S]));
    let f = judge(&BACKENDS[0], events.clone(), &Record::default());
    assert!(f.exclusion.is_empty(), "{f:?}");
    events.extend(hold(3, Kind::Write, 12, [S, 3 * S, 0, 4 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert_eq!(f.exclusion.len(), 1, "{f:?}");

    let mut events = Vec::new();
    for c in 1..=PERMITS + 1 {
        events.extend(hold(
            c,
            Kind::Permit,
            10 + u64::from(c),
            [S, c as u64 * S, 0, 9 * S],
        ));
    }
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert_eq!(f.exclusion.len(), 1, "{f:?}");
}

#[test]
fn a_token_not_above_an_earlier_completed_grant_is_a_fencing_violation() {
    // Client 2 asked after client 1's grant returned: its token must be higher.
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 2 * S]);
    events.extend(hold(2, Kind::Mutex, 9, [3 * S, 4 * S, 0, 5 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert_eq!(f.fencing.len(), 1, "{f:?}");
    // Asked before client 1's grant returned: the order is the server's.
    let mut events = hold(1, Kind::Mutex, 10, [S, 2 * S, 0, 3 * S]);
    events.extend(hold(2, Kind::Mutex, 9, [S + 1, S + 2, 0, S + 3]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert!(f.fencing.is_empty(), "{f:?}");
}

#[test]
fn a_long_stop_of_a_session_holder_explains_its_overlap_on_zookeeper() {
    let zookeeper = BACKENDS.iter().find(|t| t.label == "zookeeper").unwrap();
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 9 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [2 * S, 7 * S, 0, 8 * S]));
    let stop = |secs: u64| Record {
        faults: vec![FaultRecord {
            kind: FaultKind::ClientStop,
            client: Some(1),
            node: None,
            failed_over: false,
            settled: None,
            start: 2 * S,
            end: (2 + secs) * S,
            step_ns: None,
            slots: None,
        }],
        ..Record::default()
    };
    let f = judge(zookeeper, events.clone(), &stop(5));
    assert_eq!(
        f.exclusion[0].explained_by,
        Some(Hazard::PausedSessionHolder)
    );
    // The later holder's pause explains the pair as well: paused while its
    // grant's reply was on the way, it learns of a grant already gone.
    let mut later = hold(2, Kind::Mutex, 11, [2 * S, 7 * S, 0, 8 * S]);
    later.extend(hold(1, Kind::Mutex, 12, [S + S / 2, 7 * S + 2, 0, 9 * S]));
    let f = judge(zookeeper, later, &stop(5));
    assert_eq!(f.exclusion.len(), 1, "{f:?}");
    assert_eq!(
        f.exclusion[0].explained_by,
        Some(Hazard::PausedSessionHolder)
    );
    // A stop too short to end the session explains nothing.
    let f = judge(zookeeper, events.clone(), &stop(1));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor does any stop on a backend whose row does not name the hazard.
    let f = judge(&BACKENDS[0], events, &stop(5));
    assert_eq!(f.exclusion[0].explained_by, None);
}

#[test]
fn a_failover_explains_an_overlap_on_sentinel_until_the_old_primary_was_demoted() {
    let sentinel = TOPOLOGIES
        .iter()
        .find(|t| t.label == "redis-sentinel")
        .unwrap();
    // Granted on the primary at 1 s, believed to 9 s; granted again at 6 s.
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 9 * S, 9 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [2 * S, 6 * S, 8 * S, 8 * S]));
    // A partition of a primary from 2 s to 4 s, settled at `settled` s.
    let fault = |failed_over: bool, start: u64, settled: u64| Record {
        faults: vec![FaultRecord {
            kind: FaultKind::NodePartition,
            client: None,
            node: Some(0),
            failed_over,
            settled: Some(settled * S),
            start: start * S,
            end: (start + 2) * S,
            step_ns: None,
            slots: None,
        }],
        ..Record::default()
    };
    let f = judge(sentinel, events.clone(), &fault(true, 2, 5));
    assert_eq!(f.exclusion[0].explained_by, Some(Hazard::FailoverForgets));
    // A fault that moved no primary explains nothing.
    let f = judge(sentinel, events.clone(), &fault(false, 2, 5));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor does a failover that began after the overlap.
    let f = judge(sentinel, events.clone(), &fault(true, 7, 12));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor one settled well before both grants: the old primary was demoted.
    let mut late = hold(1, Kind::Mutex, 10, [30 * S, 30 * S + 1, 39 * S, 39 * S]);
    late.extend(hold(2, Kind::Mutex, 11, [31 * S, 36 * S, 38 * S, 38 * S]));
    let f = judge(sentinel, late, &fault(true, 2, 20));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor on a cluster whose row does not name the hazard.
    let ensemble = TOPOLOGIES
        .iter()
        .find(|t| t.label == "zookeeper-ensemble")
        .unwrap();
    let f = judge(ensemble, events, &fault(true, 2, 5));
    assert_eq!(f.exclusion[0].explained_by, None);
}

#[test]
fn on_a_cluster_a_fault_explains_only_overlaps_on_names_of_its_shard() {
    let cluster = TOPOLOGIES
        .iter()
        .find(|t| t.label == "redis-cluster")
        .unwrap();
    // Name 0's slot, and a range that misses it.
    let slot = dlock::redis::cluster_slot(&crate::client::lock_name(0));
    let other = if slot < 8000 {
        (8000, 16383)
    } else {
        (0, 7999)
    };
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 9 * S, 9 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [2 * S, 6 * S, 8 * S, 8 * S]));
    let fault = |kind: FaultKind, failed_over: bool, slots: (u16, u16)| Record {
        faults: vec![FaultRecord {
            kind,
            client: None,
            node: Some(0),
            failed_over,
            settled: Some(5 * S),
            start: 2 * S,
            end: 4 * S,
            step_ns: None,
            slots: Some(vec![slots]),
        }],
        ..Record::default()
    };
    let f = judge(
        cluster,
        events.clone(),
        &fault(FaultKind::NodePause, true, (slot, slot)),
    );
    assert_eq!(f.exclusion[0].explained_by, Some(Hazard::FailoverForgets));
    let f = judge(
        cluster,
        events.clone(),
        &fault(FaultKind::NodePause, true, other),
    );
    assert_eq!(
        f.exclusion[0].explained_by, None,
        "another shard's failover"
    );
    // A data node killed comes back empty: its own shard's names only.
    let f = judge(
        cluster,
        events.clone(),
        &fault(FaultKind::NodeKill, false, (0, 16383)),
    );
    assert_eq!(f.exclusion[0].explained_by, Some(Hazard::RestartForgets));
    let f = judge(
        cluster,
        events.clone(),
        &fault(FaultKind::NodeKill, false, other),
    );
    assert_eq!(f.exclusion[0].explained_by, None, "another shard's restart");
    // A member that persists (ZooKeeper) forgets nothing when killed.
    let ensemble = TOPOLOGIES
        .iter()
        .find(|t| t.label == "zookeeper-ensemble")
        .unwrap();
    let f = judge(
        ensemble,
        events,
        &fault(FaultKind::NodeKill, false, (0, 16383)),
    );
    assert_eq!(f.exclusion[0].explained_by, None);
}

#[test]
fn a_wall_clock_step_explains_an_overlap_no_longer_than_itself_on_wall_clock_servers() {
    const MS: u64 = 1_000_000;
    // The judge's TTL is 2 s, less 22 ms of drift: client 1's lease, asked
    // at 1 s, is believed until 2.978 s. The wall clock steps at 1.5 s, and
    // client 2 is granted at 1.6 s: believed beside it for 1.378 s.
    let believed = 2 * S + 978 * MS;
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, believed, 9 * S]);
    let second = hold(
        2,
        Kind::Mutex,
        11,
        [S + 550 * MS, S + 600 * MS, 9 * S, 8 * S],
    );
    events.extend(second.clone());
    let step = |at: u64, by: i64| Record {
        faults: vec![FaultRecord {
            kind: FaultKind::ClockStep,
            client: None,
            node: None,
            failed_over: false,
            settled: None,
            start: at,
            end: at + 10 * MS,
            step_ns: Some(by),
            slots: None,
        }],
        ..Record::default()
    };
    let redis = &BACKENDS[0];
    let f = judge(
        redis,
        events.clone(),
        &step(S + 500 * MS, 1_700 * MS as i64),
    );
    assert_eq!(f.exclusion[0].explained_by, Some(Hazard::WallClockStep));
    // A step shorter than the overlap does not explain it.
    let f = judge(
        redis,
        events.clone(),
        &step(S + 500 * MS, 1_000 * MS as i64),
    );
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor a step after the second grant.
    let f = judge(
        redis,
        events.clone(),
        &step(S + 700 * MS, 1_700 * MS as i64),
    );
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor one before the lease behind the belief was stamped (a renewal
    // after the step, counted on the stepped clock).
    let mut renewed = hold(1, Kind::Mutex, 10, [S, S + 1, 4 * S + 500 * MS, 9 * S]);
    renewed.extend(second.clone());
    let f = judge(redis, renewed, &step(S + 500 * MS, 5_000 * MS as i64));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor does it explain the later hold, however short its belief.
    let mut session = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 9 * S]);
    session.extend(hold(
        2,
        Kind::Mutex,
        11,
        [S + 550 * MS, S + 600 * MS, 0, S + 700 * MS],
    ));
    let f = judge(redis, session, &step(S + 500 * MS, 1_700 * MS as i64));
    assert_eq!(f.exclusion[0].explained_by, None);
    // Nor on a server whose leases do not end on its wall clock.
    let zookeeper = BACKENDS.iter().find(|t| t.label == "zookeeper").unwrap();
    let f = judge(zookeeper, events, &step(S + 500 * MS, 1_700 * MS as i64));
    assert_eq!(f.exclusion[0].explained_by, None);
}

#[test]
fn a_name_granted_late_after_a_heal_misses_liveness() {
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 2 * S]);
    events.extend(hold(2, Kind::Mutex, 11, [20 * S, 30 * S, 0, 31 * S]));
    let nemesis = Record {
        heals: vec![3 * S],
        batches: vec![S, 60 * S],
        ..Record::default()
    };
    let f = judge(&BACKENDS[0], events, &nemesis);
    assert_eq!(f.unavailable.len(), 1, "{f:?}");
    assert!((f.longest_unavailable_ms - 27_000.0).abs() < 1.0);
}

#[test]
fn a_hold_whose_first_look_found_it_invalid_was_never_believed() {
    let mut events = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 5 * S]);
    events.insert(
        2,
        ev(
            2 * S,
            1,
            0,
            What::Checked {
                valid: false,
                valid_until: None,
            },
        ),
    );
    events.extend(hold(2, Kind::Mutex, 11, [S + 2, 3 * S, 0, 4 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert!(f.exclusion.is_empty(), "{f:?}");
}

#[test]
fn a_refused_write_while_its_hold_was_believed_is_a_violation_unless_sent_late() {
    // Client 1 believed its hold (token 10) from 1 s to 5 s; the resource
    // refused its write at 2 s.
    let events = hold(1, Kind::Mutex, 10, [S, S + 1, 0, 5 * S]);
    let refused = |late| Write {
        t: 2 * S,
        name: 0,
        token: 10,
        exclusive: true,
        client: 1,
        hold: 1,
        believed: true,
        late,
        accepted: false,
    };
    let f = judge_with_writes(
        &BACKENDS[0],
        events.clone(),
        &Record::default(),
        &[refused(false)],
    );
    assert_eq!(f.refused_in_belief.len(), 1, "{f:?}");
    assert_eq!(f.unpredicted(), 1);
    let f = judge_with_writes(&BACKENDS[0], events, &Record::default(), &[refused(true)]);
    assert!(f.refused_in_belief.is_empty(), "{f:?}");
    assert_eq!(f.refused.len(), 1);
}

#[test]
fn unexpected_errors_and_kinds_never_granted_fail_the_run() {
    let mut events = vec![
        ev(S, 1, 0, What::Invoke { kind: Kind::Mutex }),
        ev(
            2 * S,
            1,
            0,
            What::Failed {
                error: "unsupported".to_owned(),
                unexpected: true,
            },
        ),
    ];
    let f = judge(&BACKENDS[0], events.clone(), &Record::default());
    assert_eq!(f.ungranted.len(), 1, "{f:?}");
    assert_eq!(f.unexpected_errors.get("unsupported"), Some(&1));
    events.extend(hold(1, Kind::Mutex, 10, [3 * S, 3 * S + 1, 0, 4 * S]));
    let f = judge(&BACKENDS[0], events, &Record::default());
    assert!(f.ungranted.is_empty(), "{f:?}");
}
