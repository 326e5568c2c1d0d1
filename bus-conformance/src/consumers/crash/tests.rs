//! The harness's own checks: the counting and the rules, without processes.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bus_core::Selector;
use bus_core::consumer::ConsumerInfo;
use serde_json::json;

use super::{CONSUMER, Figures, Key, Outcome, Rng, is_poison};

#[test]
fn figures_count_redeliveries_and_handlings_after_an_ack() {
    let mut f = Figures::default();
    for line in [
        "H 0 1", "H 0 1", "A 0 1", "H 0 1", "H 1 3", "D 1 3", "F 0 2",
    ] {
        f.take(line).unwrap();
    }
    assert_eq!(f.handled[&(0, 1)], 3);
    assert_eq!(f.redelivered_unacked, 2);
    assert_eq!(f.handled_after_ack, 1);
    assert_eq!(f.dead_lettered, 1);
    assert_eq!(f.fencing_refusals, 1);
    assert!(f.acked.contains(&(1, 3)));
    assert!(f.take("DONE").is_err());
    assert!(f.take("X 0 1").is_err());
    assert!(f.take("H 0").is_err());
}

#[test]
fn the_same_seed_gives_the_same_kill_moments() {
    let (mut a, mut b) = (Rng::new(), Rng::new());
    let mut c = Rng {
        inner: fastrand::Rng::with_seed(a.seed()),
        seed: a.seed(),
    };
    let drawn: Vec<u64> = (0..20).map(|_| a.below(30)).collect();
    assert!(drawn.iter().all(|n| *n < 30));
    assert_eq!(drawn, (0..20).map(|_| c.below(30)).collect::<Vec<_>>());
    assert_eq!(b.below(0), 0);
}

fn outcome(dead: Vec<Key>, figures: Figures) -> Outcome {
    let records = (0..4u64)
        .map(|i| ((0, i), json!({"i": i, "poison": is_poison(i)})))
        .collect();
    Outcome {
        backend: "test",
        rounds: 1,
        elapsed: Duration::ZERO,
        seed: 1,
        records,
        dead,
        consumers: vec![ConsumerInfo {
            name: CONSUMER.to_owned(),
            selector: Selector::Topic,
            partitions: vec![],
        }],
        figures,
    }
}

fn handled_all() -> Figures {
    let mut f = Figures::default();
    for o in 0..4 {
        f.handle((0, o));
    }
    f
}

#[test]
fn a_sound_outcome_holds() {
    outcome(vec![(0, 3)], handled_all()).assert_holds();
}

#[test]
#[should_panic(expected = "never handled")]
fn an_unhandled_record_is_caught() {
    let mut f = Figures::default();
    f.handle((0, 0));
    outcome(vec![(0, 3)], f).assert_holds();
}

#[test]
#[should_panic(expected = "handled again")]
fn a_handling_after_an_ack_is_caught() {
    let mut f = handled_all();
    f.take("A 0 1").unwrap();
    f.take("H 0 1").unwrap();
    outcome(vec![(0, 3)], f).assert_holds();
}

#[test]
#[should_panic(expected = "dead-lettered twice")]
fn a_double_dead_letter_is_caught() {
    outcome(vec![(0, 3), (0, 3)], handled_all()).assert_holds();
}

#[test]
#[should_panic(expected = "exactly the poisoned")]
fn a_missing_dead_letter_is_caught() {
    outcome(vec![], handled_all()).assert_holds();
}
