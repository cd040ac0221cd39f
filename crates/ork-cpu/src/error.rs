//! What can go wrong opening the CPU engine.

use std::path::PathBuf;

/// Why the CPU engine cannot open. Every variant names the file and, for a weight, the tensor
/// (`TENSOR#EXPERT` for an expert's slice).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CpuError {
    /// A weight the model needs is not in the file (or, for `TENSOR#EXPERT`, the tensor has no
    /// such expert, or its bytes do not split into its experts).
    #[error("{}: tensor '{tensor}' is missing (or its expert slice does not exist)", path.display())]
    MissingTensor {
        /// The GGUF file.
        path: PathBuf,
        /// The weight's name.
        tensor: String,
    },
    /// The weight is stored in a type the CPU engine has no kernel for.
    #[error(
        "{}: tensor '{tensor}' is {ty}, which the CPU engine cannot compute (it computes {known})",
        path.display()
    )]
    UnsupportedType {
        /// The GGUF file.
        path: PathBuf,
        /// The weight's name.
        tensor: String,
        /// ggml's name of the type.
        ty: String,
        /// The types it computes on this CPU.
        known: String,
    },
    /// The weight's shape does not fit its type or what the model expects: K not a multiple of
    /// the type's block, dims other than the model's, or a byte length other than the shape's.
    #[error("{}: tensor '{tensor}': {what}", path.display())]
    BadShape {
        /// The GGUF file.
        path: PathBuf,
        /// The weight's name.
        tensor: String,
        /// What does not match.
        what: String,
    },
    /// The thread or core settings cannot be used (`--threads`, `--cpus`).
    #[error("CPU threads: {what}")]
    Threads {
        /// What is wrong.
        what: String,
    },
    /// The worker threads cannot be started or pinned.
    #[error("CPU threads: {what}")]
    Pool {
        /// What failed.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file has expert tensors but its routing (`{arch}.expert_count`,
    /// `{arch}.expert_used_count`) cannot be read: the expert reader sizes what it keeps in the
    /// page cache by it.
    #[error("{}: the experts' routing cannot be read: {what}", path.display())]
    Routing {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// `--pin-mb` asks to keep more expert bytes in RAM than the machine has.
    #[error(
        "--pin-mb: {} MiB asked to be kept resident, but this machine has {} MiB of RAM",
        pin_bytes >> 20,
        ram_bytes >> 20
    )]
    PinAboveRam {
        /// The pin budget asked for.
        pin_bytes: u64,
        /// `MemTotal` of `/proc/meminfo`.
        ram_bytes: u64,
    },
}
