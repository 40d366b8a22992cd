//! Rust producer, consumer and admin client. Arrives with the single-node issue.
