//! Errors of the residency layer.

/// What can go wrong keeping weights resident.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResidencyError {
    /// A weight the caller asked for is not a matmul weight of the model / pack.
    #[error("weight '{name}' is not in {source_desc}")]
    UnknownWeight {
        /// Tensor name.
        name: String,
        /// Where it was looked for.
        source_desc: String,
    },
    /// The budget cannot hold even one weight (plus the pinned ones).
    #[error(
        "weight budget {budget_mib:.1} MiB is too small: weight '{name}' needs {need_mib:.1} MiB \
         (pinned weights hold {pinned_mib:.1} MiB); the minimum budget is {min_mib} MiB"
    )]
    BudgetTooSmall {
        /// The weight that does not fit.
        name: String,
        /// Budget in MiB.
        budget_mib: f64,
        /// The weight's device bytes in MiB.
        need_mib: f64,
        /// Bytes pinned in MiB.
        pinned_mib: f64,
        /// The smallest budget (MiB, rounded up) that would work.
        min_mib: u64,
    },
    /// The device's window stayed full after everything evictable was evicted.
    #[error("weight '{name}': device window full with nothing left to evict: {source}")]
    WindowExhausted {
        /// Tensor name.
        name: String,
        /// The device's error.
        source: ork_device::DeviceError,
    },
    /// Loading a weight from the .orkpack failed.
    #[error(transparent)]
    Store(#[from] ork_store::StoreError),
    /// Packing a weight from the GGUF failed.
    #[error("packing '{name}': {source}")]
    Pack {
        /// Tensor name.
        name: String,
        /// The pack error (boxed: it is much larger than the other variants).
        source: Box<ork_pack::PackError>,
    },
    /// A device operation failed.
    #[error("weight '{name}': {source}")]
    Device {
        /// Tensor name (or the operation).
        name: String,
        /// The device's error.
        source: ork_device::DeviceError,
    },
    /// Shapes of a matmul call do not match the weight.
    #[error("matmul with '{name}': {what}")]
    Shape {
        /// Tensor name.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// An `.orkpack`'s weights are not those of the model's manifest (a weight missing, one
    /// too many, or a shape that differs): found when the pack is opened as a source.
    #[error("{}: weight '{tensor}': {problem}", path.display())]
    PackMismatch {
        /// The `.orkpack`.
        path: std::path::PathBuf,
        /// The tensor (entry name, `TENSOR#EXPERT` for an expert slice).
        tensor: String,
        /// What differs.
        problem: String,
    },
    /// The placement cannot be realised (e.g. more domains than the device has).
    #[error("placement: {0}")]
    Placement(String),
}
