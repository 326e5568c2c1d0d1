//! C21/C22 under kill -9, on the shared harness
//! (`bus_conformance::consumers::crash`): a child process (this test binary
//! re-invoked) publishes from a producer thread while a durable consumer in
//! the same process handles each record (prints `H`), then acknowledges it
//! (prints `A` once the ack is durable: `ack_every(1)`) or, for the records
//! poisoned on purpose, dead-letters it (prints `D` once `nack` returned).
//! The parent kills the child at random moments over many rounds, then
//! lets a last child drain the topic, and checks: every record handled at
//! least once; none handled again after its durable ack; the dead-letter
//! topic holds exactly the poisoned records, once each; no lag left.
#![allow(clippy::unwrap_used)]

use bus_conformance::consumers::crash::{self, Plan, Producer, Run};
use bus_core::EventBus;
use bus_core::consumer::ConsumeOptions;
use bus_embedded::EmbeddedBus;

/// The producer runs in the consuming child: the embedded log has one
/// writer per directory, and the consumer writes dead letters.
const PLAN: Plan = Plan {
    producer: Producer::Child,
    ..Plan::new("embedded")
};

/// The child's body; a no-op unless the parent set `BUS_CONSUMER_CHILD`.
#[test]
fn consumer_child_process() {
    let Some(role) = crash::role().unwrap() else {
        return;
    };
    let bus = EmbeddedBus::open(crash::var("BUS_CONSUMER_DIR").unwrap()).unwrap();
    crash::run_child(
        &bus,
        &PLAN,
        role,
        ConsumeOptions::default(),
        crash::plain_ack,
    )
    .unwrap();
}

#[test]
fn kill_nine_mid_consume_loses_nothing_and_repeats_no_durable_ack() {
    let dir = tempfile::tempdir().unwrap();
    // Provisioned by a bus closed again before the first child opens the
    // directory (one writer per directory).
    {
        let bus = EmbeddedBus::open(dir.path()).unwrap();
        bus.provision(&PLAN.manifest()).unwrap();
    }
    let env = vec![(
        "BUS_CONSUMER_DIR".to_owned(),
        dir.path().display().to_string(),
    )];
    let mut run = Run::new(&PLAN, env);
    run.all_rounds_and_drain().unwrap();
    // Opened only now: the children were the directory's one writer.
    let bus = EmbeddedBus::open(dir.path()).unwrap();
    let outcome = run.finish(&bus).unwrap();
    eprintln!("{}", outcome.summary());
    outcome.assert_holds();
}
