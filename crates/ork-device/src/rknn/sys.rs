//! The vendor runtime's matmul API (`librknnrt.so`) as Rust sees it: the C structs, the constants,
//! the library loaded at run time with `libloading`, and one safe wrapper per call.
//!
//! All of `rknn`'s `unsafe` is in this module. The declarations restate `rknn_matmul_api.h` and
//! `rknn_api.h` of rknn-toolkit2 2.3.2; the sizes and field offsets are pinned below by
//! compile-time assertions and listed in `docs/rknn.md`. The structs are public so that the CI
//! stand-in runtime (`crates/ork-rknn-standin`) exports exactly these layouts.
//!
//! Every call whose `int` return is not 0 becomes [`DeviceError::Runtime`] naming the call and
//! the code; a `rknn_tensor_mem*` call that returns NULL becomes the same with code
//! [`NULL_MEM`]. A library that does not load, or lacks a symbol, is [`DeviceError::Library`].

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;

use libloading::Library;

use crate::DeviceError;

/// `rknn_matmul_ctx` / `rknn_context` on 64-bit targets.
pub type RknnContext = u64;

// `rknn_api.h` declares `rknn_context` as `uint32_t` on 32-bit ARM and `uint64_t` elsewhere, and
// `rknn_tensor_mem` / `rknn_quant_params` hold pointers: every layout here is the 64-bit one
// (pinned below). A 32-bit build would pass the wrong types across the C boundary, so it is
// refused here rather than miscompiled (docs/rknn.md, "Targets").
#[cfg(not(target_pointer_width = "64"))]
compile_error!(
    "ork's rknn backend follows the 64-bit layouts of rknn_api.h (rknn_context is uint32_t on \
     32-bit ARM); build for aarch64-unknown-linux-gnu"
);

/// `rknn_matmul_type` values.
pub mod mm_type {
    /// fp16 × fp16 → fp32.
    pub const FLOAT16_MM_FLOAT16_TO_FLOAT32: i32 = 1;
    /// int8 × int8 → int32.
    pub const INT8_MM_INT8_TO_INT32: i32 = 2;
    /// fp16 × int8 → fp32 (RK3576).
    pub const FLOAT16_MM_INT8_TO_FLOAT32: i32 = 5;
    /// fp16 × int4 → fp32 (RK3576).
    pub const FLOAT16_MM_INT4_TO_FLOAT32: i32 = 7;
    /// int8 × int8 → fp32 (the per-group mode's type).
    pub const INT8_MM_INT8_TO_FLOAT32: i32 = 9;
    /// int4 × int4 → int16.
    pub const INT4_MM_INT4_TO_INT16: i32 = 10;
    /// int8 × int4 → int32 (RK3576).
    pub const INT8_MM_INT4_TO_INT32: i32 = 11;
}

/// `rknn_matmul_layout`: row-major.
pub const LAYOUT_NORM: i16 = 0;
/// `rknn_matmul_layout`: the NPU's native tiled layout.
pub const LAYOUT_NATIVE: i16 = 1;
/// `rknn_matmul_quant_type`: one scale for the whole tensor.
pub const QUANT_PER_LAYER_SYM: i16 = 0;
/// `rknn_matmul_quant_type`: one scale per output channel.
pub const QUANT_PER_CHANNEL_SYM: i16 = 2;
/// `rknn_matmul_quant_type`: one scale per output channel and group of K (runtime ≥ 2.1.0).
pub const QUANT_PER_GROUP_SYM: i16 = 4;

/// `rknn_tensor_type` values used in tensor attributes.
pub mod tensor_type {
    /// fp32.
    pub const FLOAT32: i32 = 0;
    /// fp16.
    pub const FLOAT16: i32 = 1;
    /// int8.
    pub const INT8: i32 = 2;
    /// int16.
    pub const INT16: i32 = 4;
    /// int32.
    pub const INT32: i32 = 6;
    /// int4.
    pub const INT4: i32 = 10;
}

