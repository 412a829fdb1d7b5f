"""The experimental Rust front end (--interface rust): docs/rust-front.md."""
