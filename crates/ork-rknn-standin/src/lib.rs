//! A stand-in for Rockchip's vendor runtime `librknnrt.so`, for CI machines without an NPU.
//!
//! It exports the matmul API's C symbols with the same struct layouts (the `#[repr(C)]` structs of
//! `ork_device::rknn::sys`, whose sizes and offsets are pinned there and listed in
//! `docs/rknn.md`), checks every argument the real runtime would check — struct contents, types
//! the chip has, K / N limits and alignment, IOMMU domain ids, which context and domain a memory
//! object belongs to, use after destroy — and answers a bad call with an `RKNN_ERR_*` code (or
//! NULL), printing why on stderr. It computes with the emulator's kernels
//! (`ork_device::rknn::kernels`), so a model run through `--device rknn` against it must equal
//! the emulator's run.
//!
//! It implements what ork uses: B in the native layout, A and C row-major (`AC_layout` 0), the
//! types int8 × int8 → int32 / fp32 (per-group), int8 × int4 → int32, fp16 × fp16 / int8 / int4 →
//! fp32, each only where the chip's table (`ork_device::soc`) has it. Anything else is refused at
//! context creation with `RKNN_ERR_PARAM_INVALID`, saying it is the stand-in that lacks it.
//!
//! Environment:
//! * `ORK_RKNN_STANDIN_SOC=rk3588|rk3576` — the chip whose table it keeps to (default rk3588);
//! * `ORK_RKNN_STANDIN_FAIL=call[=code][,call…]` — make the named C functions fail with `code`
//!   (default -1; NULL for the functions that return memory objects), read once per process;
//! * `ORK_RKNN_STANDIN_VERSION=text` — the runtime version `rknn_query` reports (default
//!   `2.3.2 (ork stand-in)`).
//!
//! Where the real runtime's behaviour is undocumented, the stand-in takes the form a careless
//! caller would get wrong: B's tensor attribute is named [`B_NAME`] (not "B"; a caller
//! must pass the runtime's own name to `rknn_matmul_set_quant_params`), and `rknn_create_mem2`
//! reports its size rounded up to a 4 KiB page.
//!
//! Memory objects' `fd`s are ids of the stand-in (from 1000 up), not open files, and their
//! `phys_addr` is a stand-in address in the domain's 4 GiB space. The stand-in keeps no byte
//! limit per domain (all device instances of a test process share it); the window limit is the
//! backend's own model, which refuses a full window before it calls the runtime.

#![deny(unsafe_op_in_unsafe_fn)]

mod block;
mod ffi;
mod state;

pub use state::B_NAME;