/// `rknn_create_mem2` flags.
pub mod mem_flags {
    /// CPU-cached memory (syncs needed).
    pub const CACHEABLE: u64 = 1;
    /// Uncached memory.
    pub const NON_CACHEABLE: u64 = 2;
}

/// `rknn_mem_sync` mode: CPU writes → device.
pub const SYNC_TO_DEVICE: c_int = 1;
/// `rknn_mem_sync` mode: device writes → CPU.
pub const SYNC_FROM_DEVICE: c_int = 2;

/// `rknn_query` command for [`SdkVersion`] (`RKNN_QUERY_SDK_VERSION`).
pub const QUERY_SDK_VERSION: c_int = 5;

/// The code [`DeviceError::Runtime`] carries when a call that returns a `rknn_tensor_mem*`
/// returned NULL (the runtime gives no code then).
pub const NULL_MEM: i32 = i32::MIN;

/// Error codes of `rknn_api.h` (`RKNN_ERR_*`), for messages and the stand-in.
pub mod err {
    /// Unspecified failure.
    pub const FAIL: i32 = -1;
    /// Out of memory.
    pub const MALLOC_FAIL: i32 = -4;
    /// A parameter is invalid.
    pub const PARAM_INVALID: i32 = -5;
    /// The context is invalid.
    pub const CTX_INVALID: i32 = -7;
    /// An input is invalid.
    pub const INPUT_INVALID: i32 = -8;
    /// An output is invalid.
    pub const OUTPUT_INVALID: i32 = -9;
    /// The device does not match the runtime (update the runtime and the driver).
    pub const DEVICE_UNMATCH: i32 = -10;
    /// A pre-compiled model is incompatible with the driver (the header spells it
    /// `INCOMPATILE`).
    pub const INCOMPATILE_PRE_COMPILE_MODEL: i32 = -11;
    /// A model's optimization level is incompatible with the driver.
    pub const INCOMPATILE_OPTIMIZATION_LEVEL_VERSION: i32 = -12;
    /// A model's target platform does not match this chip.
    pub const TARGET_PLATFORM_UNMATCH: i32 = -13;
}

/// What an `RKNN_ERR_*` code means, for error messages (the names as `rknn_api.h` spells them,
/// its `INCOMPATILE` typo included, so that they can be searched for).
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "RKNN_SUCC",
        -1 => "RKNN_ERR_FAIL",
        -2 => "RKNN_ERR_TIMEOUT",
        -3 => "RKNN_ERR_DEVICE_UNAVAILABLE",
        -4 => "RKNN_ERR_MALLOC_FAIL",
        -5 => "RKNN_ERR_PARAM_INVALID",
        -6 => "RKNN_ERR_MODEL_INVALID",
        -7 => "RKNN_ERR_CTX_INVALID",
        -8 => "RKNN_ERR_INPUT_INVALID",
        -9 => "RKNN_ERR_OUTPUT_INVALID",
        -10 => "RKNN_ERR_DEVICE_UNMATCH",
        -11 => "RKNN_ERR_INCOMPATILE_PRE_COMPILE_MODEL",
        -12 => "RKNN_ERR_INCOMPATILE_OPTIMIZATION_LEVEL_VERSION",
        -13 => "RKNN_ERR_TARGET_PLATFORM_UNMATCH",
        NULL_MEM => "returned NULL",
        _ => "unknown code",
    }
}

/// `rknn_matmul_info` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable)]
pub struct MatmulInfo {
    /// Rows of A and C.
    pub m: i32,
    /// Columns of A, rows of B.
    pub k: i32,
    /// Columns of B and C.
    pub n: i32,
    /// `rknn_matmul_type` ([`mm_type`]).
    pub mm_type: i32,
    /// Layout of B ([`LAYOUT_NATIVE`] here).
    pub b_layout: i16,
    /// Quantization of B ([`QUANT_PER_CHANNEL_SYM`], [`QUANT_PER_GROUP_SYM`], …).
    pub b_quant_type: i16,
    /// Layout of A and C ([`LAYOUT_NORM`] here).
    pub ac_layout: i16,
    /// Quantization of A and C (per layer only).
    pub ac_quant_type: i16,
    /// IOMMU domain of the context and its memory (runtime ≥ 2.0.0).
    pub iommu_domain_id: i32,
    /// K values per B scale for per-group quantization (runtime ≥ 2.1.0).
    pub group_size: i16,
    /// Zero.
    pub reserved: [i8; 34],
}

