//! The options of a durable consumer and their checks.

use std::time::Duration;

use crate::BusError;

/// What a second `consume` of a consumer that a live instance owns does
/// (C23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerPolicy {
    /// Waits up to this long for the owner to go away, then
    /// [`BusError::Timeout`].
    Wait(Duration),
    /// Fails at once with [`BusError::ConsumerBusy`].
    Fail,
    /// Takes ownership: the previous instance is fenced, its next durable
    /// acknowledgement fails with [`BusError::Fenced`] and advances nothing.
    TakeOver,
}

/// Options of a durable consumer. Defaults: `ack_wait` 30 s, no
/// `max_deliver`, no dead-letter topic, every acknowledgement durable before
/// `ack` returns (`ack_every(1)`), [`OwnerPolicy::Fail`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumeOptions {
    /// How long a delivery may stay unacknowledged before the same instance
    /// delivers it again (C21).
    pub ack_wait: Duration,
    /// After this many deliveries without an acknowledgement a record is
    /// dead-lettered instead of delivered again (C22); needs `dead_letter`.
    pub max_deliver: Option<u32>,
    /// The dead-letter topic (provisioned; refused at open otherwise).
    pub dead_letter: Option<String>,
    /// Write the cursor once this many acknowledgements are pending.
    pub ack_every: u32,
    /// Write the cursor once the oldest pending acknowledgement is this old
    /// (done inside the consumer's calls, `recv` waits included: there is
    /// no timer thread, so a consumer nobody calls writes nothing).
    pub ack_interval: Option<Duration>,
    /// What to do when another live instance owns the consumer.
    pub owner: OwnerPolicy,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            max_deliver: None,
            dead_letter: None,
            ack_every: 1,
            ack_interval: None,
            owner: OwnerPolicy::Fail,
        }
    }
}

impl ConsumeOptions {
    /// Sets `ack_wait` (0 is refused).
    #[must_use]
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// Sets `max_deliver` (0 is refused; needs a dead-letter topic).
    #[must_use]
    pub fn max_deliver(mut self, deliveries: u32) -> Self {
        self.max_deliver = Some(deliveries);
        self
    }

    /// Sets the dead-letter topic.
    #[must_use]
    pub fn dead_letter(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter = Some(topic.into());
        self
    }

    /// Writes the cursor every `n` acknowledgements (0 is refused).
    #[must_use]
    pub fn ack_every(mut self, n: u32) -> Self {
        self.ack_every = n;
        self
    }

    /// Writes the cursor when the oldest pending acknowledgement is `every`
    /// old (0 is refused).
    #[must_use]
    pub fn ack_interval(mut self, every: Duration) -> Self {
        self.ack_interval = Some(every);
        self
    }

    /// Sets the owner policy.
    #[must_use]
    pub fn owner(mut self, policy: OwnerPolicy) -> Self {
        self.owner = policy;
        self
    }

    /// Refuses what no consumer can honour, naming the option.
    pub fn validate(&self) -> Result<(), BusError> {
        if self.ack_wait.is_zero() {
            return Err(BusError::invalid(
                "ack_wait",
                "must be more than 0 (0 would redeliver every record at once)",
            ));
        }
        match (self.max_deliver, &self.dead_letter) {
            (Some(0), _) => {
                return Err(BusError::invalid(
                    "max_deliver",
                    "must be at least 1 (0 would dead-letter every record unseen)",
                ));
            }
            (Some(_), None) => {
                return Err(BusError::invalid(
                    "max_deliver",
                    "needs dead_letter(topic): a record past max_deliver must go somewhere (C22)",
                ));
            }
            _ => {}
        }
        if let Some(topic) = &self.dead_letter {
            crate::validate_topic_name(topic).map_err(|invalid| {
                BusError::invalid("dead_letter", format!("{topic:?}: {}", invalid.0))
            })?;
        }
        if self.ack_every == 0 {
            return Err(BusError::invalid(
                "ack_every",
                "must be at least 1 (1: every acknowledgement durable before ack returns)",
            ));
        }
        if self.ack_interval.is_some_and(|every| every.is_zero()) {
            return Err(BusError::invalid(
                "ack_interval",
                "must be more than 0; leave it unset to write by count only",
            ));
        }
        Ok(())
    }
}
