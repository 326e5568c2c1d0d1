//! UIDs on disk and in memory, for dedup and `find_event_by_uid`: the
//! in-memory UID map and index, the per-segment UID tables, the partition's
//! locator, and the keyed hash they all use against chosen UIDs.

pub(crate) mod index;
pub(crate) mod keyed;
pub(crate) mod locator;
pub(crate) mod map;
pub(crate) mod table;
