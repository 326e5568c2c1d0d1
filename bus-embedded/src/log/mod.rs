//! The log of a partition on disk: frames, segment files, their sparse
//! offset indexes, the recovery point, and the codecs of compressed frames.
//! Nothing here knows of UIDs' tables or of partitions (`uid` and
//! `partition` build on it).

pub(crate) mod checkpoint;
pub(crate) mod codec;
pub(crate) mod frame;
pub(crate) mod index;
pub(crate) mod segment;
