//! What can go wrong opening or running an engine.

use std::path::PathBuf;

use ork_exec::ExecError;

/// What can go wrong opening or running an engine. Each variant names the file (and, through its
/// source, the tensor) it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The GGUF cannot be opened or parsed.
    #[error(transparent)]
    Gguf(#[from] ork_gguf::GgufError),
    /// The calibration text for smoothing (`--calib`) cannot be used: missing, unreadable,
    /// not UTF-8 or empty.
    #[error("calibration file {}: {what}", path.display())]
    Calibration {
        /// The calibration file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The model's weight manifest cannot be derived.
    #[error(transparent)]
    Manifest(#[from] ork_manifest::ManifestError),
    /// The model (configuration, tensors, tokenizer, template) cannot be loaded.
    #[error("{}", model.display())]
    Model {
        /// The GGUF file.
        model: PathBuf,
        /// The executor's error.
        #[source]
        source: ExecError,
    },
    /// A weight cannot be planned (a tensor that is no matmul weight).
    #[error("{}", model.display())]
    Plan {
        /// The GGUF file.
        model: PathBuf,
        /// The store's error naming the tensor.
        #[source]
        source: ork_store::StoreError,
    },
    /// The budget cannot hold the largest weight.
    #[error(
        "{}: a weight budget of {budget_mib} MiB cannot hold weight '{weight}' ({weight_mib:.1} MiB); \
         the minimum budget is {min_mib} MiB",
        model.display()
    )]
    BudgetTooSmall {
        /// The GGUF file.
        model: PathBuf,
        /// The budget per domain, MiB.
        budget_mib: u64,
        /// The largest weight.
        weight: String,
        /// Its device size, MiB.
        weight_mib: f64,
        /// The smallest budget that runs the model, MiB.
        min_mib: u64,
    },
    /// A budget setting is not usable.
    #[error("{what}")]
    Budget {
        /// What is wrong.
        what: String,
    },
    /// The `.orkpack` cannot be prepared.
    #[error("preparing the weight cache {}", path.display())]
    Pack {
        /// The `.orkpack` path.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: ork_store::StoreError,
    },
    /// The weight cache cannot be set up (pinning, placement).
    #[error(transparent)]
    Residency(#[from] ork_residency::ResidencyError),
    /// The chip the run models cannot run the weights' matmuls in the asked precision (e.g.
    /// fp16 activations × int8 weights on the RK3588): refused before anything is converted.
    #[error("{}: {source}; {hint}", model.display())]
    Chip {
        /// The GGUF file.
        model: PathBuf,
        /// What to use instead.
        hint: String,
        /// The device layer's refusal, naming the chip, the type pair and the limit.
        #[source]
        source: ork_device::DeviceError,
    },
    /// The draft model cannot be opened or used (`--draft MODEL.gguf`): unreadable, not a model
    /// ork runs, or a vocabulary other than the model's ([`ExecError::DraftVocabMismatch`]).
    #[error("draft {}", draft.display())]
    DraftModel {
        /// The draft's GGUF file.
        draft: PathBuf,
        /// The executor's error.
        #[source]
        source: ExecError,
    },
    /// The draft's resident weights and the model's smallest working set do not fit the budget
    /// together.
    #[error(
        "{}: the draft ({draft}) keeps {draft_mib:.1} MiB resident and the model needs at least \
         {model_min_mib:.1} MiB beside it, but the weight budget is {budget_mib} MiB: use a budget \
         of at least {need_mib} MiB or a smaller draft",
        model.display()
    )]
    DraftTooLarge {
        /// The GGUF file.
        model: PathBuf,
        /// Which draft (`self:N` or the draft's file).
        draft: String,
        /// The draft's resident bytes, MiB.
        draft_mib: f64,
        /// The model's largest remaining weight, MiB.
        model_min_mib: f64,
        /// The budget per domain, MiB.
        budget_mib: u64,
        /// The smallest budget that holds both, MiB.
        need_mib: u64,
    },
    /// The device cannot be opened or configured.
    #[error("{what}")]
    Device {
        /// What was being done.
        what: String,
        /// The device's error, if it gave one.
        #[source]
        source: Option<ork_device::DeviceError>,
    },
    /// The CPU engine cannot open (a weight type it has no kernel for, a shape its blocks do
    /// not fit, thread or core settings), naming the file and tensor.
    #[error(transparent)]
    Cpu(#[from] ork_cpu::CpuError),
    /// A pairing of engines per phase that cannot run (`--prefill-device`, `--decode-device`):
    /// two different devices, the CPU engine without its options, an option one of the engines
    /// refuses.
    #[error("engines per phase: {what}")]
    Phases {
        /// What is wrong, and what to do instead.
        what: String,
    },
    /// An option the CPU engine does not take (`--draft`, `--calib` …) was given with it.
    #[error("{option} does not apply to --device cpu: {why}")]
    CpuOption {
        /// The option.
        option: &'static str,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A draft that runs on the device was asked of an engine opened without it
    /// ([`crate::DraftKind::drafter`]; the engine's configuration names its draft).
    #[error("the engine was opened without the draft ({draft})")]
    NoDraft {
        /// The draft asked for.
        draft: String,
    },
}
