//! The device layer's error type.

use crate::soc::{ChipLimit, ElemType, Soc};
use crate::{ActPrecision, DomainId};
use ork_pack::PackDtype;

/// Everything that can go wrong in the device layer. Each variant carries what a caller needs to
/// report or react (domain, sizes, offsets); tests match variants, never message text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A buffer of zero bytes was requested (the driver rejects it too).
    #[error("zero-size buffer requested in domain {domain}")]
    ZeroSize {
        /// Domain the buffer was meant for.
        domain: DomainId,
    },
    /// The buffer can never fit: it is larger than the usable part of one domain's window.
    #[error("buffer of {requested} bytes exceeds the {usable} usable bytes of a domain window")]
    Oversize {
        /// Bytes requested.
        requested: u64,
        /// Usable bytes of a window (window minus reserved regions).
        usable: u64,
    },
    /// The domain id is not one this device has (ids run `0..domains`, at most 16).
    #[error("unknown IOMMU domain {domain} (device has {domains})")]
    UnknownDomain {
        /// The id asked for.
        domain: DomainId,
        /// Number of domains the device has.
        domains: u32,
    },
    /// The domain's 4 GiB IOVA window has no free range that fits the buffer (full or
    /// fragmented). This is what the vendor driver reports as `EFAULT` (errno 14, "Bad address")
    /// from MEM_CREATE.
    #[error(
        "IOVA window of domain {domain} full: {requested} bytes (alignment {align}) do not fit; \
         {resident} bytes resident, largest free range {largest_free} bytes (driver: errno 14 EFAULT)"
    )]
    WindowFull {
        /// Domain whose window is full.
        domain: DomainId,
        /// Bytes requested (page-rounded).
        requested: u64,
        /// Alignment the allocation needed.
        align: u64,
        /// Bytes currently allocated in that window (reserved regions excluded).
        resident: u64,
        /// Largest free range in the window, before alignment.
        largest_free: u64,
    },
    /// A task's operands do not all live in the task's domain.
    #[error("{operand} lives in domain {operand_domain}, the task runs in domain {task_domain}")]
    CrossDomain {
        /// Which operand is in the wrong domain.
        operand: &'static str,
        /// The task's domain (the weight's).
        task_domain: DomainId,
        /// The operand's domain.
        operand_domain: DomainId,
    },
    /// A buffer created by another device instance was passed to this one.
    #[error("{operand} was created by another device")]
    ForeignBuffer {
        /// Which operand.
        operand: &'static str,
    },
    /// An operand's length does not match the task's shape.
    #[error("{operand}: expected {expected} elements, got {got}")]
    Length {
        /// Which operand ("activations", "activation scales", "output", "weight bytes",
        /// "weight scales").
        operand: &'static str,
        /// Elements (bytes for "weight bytes") the shape requires.
        expected: usize,
        /// Elements supplied.
        got: usize,
    },
    /// A task shape the device cannot run.
    #[error("bad matmul shape m={m} k={k} n={n}: {reason}")]
    Shape {
        /// Rows of activations.
        m: usize,
        /// Reduction dim.
        k: usize,
        /// Output channels.
        n: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The raw (i32 accumulator) matmul was asked for operands that are not both integer (an
    /// fp16 weight, or fp16 activations).
    #[error("raw i32 matmul needs integer operands, got a {dtype:?} weight and {} activations", activations.name())]
    NotInteger {
        /// The weight's dtype.
        dtype: PackDtype,
        /// The activations' precision.
        activations: ActPrecision,
    },
    /// The modelled chip cannot run this matmul: no such type pair, no per-group mode for it, or
    /// a K / N limit (see `docs/chip.md`).
    #[error("{soc} cannot run an {a} × {b} matmul with k={k} n={n}: {limit}")]
    Chip {
        /// The chip.
        soc: Soc,
        /// Activation type.
        a: ElemType,
        /// Weight type.
        b: ElemType,
        /// Reduction dim of the task.
        k: usize,
        /// Output channels of the task.
        n: usize,
        /// What the chip refuses.
        limit: ChipLimit,
    },
    /// A SoC name that is not one ork models ("rk3588", "rk3576").
    #[error("unknown SoC '{name}' (known: rk3588, rk3576)")]
    UnknownSoc {
        /// The name given.
        name: String,
    },
    /// The core mask names cores the device does not have.
    #[error("core mask {mask:#x} invalid for a device with {cores} cores")]
    BadCoreMask {
        /// The mask given.
        mask: u32,
        /// Cores the device has.
        cores: u32,
    },
    /// A view's range lies outside its buffer.
    #[error("view {offset}+{len} outside a buffer of {size} bytes")]
    OutOfRange {
        /// Offset of the view.
        offset: u64,
        /// Length of the view.
        len: u64,
        /// Size of the buffer.
        size: u64,
    },
    /// A backend's buffer record maps fewer host bytes than the buffer's size (a backend bug,
    /// caught when the buffer is built).
    #[error("backend buffer maps {mapped} host bytes, the buffer has {size}")]
    HostMapTooShort {
        /// Bytes of the buffer.
        size: u64,
        /// Bytes its host mapping has.
        mapped: u64,
    },
    /// The device (or its driver) is not present on this machine.
    #[error("device not found: {what}")]
    NotFound {
        /// What was looked for and where.
        what: String,
    },
    /// The backend does not implement this operation.
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What is missing.
        what: &'static str,
    },
    /// `ORK_KERNEL` names a kernel that does not exist or that this CPU cannot run.
    #[error(transparent)]
    Kernel(#[from] crate::kernel::KernelChoiceError),
    /// A device configuration that cannot work.
    #[error("bad device configuration: {reason}")]
    BadConfig {
        /// What is wrong.
        reason: &'static str,
    },
    /// Host memory for a buffer's mapping could not be obtained.
    #[error("host mapping of {size} bytes failed: {source}")]
    HostMemory {
        /// Bytes requested.
        size: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// A driver call failed.
    #[error("{op} failed: {source}")]
    Driver {
        /// Which call (ioctl name or syscall).
        op: &'static str,
        /// The OS error (errno).
        source: std::io::Error,
    },
    /// The vendor runtime library (`librknnrt.so`, or `ORK_RKNN_LIB`) did not load, or lacks a
    /// symbol ork calls.
    #[error("runtime library {library}: {}{reason}", symbol.map(|s| format!("symbol {s} missing: ")).unwrap_or_default())]
    Library {
        /// The path or name tried.
        library: String,
        /// The missing symbol, if the library loaded.
        symbol: Option<&'static str>,
        /// What the dynamic loader said.
        reason: String,
    },
    /// The vendor runtime is older than a feature ork needs (per-context IOMMU domains need
    /// 2.0.0, dynamic M shapes 2.1.0).
    #[error("runtime library {library} is {found}; ork needs runtime {needed} or newer (IOMMU domain per matmul context, dynamic shapes): update librknnrt.so")]
    RuntimeTooOld {
        /// The library.
        library: String,
        /// The version it reports (or which symbol it lacks).
        found: String,
        /// The oldest version that works.
        needed: &'static str,
    },
    /// A vendor runtime call returned an error code (or NULL for a memory object: code
    /// `i32::MIN`).
    #[error("{call} failed with code {code} ({})", crate::rknn::sys::code_name(*code))]
    Runtime {
        /// The C function.
        call: &'static str,
        /// Its return code (`RKNN_ERR_*`).
        code: i32,
    },
}
