//! The read side of the log that takes no lease and moves no cursor: reads
//! by offset, partition discovery, and (later) traces and the analytics
//! family (issue 28). Two readers asking the same question get the same
//! answer, and no consumer group notices them.

pub mod changed;
pub mod fetch;
