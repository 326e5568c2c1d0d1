//! Wake-ups for live subscriptions: one connection per bus that `LISTEN`s on
//! the channel of each subscribed topic and rings the topic's doorbells on
//! each `NOTIFY`. A notification carries no record (only `partition:offset`):
//! subscribers read from the table by offset, so a notification missed while
//! the connection was down loses nothing. After a reconnect every doorbell
//! is rung once, and the subscriptions read what they missed.

use std::sync::Arc;
use std::time::Duration;

use bus_core::BusError;
use futures::StreamExt;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, NoTls, Socket};

use crate::errors::pg;
use crate::shared::{Shared, Topic};

const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

fn listen_sql(channel: &str) -> String {
    // Channel names are `bus_` + hex (see `Topic::new`): safe to quote.
    format!("LISTEN \"{channel}\"")
}

/// Makes sure the listening connection `LISTEN`s on `topic`'s channel before
/// the subscription reads its start positions, so no commit after that read
/// goes unnoticed.
pub(crate) async fn listen(shared: Arc<Shared>, topic: Arc<Topic>) -> Result<(), BusError> {
    let listener = &shared.listener;
    let fresh = listener
        .channels()
        .entry(topic.channel.clone())
        .or_default()
        .insert(topic.spec.name.clone());
    let mut client = listener.client.lock().await;
    if client.as_ref().is_none_or(Client::is_closed) {
        // Connecting LISTENs on every channel, this one included.
        *client = Some(connect(&shared).await?);
        return Ok(());
    }
    // Channels whose subscriptions were all dropped stop listening here.
    let idle: Vec<String> = {
        let mut channels = listener.channels();
        let idle: Vec<String> = channels
            .iter()
            .filter(|(_, topics)| !topics.iter().any(|t| listener.bells.has_listeners(t)))
            .map(|(channel, _)| channel.clone())
            .filter(|channel| *channel != topic.channel)
            .collect();
        for channel in &idle {
            channels.remove(channel);
        }
        idle
    };
    let mut sql: String = idle.iter().map(|c| format!("UNLISTEN \"{c}\";")).collect();
    if fresh {
        sql.push_str(&listen_sql(&topic.channel));
    }
    if !sql.is_empty()
        && let Some(client) = client.as_ref()
    {
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| pg("LISTEN", &e))?;
    }
    Ok(())
}

/// Opens the listening connection, `LISTEN`s on every known channel and
/// spawns the task that drives it.
async fn connect(shared: &Arc<Shared>) -> Result<Client, BusError> {
    let client = match &shared.tls {
        Some(tls) => drive(shared, tls.clone()).await?,
        None => drive(shared, NoTls).await?,
    };
    let channels: Vec<String> = shared.listener.channels().keys().cloned().collect();
    let sql: String = channels.iter().map(|c| listen_sql(c) + ";").collect();
    if !sql.is_empty() {
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| pg("LISTEN", &e))?;
    }
    Ok(client)
}

/// Connects with `tls` and spawns the task that rings on notifications and
/// reconnects when the connection ends.
async fn drive<T>(shared: &Arc<Shared>, tls: T) -> Result<Client, BusError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = shared
        .options
        .config
        .connect(tls)
        .await
        .map_err(|e| pg("listen: connect", &e))?;
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            let Some(shared) = weak.upgrade() else { return };
            match message {
                Ok(AsyncMessage::Notification(note)) => {
                    shared.listener.ring_channel(note.channel())
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!("bus-postgres: listening connection lost: {error}");
                    break;
                }
            }
        }
        if let Some(shared) = weak.upgrade() {
            reconnect(shared).await;
        }
    });
    Ok(client)
}

/// After the listening connection died: every subscription reads once (its
/// read fails while the server is down, and it retries on its own), then
/// connect again with backoff and ring again, so what was committed in
/// between is read.
fn reconnect(shared: Arc<Shared>) -> futures::future::BoxFuture<'static, ()> {
    // Boxed: `connect` spawns this, and this awaits `connect`.
    Box::pin(reconnect_loop(shared))
}

async fn reconnect_loop(shared: Arc<Shared>) {
    shared.listener.bells.ring_all();
    let mut pause = RECONNECT_FIRST;
    loop {
        tokio::time::sleep(pause).await;
        {
            let mut client = shared.listener.client.lock().await;
            if client.as_ref().is_some_and(|c| !c.is_closed()) {
                return;
            }
            match connect(&shared).await {
                Ok(fresh) => {
                    *client = Some(fresh);
                    tracing::info!("bus-postgres: listening connection restored");
                    drop(client);
                    shared.listener.bells.ring_all();
                    return;
                }
                Err(error) => tracing::debug!("bus-postgres: listen reconnect failed: {error}"),
            }
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}
