//! Placeholder replaced by the Rust helper.
