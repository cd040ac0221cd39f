//! ork layer 0 — **file rules**: how every other crate opens, maps and writes files.
//!
//! - Input: [`open_regular`] opens only a regular file, without blocking (a FIFO is refused at
//!   once instead of waiting for a writer); [`describe_kind`] names what a path is when it is
//!   not one. [`input::read_input`] reads a small file whole (prompt, calibration text, a
//!   `--project` board file, a saved digest), its size checked before anything is allocated.
//! - Maps: [`GuardedMap`] maps a file read-only and survives the file being cut short while
//!   mapped (a process-wide `SIGBUS` handler, scoped to registered maps).
//! - Signals: [`sigpipe`] lets a command-line run end quietly when its standard output is
//!   closed.
//! - Output: [`output`] is the one atomic writer (a temporary file named [`output::TEMP_PREFIX`]…
//!   in the destination's directory, synced, renamed, the directory synced) and the rule every
//!   output follows (never over an input, a model or a pack; a file in a directory ork owns is
//!   never written through a link).
//!
//! `unsafe` lives only in the map (`mmap.rs`) and in [`sigpipe`]; every block has a
//! `// SAFETY:` comment.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod input;
#[allow(unsafe_code)]
mod mmap;
pub mod output;
mod regular;
#[allow(unsafe_code)]
pub mod sigpipe;
pub mod temp;

pub use mmap::GuardedMap;
pub use regular::{describe_kind, open_regular, OpenRegularError};
