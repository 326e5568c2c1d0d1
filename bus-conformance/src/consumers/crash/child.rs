//! The child's side of the kill -9 harness: who it is, the protocol lines,
//! the consume loop.

use std::io::Write;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bus_core::consumer::{ConsumeOptions, Consumer, Delivery, DurableConsumers};
use bus_core::{BusError, EventBus, Selector, StartAt};

use super::{CHILD_VAR, CONSUMER, CrashError, Mode, Plan, Producer, ROUND_VAR, publish_round};

/// Who this child is, from its environment.
#[derive(Debug, Clone, Copy)]
pub struct Role {
    /// What it does.
    pub mode: Mode,
    /// Its round (the records its producer publishes).
    pub round: u64,
}

/// This process's [`Role`], `None` unless the parent set [`CHILD_VAR`]
/// (then the child's `#[test]` returns at once).
///
/// # Errors
/// When the variables are set but malformed.
pub fn role() -> Result<Option<Role>, CrashError> {
    let Ok(mode) = std::env::var(CHILD_VAR) else {
        return Ok(None);
    };
    let mode = match mode.as_str() {
        "consume" => Mode::Consume,
        "drain" => Mode::Drain,
        other => return Err(CrashError::Protocol(format!("{CHILD_VAR}={other:?}"))),
    };
    let round = var(ROUND_VAR)?
        .parse()
        .map_err(|_| CrashError::Protocol(format!("{ROUND_VAR} is not a number")))?;
    Ok(Some(Role { mode, round }))
}

/// A variable the parent passed to the child.
///
/// # Errors
/// When it is not set.
pub fn var(name: &str) -> Result<String, CrashError> {
    std::env::var(name).map_err(|_| CrashError::Protocol(format!("{name} is not set")))
}

/// Prints one protocol line, flushed at once: a kill may come next.
///
/// # Errors
/// When stdout is gone.
pub fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}")?;
    out.flush()
}

/// The plain ack: what every backend does unless it acks elsewhere.
///
/// # Errors
/// The ack's.
pub fn plain_ack(consumer: &mut Consumer, delivery: &Delivery) -> Result<(), BusError> {
    consumer.ack(delivery)
}

/// Opens `worker` with `options` plus the dead-letter topic, retrying a
/// transient error for [`Plan::open_retry`] (what a careful user does).
fn open<B>(bus: &B, plan: &Plan, options: ConsumeOptions) -> Result<Consumer, BusError>
where
    B: DurableConsumers + ?Sized,
{
    let options = options.dead_letter(plan.dead_letter);
    let opened = Instant::now();
    loop {
        let outcome = bus.consume(
            plan.topic,
            CONSUMER,
            Selector::Topic,
            StartAt::Beginning,
            options.clone(),
        );
        match outcome {
            Err(error)
                if error.is_transient()
                    && plan
                        .open_retry
                        .is_some_and(|retry| opened.elapsed() < retry) =>
            {
                eprintln!("consume: {error} (transient, retrying)");
                std::thread::park_timeout(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// The child's body: opens the consumer, publishes the round from a thread
/// when [`Plan::producer`] says so, and handles every record (`nack` for a
/// poisoned one, `ack` for the others), printing the protocol. A
/// consuming child returns only on an error (the parent kills it); a
/// draining one when nothing came for [`Plan::drain_idle`].
///
/// # Errors
/// The first failed bus call, the producer's included (a refused ack after
/// its `F` line).
pub fn run_child<B>(
    bus: &B,
    plan: &Plan,
    role: Role,
    options: ConsumeOptions,
    mut ack: impl FnMut(&mut Consumer, &Delivery) -> Result<(), BusError>,
) -> Result<(), CrashError>
where
    B: EventBus + DurableConsumers + ?Sized,
{
    let mut consumer = open(bus, plan, options)?;
    let produce = role.mode == Mode::Consume && plan.producer == Producer::Child;
    // The producer's failure, for the consuming loop to return.
    let failed: Mutex<Option<BusError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        if produce {
            let failed = &failed;
            scope.spawn(move || {
                if let Err(error) = publish_round(bus, plan, role.round) {
                    *failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
                }
            });
        }
        let timeout = match role.mode {
            Mode::Consume => plan.poll,
            Mode::Drain => plan.drain_idle,
        };
        loop {
            if let Some(error) = failed.lock().unwrap_or_else(PoisonError::into_inner).take() {
                return Err(error.into());
            }
            let Some(delivery) = consumer.recv_timeout(timeout)? else {
                if role.mode == Mode::Drain {
                    say("DONE")?;
                    return Ok(());
                }
                continue;
            };
            let (p, o) = (delivery.partition, delivery.offset);
            say(&format!("H {p} {o}"))?;
            if delivery.event.value["poison"] == true {
                consumer.nack(&delivery, "poisoned on purpose")?;
                say(&format!("D {p} {o}"))?;
                continue;
            }
            match ack(&mut consumer, &delivery) {
                Ok(()) => say(&format!("A {p} {o}"))?,
                Err(error @ BusError::Fenced { .. }) => {
                    say(&format!("F {p} {o}"))?;
                    return Err(error.into());
                }
                Err(error) => return Err(error.into()),
            }
        }
    })
}