/// `rknn_matmul_tensor_attr` (332 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable)]
pub struct TensorAttr {
    /// NUL-terminated name ("A", "B", "C").
    pub name: [u8; 256],
    /// Dimensions used in `dims`.
    pub n_dims: u32,
    /// Dimensions.
    pub dims: [u32; 16],
    /// Bytes of the tensor.
    pub size: u32,
    /// `rknn_tensor_type` ([`tensor_type`]).
    pub ty: i32,
}

/// `rknn_matmul_io_attr`: the attributes of A, B and C (996 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable)]
pub struct IoAttr {
    /// Activations.
    pub a: TensorAttr,
    /// Weights.
    pub b: TensorAttr,
    /// Output.
    pub c: TensorAttr,
}

/// `rknn_matmul_shape` (12 bytes).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable,
)]
pub struct MatmulShape {
    /// Rows.
    pub m: i32,
    /// Reduction dim.
    pub k: i32,
    /// Columns.
    pub n: i32,
}

/// `rknn_quant_params` (288 bytes on 64-bit targets).
#[repr(C)]
#[derive(Debug)]
pub struct QuantParams {
    /// NUL-terminated tensor name ("B").
    pub name: [u8; 256],
    /// Scales.
    pub scale: *mut f32,
    /// Number of scales.
    pub scale_len: i32,
    /// Zero points (NULL: symmetric).
    pub zp: *mut i32,
    /// Number of zero points.
    pub zp_len: i32,
}

/// `rknn_tensor_mem` (40 bytes on 64-bit targets), owned by the runtime.
#[repr(C)]
#[derive(Debug)]
pub struct TensorMem {
    /// Host address of the memory.
    pub virt_addr: *mut c_void,
    /// Device (IOVA) address.
    pub phys_addr: u64,
    /// dma-buf fd of the memory.
    pub fd: i32,
    /// Offset of this memory inside `fd`.
    pub offset: i32,
    /// Bytes.
    pub size: u32,
    /// Flags it was created with.
    pub flags: u32,
    /// Runtime-private.
    pub priv_data: *mut c_void,
}

/// `rknn_sdk_version` (512 bytes): what `rknn_query(RKNN_QUERY_SDK_VERSION)` fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable)]
pub struct SdkVersion {
    /// Runtime version, e.g. "2.3.2 (429f97ae6b@2025-04-09T09:09:27)".
    pub api_version: [u8; 256],
    /// Driver version, e.g. "0.9.8".
    pub drv_version: [u8; 256],
}

// The layouts as `docs/rknn.md` states them (64-bit targets).
const _: () = {
    assert!(size_of::<MatmulInfo>() == 64);
    assert!(offset_of!(MatmulInfo, mm_type) == 12);
    assert!(offset_of!(MatmulInfo, b_layout) == 16);
    assert!(offset_of!(MatmulInfo, b_quant_type) == 18);
    assert!(offset_of!(MatmulInfo, ac_layout) == 20);
    assert!(offset_of!(MatmulInfo, ac_quant_type) == 22);
    assert!(offset_of!(MatmulInfo, iommu_domain_id) == 24);
    assert!(offset_of!(MatmulInfo, group_size) == 28);
    assert!(offset_of!(MatmulInfo, reserved) == 30);
    assert!(size_of::<TensorAttr>() == 332);
    assert!(offset_of!(TensorAttr, n_dims) == 256);
    assert!(offset_of!(TensorAttr, dims) == 260);
    assert!(offset_of!(TensorAttr, size) == 324);
    assert!(offset_of!(TensorAttr, ty) == 328);
    assert!(size_of::<IoAttr>() == 996);
    assert!(offset_of!(IoAttr, b) == 332);
    assert!(offset_of!(IoAttr, c) == 664);
    assert!(size_of::<MatmulShape>() == 12);
    assert!(size_of::<SdkVersion>() == 512);
};
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<TensorMem>() == 40);
    assert!(offset_of!(TensorMem, phys_addr) == 8);
    assert!(offset_of!(TensorMem, fd) == 16);
    assert!(offset_of!(TensorMem, offset) == 20);
    assert!(offset_of!(TensorMem, size) == 24);
    assert!(offset_of!(TensorMem, flags) == 28);
    assert!(offset_of!(TensorMem, priv_data) == 32);
    assert!(size_of::<QuantParams>() == 288);
    assert!(offset_of!(QuantParams, scale) == 256);
    assert!(offset_of!(QuantParams, scale_len) == 264);
    assert!(offset_of!(QuantParams, zp) == 272);
    assert!(offset_of!(QuantParams, zp_len) == 280);
};

