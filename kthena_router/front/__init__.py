"""The Rust front end (--interface rust, auto's usual choice): docs/rust-front.md."""