impl MatmulInfo {
    /// All zero (the C demos `memset` it).
    pub fn zeroed() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

impl TensorAttr {
    /// All zero.
    pub fn zeroed() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }

    /// The name up to its NUL.
    pub fn name_str(&self) -> &str {
        c_str(&self.name)
    }
}

impl IoAttr {
    /// All zero.
    pub fn zeroed() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// The text of a NUL-terminated byte array (up to the first NUL; invalid UTF-8 gives "").
pub fn c_str(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap_or("")
}

/// Write `s` into a NUL-terminated byte array (truncated to fit).
pub fn set_c_str(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

type CreateFn = unsafe extern "C" fn(*mut RknnContext, *mut MatmulInfo, *mut IoAttr) -> c_int;
type CreateDynFn = unsafe extern "C" fn(
    *mut RknnContext,
    *mut MatmulInfo,
    c_int,
    *mut MatmulShape,
    *mut IoAttr,
) -> c_int;
type SetShapeFn = unsafe extern "C" fn(RknnContext, *mut MatmulShape) -> c_int;
type SetIoMemFn = unsafe extern "C" fn(RknnContext, *mut TensorMem, *mut TensorAttr) -> c_int;
type SetCoreMaskFn = unsafe extern "C" fn(RknnContext, c_int) -> c_int;
type SetQuantFn = unsafe extern "C" fn(RknnContext, *mut QuantParams) -> c_int;
type CtxFn = unsafe extern "C" fn(RknnContext) -> c_int;
type CreateMem2Fn = unsafe extern "C" fn(RknnContext, u64, u64) -> *mut TensorMem;
type CreateMemFromFdFn =
    unsafe extern "C" fn(RknnContext, i32, *mut c_void, u32, i32) -> *mut TensorMem;
type DestroyMemFn = unsafe extern "C" fn(RknnContext, *mut TensorMem) -> c_int;
type MemSyncFn = unsafe extern "C" fn(RknnContext, *mut TensorMem, c_int) -> c_int;
type QueryFn = unsafe extern "C" fn(RknnContext, c_int, *mut c_void, u32) -> c_int;

/// The symbols ork calls, resolved once when the library is loaded.
struct Fns {
    create: CreateFn,
    create_dynamic_shape: CreateDynFn,
    set_dynamic_shape: SetShapeFn,
    set_io_mem: SetIoMemFn,
    set_core_mask: SetCoreMaskFn,
    set_quant_params: SetQuantFn,
    run: CtxFn,
    destroy: CtxFn,
    create_mem2: CreateMem2Fn,
    create_mem_from_fd: CreateMemFromFdFn,
    destroy_mem: DestroyMemFn,
    mem_sync: MemSyncFn,
    query: QueryFn,
}

/// Symbols that only runtimes from a given version on export: missing, they mean "too old".
const VERSIONED: [(&str, &str); 2] = [
    ("rknn_create_mem2", "2.0.0"),
    ("rknn_matmul_create_dynamic_shape", "2.1.0"),
];

/// The vendor runtime library, loaded. Its functions stay valid while it lives (it is never
/// unloaded before every context and memory object made through it is gone: each holds an `Arc`).
pub struct RuntimeLib {
    /// Path or name it was loaded from.
    path: String,
    fns: Fns,
    _lib: Library,
}

impl std::fmt::Debug for RuntimeLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeLib")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The library file names and paths tried when `ORK_RKNN_LIB` is unset, in order (the first is
/// the dynamic linker's own search).
pub const SEARCH: [&str; 6] = [
    "librknnrt.so",
    "/usr/lib/librknnrt.so",
    "/usr/lib64/librknnrt.so",
    "/usr/lib/aarch64-linux-gnu/librknnrt.so",
    "/usr/local/lib/librknnrt.so",
    "/vendor/lib64/librknnrt.so",
];

impl RuntimeLib {
    /// Load `ORK_RKNN_LIB` if it is set (failing with [`DeviceError::Library`] if it does not
    /// load), else the first of [`SEARCH`] that loads ([`DeviceError::NotFound`] listing what was
    /// tried if none does).
    pub fn load_default() -> Result<Self, DeviceError> {
        if let Some(p) = std::env::var_os("ORK_RKNN_LIB") {
            return Self::load(&p.to_string_lossy());
        }
        let mut tried = Vec::new();
        for cand in SEARCH {
            match Self::load(cand) {
                Ok(lib) => return Ok(lib),
                Err(DeviceError::Library {
                    symbol: None,
                    reason,
                    ..
                }) => tried.push(format!("{cand}: {reason}")),
                Err(e) => return Err(e),
            }
        }
        Err(DeviceError::NotFound {
            what: format!(
                "no vendor runtime library librknnrt.so (ORK_RKNN_LIB unset; tried {})",
                tried.join("; ")
            ),
        })
    }

    /// Load the library at `path` (a path, or a bare name for the dynamic linker's search) and
    /// resolve every symbol ork calls.
    ///
    /// # Errors
    /// [`DeviceError::Library`] naming the library (and the symbol, if one is missing);
    /// [`DeviceError::RuntimeTooOld`] if a symbol that only newer runtimes export is missing.
    pub fn load(path: &str) -> Result<Self, DeviceError> {
        // A path (not a bare name for the linker's search) must be a regular file: `dlopen` of
        // a FIFO waits for a writer forever (the rule of every path ork opens, docs/cli.md).
        if let Some(e) = super::lib_path::not_regular(path) {
            return Err(e);
        }
        // SAFETY: loading a shared library runs its initialisers. The library is the vendor
        // runtime (or ork's stand-in for it) named by the user or found on the usual paths; ork
        // trusts it as it would a library linked at build time.
        let lib = unsafe { Library::new(path) }.map_err(|e| DeviceError::Library {
            library: path.to_string(),
            symbol: None,
            reason: loader_error(&e),
        })?;
        let fns = Fns {
            create: sym(&lib, path, "rknn_matmul_create")?,
            create_dynamic_shape: sym(&lib, path, "rknn_matmul_create_dynamic_shape")?,
            set_dynamic_shape: sym(&lib, path, "rknn_matmul_set_dynamic_shape")?,
            set_io_mem: sym(&lib, path, "rknn_matmul_set_io_mem")?,
            set_core_mask: sym(&lib, path, "rknn_matmul_set_core_mask")?,
            set_quant_params: sym(&lib, path, "rknn_matmul_set_quant_params")?,
            run: sym(&lib, path, "rknn_matmul_run")?,
            destroy: sym(&lib, path, "rknn_matmul_destroy")?,
            create_mem2: sym(&lib, path, "rknn_create_mem2")?,
            create_mem_from_fd: sym(&lib, path, "rknn_create_mem_from_fd")?,
            destroy_mem: sym(&lib, path, "rknn_destroy_mem")?,
            mem_sync: sym(&lib, path, "rknn_mem_sync")?,
            query: sym(&lib, path, "rknn_query")?,
        };
        Ok(RuntimeLib {
            path: path.to_string(),
            fns,
            _lib: lib,
        })
    }

    /// Path or name the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `rknn_matmul_create_dynamic_shape`: a context for `info` (M ignored) and each of
    /// `shapes`; returns the context and the A/B/C attributes of each shape.
    pub fn create_dynamic(
        &self,
        info: &mut MatmulInfo,
        shapes: &mut [MatmulShape],
    ) -> Result<(RknnContext, Vec<IoAttr>), DeviceError> {
        let mut ctx: RknnContext = 0;
        let mut attrs = vec![IoAttr::zeroed(); shapes.len()];
        let n = c_int::try_from(shapes.len()).unwrap_or(c_int::MAX);
        // SAFETY: every pointer is to a live value of the declared C type; `shapes` and `attrs`
        // hold `n` elements each, as the call requires.
        let r = unsafe {
            (self.fns.create_dynamic_shape)(
                &mut ctx,
                info,
                n,
                shapes.as_mut_ptr(),
                attrs.as_mut_ptr(),
            )
        };
        check("rknn_matmul_create_dynamic_shape", r)?;
        Ok((ctx, attrs))
    }

    /// `rknn_matmul_create`: a context for one static shape.
    pub fn create(&self, info: &mut MatmulInfo) -> Result<(RknnContext, IoAttr), DeviceError> {
        let mut ctx: RknnContext = 0;
        let mut attr = IoAttr::zeroed();
        // SAFETY: pointers to live values of the declared C types.
        let r = unsafe { (self.fns.create)(&mut ctx, info, &mut attr) };
        check("rknn_matmul_create", r)?;
        Ok((ctx, attr))
    }

    /// `rknn_matmul_set_dynamic_shape`.
    pub fn set_dynamic_shape(
        &self,
        ctx: RknnContext,
        shape: &MatmulShape,
    ) -> Result<(), DeviceError> {
        let mut s = *shape;
        // SAFETY: a pointer to a live shape; the runtime validates `ctx`.
        let r = unsafe { (self.fns.set_dynamic_shape)(ctx, &mut s) };
        check("rknn_matmul_set_dynamic_shape", r)
    }

    /// `rknn_matmul_set_io_mem`: bind `mem` as the tensor `attr` describes.
    pub fn set_io_mem(
        &self,
        ctx: RknnContext,
        mem: &Mem,
        attr: &TensorAttr,
    ) -> Result<(), DeviceError> {
        let mut a = *attr;
        // SAFETY: `mem` is a live memory object of this runtime (a `Mem` exists only between
        // its creation and `destroy_mem`); `a` is a live attribute.
        let r = unsafe { (self.fns.set_io_mem)(ctx, mem.ptr.as_ptr(), &mut a) };
        check("rknn_matmul_set_io_mem", r)
    }

    /// `rknn_matmul_set_core_mask`.
    pub fn set_core_mask(&self, ctx: RknnContext, mask: i32) -> Result<(), DeviceError> {
        // SAFETY: plain values; the runtime validates `ctx`.
        let r = unsafe { (self.fns.set_core_mask)(ctx, mask) };
        check("rknn_matmul_set_core_mask", r)
    }

    /// `rknn_matmul_set_quant_params` for the B tensor `b` (its attribute as the runtime
    /// reported it, whose name is passed back unchanged, as Rockchip's matmul demo does with
    /// `io_attr.B.name`) with `scales` (symmetric: no zero points).
    pub fn set_quant_params(
        &self,
        ctx: RknnContext,
        b: &TensorAttr,
        scales: &[f32],
    ) -> Result<(), DeviceError> {
        let mut p = QuantParams {
            name: b.name,
            // The runtime reads the scales; the header declares the pointer mutable.
            scale: scales.as_ptr().cast_mut(),
            scale_len: i32::try_from(scales.len()).unwrap_or(i32::MAX),
            zp: std::ptr::null_mut(),
            zp_len: 0,
        };
        // The name is the runtime's own bytes; keep it NUL-terminated whatever they were.
        p.name[255] = 0;
        // SAFETY: `p` points at `scales`, alive for the call; the runtime copies what it keeps.
        let r = unsafe { (self.fns.set_quant_params)(ctx, &mut p) };
        check("rknn_matmul_set_quant_params", r)
    }

    /// `rknn_matmul_run`.
    pub fn run(&self, ctx: RknnContext) -> Result<(), DeviceError> {
        // SAFETY: a plain value; the runtime validates `ctx` and its bound memory.
        let r = unsafe { (self.fns.run)(ctx) };
        check("rknn_matmul_run", r)
    }

    /// `rknn_matmul_destroy`.
    pub fn destroy(&self, ctx: RknnContext) -> Result<(), DeviceError> {
        // SAFETY: a plain value; the runtime validates `ctx`.
        let r = unsafe { (self.fns.destroy)(ctx) };
        check("rknn_matmul_destroy", r)
    }

    /// `rknn_create_mem2`: `size` bytes in `ctx`'s IOMMU domain.
    pub fn create_mem2(&self, ctx: RknnContext, size: u64, flags: u64) -> Result<Mem, DeviceError> {
        // SAFETY: plain values; the result is checked before use.
        let p = unsafe { (self.fns.create_mem2)(ctx, size, flags) };
        Mem::from_raw(p, size, "rknn_create_mem2")
    }

    /// `rknn_create_mem_from_fd`: a memory object for `size` bytes at `offset` inside `parent`
    /// (an N-chunk of a weight). `virt` is passed as the parent's host address plus `offset`.
    pub fn create_mem_from_fd(
        &self,
        ctx: RknnContext,
        parent: &Mem,
        offset: u64,
        size: u64,
    ) -> Result<Mem, DeviceError> {
        let bad = DeviceError::OutOfRange {
            offset,
            len: size,
            size: parent.len as u64,
        };
        if offset
            .checked_add(size)
            .is_none_or(|e| e > parent.len as u64)
        {
            return Err(bad);
        }
        let (Ok(off32), Ok(size32)) = (i32::try_from(offset), u32::try_from(size)) else {
            return Err(bad);
        };
        // SAFETY: `offset + size ≤ parent.len` was checked, so the address stays inside the
        // parent's host mapping.
        let virt = unsafe { parent.virt.add(offset as usize) };
        // SAFETY: plain values and an address inside a live mapping; the result is checked.
        let p =
            unsafe { (self.fns.create_mem_from_fd)(ctx, parent.fd, virt.cast(), size32, off32) };
        Mem::from_raw(p, size, "rknn_create_mem_from_fd")
    }

    /// `rknn_destroy_mem`.
    pub fn destroy_mem(&self, ctx: RknnContext, mem: Mem) -> Result<(), DeviceError> {
        // SAFETY: `mem` is live and consumed here: it is never used again.
        let r = unsafe { (self.fns.destroy_mem)(ctx, mem.ptr.as_ptr()) };
        check("rknn_destroy_mem", r)
    }

    /// `rknn_mem_sync` ([`SYNC_TO_DEVICE`] or [`SYNC_FROM_DEVICE`]).
    pub fn mem_sync(&self, ctx: RknnContext, mem: &Mem, mode: c_int) -> Result<(), DeviceError> {
        // SAFETY: `mem` is a live memory object of this runtime.
        let r = unsafe { (self.fns.mem_sync)(ctx, mem.ptr.as_ptr(), mode) };
        check("rknn_mem_sync", r)
    }

    /// `rknn_query(RKNN_QUERY_SDK_VERSION)`: `(runtime version, driver version)`.
    pub fn sdk_version(&self, ctx: RknnContext) -> Result<(String, String), DeviceError> {
        let mut v: SdkVersion = zerocopy::FromZeros::new_zeroed();
        // SAFETY: `v` is a live, writable struct of the size passed.
        let r = unsafe {
            (self.fns.query)(
                ctx,
                QUERY_SDK_VERSION,
                (&mut v as *mut SdkVersion).cast(),
                size_of::<SdkVersion>() as u32,
            )
        };
        check("rknn_query(RKNN_QUERY_SDK_VERSION)", r)?;
        Ok((
            c_str(&v.api_version).trim().to_string(),
            c_str(&v.drv_version).trim().to_string(),
        ))
    }
}

/// Resolve `name` in `lib` as a function of type `T`.
fn sym<T: Copy>(lib: &Library, path: &str, name: &'static str) -> Result<T, DeviceError> {
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: `T` is the function-pointer type the vendor header declares for `name` (see the
    // type aliases above); the pointer is only called while `lib` is loaded (`RuntimeLib` owns
    // both).
    match unsafe { lib.get::<T>(cname.as_slice()) } {
        Ok(s) => Ok(*s),
        Err(e) => Err(match VERSIONED.iter().find(|(n, _)| *n == name) {
            Some(&(_, needed)) => DeviceError::RuntimeTooOld {
                library: path.to_string(),
                found: format!("a runtime without {name}"),
                needed,
            },
            None => DeviceError::Library {
                library: path.to_string(),
                symbol: Some(name),
                reason: loader_error(&e),
            },
        }),
    }
}

/// The loader's message with its cause (libloading keeps `dlerror()`'s text in the source).
fn loader_error(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => format!("{e}: {src}"),
        None => e.to_string(),
    }
}

fn check(call: &'static str, r: c_int) -> Result<(), DeviceError> {
    if r == 0 {
        Ok(())
    } else {
        Err(DeviceError::Runtime { call, code: r })
    }
}

/// The largest page size of an aarch64 Linux kernel (4, 16 or 64 KiB): a memory object may
/// report its size rounded up to a page, never by this much or more.
pub const MAX_PAGE: u32 = 64 << 10;

/// A live `rknn_tensor_mem` of the runtime: its pointer and what ork reads of it once (host
/// address, length, fd). Destroyed only through [`RuntimeLib::destroy_mem`], which consumes it.
#[derive(Debug)]
pub struct Mem {
    ptr: NonNull<TensorMem>,
    virt: *mut u8,
    len: usize,
    fd: i32,
}

// SAFETY: a memory object is plain memory owned by the runtime, not tied to the thread that made
// it; ork serialises writes to its bytes through `&mut` (one owner) and calls on it through the
// device's locks.
unsafe impl Send for Mem {}
// SAFETY: shared access only reads the bytes and passes the pointer to the runtime.
unsafe impl Sync for Mem {}

impl Mem {
    fn from_raw(p: *mut TensorMem, size: u64, call: &'static str) -> Result<Mem, DeviceError> {
        let ptr = NonNull::new(p).ok_or(DeviceError::Runtime {
            call,
            code: NULL_MEM,
        })?;
        // SAFETY: a non-NULL result of a create call points at a `rknn_tensor_mem` the runtime
        // keeps alive until `rknn_destroy_mem`.
        let m = unsafe { ptr.as_ref() };
        let bad = DeviceError::Runtime {
            call,
            code: err::FAIL,
        };
        let len = usize::try_from(size).map_err(|_| bad)?;
        // The struct's size field is 32-bit: it holds the size modulo 2^32. The runtime may
        // report what it allocated, the size rounded up to a page (up to 64 KiB on aarch64
        // kernels): at least what was asked for, less than a largest page more. ork uses only
        // the bytes it asked for.
        let extra = m.size.wrapping_sub(size as u32);
        if m.virt_addr.is_null() || extra >= MAX_PAGE {
            return Err(DeviceError::Runtime {
                call,
                code: err::FAIL,
            });
        }
        Ok(Mem {
            ptr,
            virt: m.virt_addr.cast(),
            len,
            fd: m.fd,
        })
    }

    /// Host bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the runtime maps `len` bytes at `virt` for the memory object's life, which
        // lasts as long as `self`; `from_raw` checked the address is not NULL.
        unsafe { std::slice::from_raw_parts(self.virt, self.len) }
    }

    /// Host bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`; `&mut self` makes this the only access through ork.
        unsafe { std::slice::from_raw_parts_mut(self.virt, self.len) }
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address the runtime reports.
    pub fn phys_addr(&self) -> u64 {
        // SAFETY: the object is live (see `bytes`).
        unsafe { self.ptr.as_ref().phys_addr }
    }
}
