//! The exported C functions: turn raw pointers into checked values and hand them to
//! [`crate::state`]. All of the stand-in's pointer dereferences are here (and the allocation in
//! `block.rs`).

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)] // Each function's contract is the vendor header's.

use std::ffi::{c_int, c_void};

use ork_device::rknn::sys::{
    c_str, err, IoAttr, MatmulInfo, MatmulShape as CShape, QuantParams, RknnContext, SdkVersion,
    TensorAttr, TensorMem, QUERY_SDK_VERSION,
};

use crate::state::{fail, injected, state};

/// `0` for `Ok`, the code for `Err`.
fn code(r: Result<(), i32>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(c) => c,
    }
}

/// Shared body of the two create calls.
///
/// # Safety
/// `ctx`, `info` valid or NULL; `shapes` and `attrs` hold `n` elements or are NULL.
unsafe fn create_common(
    call: &str,
    ctx: *mut RknnContext,
    info: *mut MatmulInfo,
    n: c_int,
    shapes: Option<*mut CShape>,
    attrs: *mut IoAttr,
) -> c_int {
    if ctx.is_null() || info.is_null() || attrs.is_null() || n <= 0 {
        return fail(call, err::PARAM_INVALID, "NULL argument or no shapes");
    }
    // SAFETY: checked non-NULL; the caller passes a valid `rknn_matmul_info`.
    let info_v = unsafe { *info };
    let shape_list: Vec<CShape> = match shapes {
        None => vec![CShape {
            m: info_v.m,
            k: info_v.k,
            n: info_v.n,
        }],
        Some(p) if p.is_null() => return fail(call, err::PARAM_INVALID, "NULL shapes"),
        // SAFETY: the caller passes `n` shapes (the API's contract).
        Some(p) => unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec(),
    };
    let r = state().create(call, &info_v, &shape_list);
    match r {
        Ok((id, list)) => {
            // SAFETY: the caller provides room for one attribute set per shape.
            let out = unsafe { std::slice::from_raw_parts_mut(attrs, list.len()) };
            out.copy_from_slice(&list);
            // SAFETY: checked non-NULL.
            unsafe { *ctx = id };
            0
        }
        Err(c) => c,
    }
}

/// `int rknn_matmul_create(rknn_matmul_ctx*, rknn_matmul_info*, rknn_matmul_io_attr*)`.
#[no_mangle]
pub unsafe extern "C" fn rknn_matmul_create(
    ctx: *mut RknnContext,
    info: *mut MatmulInfo,
    io_attr: *mut IoAttr,
) -> c_int {
    const CALL: &str = "rknn_matmul_create";
    if let Some(c) = injected(CALL) {
        return c;
    }
    // SAFETY: the caller's pointers, checked inside.
    unsafe { create_common(CALL, ctx, info, 1, None, io_attr) }
}

/// `int rknn_matmul_create_dynamic_shape(ctx*, info*, int shape_num, rknn_matmul_shape[], rknn_matmul_io_attr[])`.
#[no_mangle]
pub unsafe extern "C" fn rknn_matmul_create_dynamic_shape(
    ctx: *mut RknnContext,
    info: *mut MatmulInfo,
    shape_num: c_int,
    shapes: *mut CShape,
    io_attrs: *mut IoAttr,
) -> c_int {
    const CALL: &str = "rknn_matmul_create_dynamic_shape";
    if let Some(c) = injected(CALL) {
        return c;
    }
    // SAFETY: the caller's pointers, checked inside.
    unsafe { create_common(CALL, ctx, info, shape_num, Some(shapes), io_attrs) }
}

/// `int rknn_matmul_set_dynamic_shape(rknn_matmul_ctx, rknn_matmul_shape*)`.
#[no_mangle]
pub unsafe extern "C" fn rknn_matmul_set_dynamic_shape(
    ctx: RknnContext,
    shape: *mut CShape,
) -> c_int {
    const CALL: &str = "rknn_matmul_set_dynamic_shape";
    if let Some(c) = injected(CALL) {
        return c;
    }
    if shape.is_null() {
        return fail(CALL, err::PARAM_INVALID, "NULL shape");
    }
    // SAFETY: checked non-NULL; a valid shape by the API's contract.
    let s = unsafe { *shape };
    code(state().set_dynamic_shape(CALL, ctx, &s))
}

/// `int rknn_matmul_set_io_mem(rknn_matmul_ctx, rknn_tensor_mem*, rknn_matmul_tensor_attr*)`.
#[no_mangle]
pub unsafe extern "C" fn rknn_matmul_set_io_mem(
    ctx: RknnContext,
    mem: *mut TensorMem,
    attr: *mut TensorAttr,
) -> c_int {
    const CALL: &str = "rknn_matmul_set_io_mem";
    if let Some(c) = injected(CALL) {
        return c;
    }
    if mem.is_null() || attr.is_null() {
        return fail(CALL, err::PARAM_INVALID, "NULL argument");
    }
    // SAFETY: checked non-NULL; a valid attribute by the API's contract. `mem` is only used as
    // a key (checked against the live objects before anything reads it).
    let a = unsafe { *attr };
    code(state().set_io_mem(CALL, ctx, mem as usize, &a))
}

/// `int rknn_matmul_set_core_mask(rknn_matmul_ctx, rknn_core_mask)`.
#[no_mangle]
pub extern "C" fn rknn_matmul_set_core_mask(ctx: RknnContext, mask: c_int) -> c_int {
    const CALL: &str = "rknn_matmul_set_core_mask";
    if let Some(c) = injected(CALL) {
        return c;
    }
    code(state().set_core_mask(CALL, ctx, mask))
}

/// `int rknn_matmul_set_quant_params(rknn_matmul_ctx, rknn_quant_params*)`.
#[no_mangle]
pub unsafe extern "C" fn rknn_matmul_set_quant_params(
    ctx: RknnContext,
    params: *mut QuantParams,
) -> c_int {
    const CALL: &str = "rknn_matmul_set_quant_params";
    if let Some(c) = injected(CALL) {
        return c;
    }
    if params.is_null() {
        return fail(CALL, err::PARAM_INVALID, "NULL params");
    }
    // SAFETY: checked non-NULL; a valid struct by the API's contract.
    let p = unsafe { &*params };
    if p.scale.is_null() || p.scale_len <= 0 {
        return fail(CALL, err::PARAM_INVALID, "no scales");
    }
    // SAFETY: `scale` points at `scale_len` floats (the API's contract); copied at once.
    let scales = unsafe { std::slice::from_raw_parts(p.scale, p.scale_len as usize) }.to_vec();
    let zp = !p.zp.is_null() && p.zp_len > 0;
    code(state().set_quant_params(CALL, ctx, c_str(&p.name), scales, zp))
}

/// `int rknn_matmul_run(rknn_matmul_ctx)`.
#[no_mangle]
pub extern "C" fn rknn_matmul_run(ctx: RknnContext) -> c_int {
    const CALL: &str = "rknn_matmul_run";
    if let Some(c) = injected(CALL) {
        return c;
    }
    // Gather under the lock, compute without it (the kernels use rayon; a caller on a rayon
    // worker may re-enter the stand-in from a stolen job).
    let job = state().job(CALL, ctx);
    code(job.and_then(|j| j.run(CALL)))
}

/// `int rknn_matmul_destroy(rknn_matmul_ctx)`.
#[no_mangle]
pub extern "C" fn rknn_matmul_destroy(ctx: RknnContext) -> c_int {
    const CALL: &str = "rknn_matmul_destroy";
    if let Some(c) = injected(CALL) {
        return c;
    }
    code(state().destroy(CALL, ctx))
}

/// `rknn_tensor_mem* rknn_create_mem2(rknn_context, uint64_t size, uint64_t flags)`.
#[no_mangle]
pub extern "C" fn rknn_create_mem2(ctx: RknnContext, size: u64, flags: u64) -> *mut TensorMem {
    const CALL: &str = "rknn_create_mem2";
    if injected(CALL).is_some() {
        return std::ptr::null_mut();
    }
    match state().create_mem2(CALL, ctx, size, flags) {
        Ok(key) => key as *mut TensorMem,
        Err(_) => std::ptr::null_mut(),
    }
}

/// `rknn_tensor_mem* rknn_create_mem_from_fd(rknn_context, int32_t fd, void* virt, uint32_t size, int32_t offset)`.
#[no_mangle]
pub extern "C" fn rknn_create_mem_from_fd(
    ctx: RknnContext,
    fd: i32,
    virt: *mut c_void,
    size: u32,
    offset: i32,
) -> *mut TensorMem {
    const CALL: &str = "rknn_create_mem_from_fd";
    if injected(CALL).is_some() {
        return std::ptr::null_mut();
    }
    match state().create_mem_from_fd(CALL, ctx, fd, virt as usize, size, offset) {
        Ok(key) => key as *mut TensorMem,
        Err(_) => std::ptr::null_mut(),
    }
}

/// `int rknn_destroy_mem(rknn_context, rknn_tensor_mem*)`.
#[no_mangle]
pub extern "C" fn rknn_destroy_mem(ctx: RknnContext, mem: *mut TensorMem) -> c_int {
    const CALL: &str = "rknn_destroy_mem";
    if let Some(c) = injected(CALL) {
        return c;
    }
    code(state().destroy_mem(CALL, ctx, mem as usize))
}

/// `int rknn_mem_sync(rknn_context, rknn_tensor_mem*, rknn_mem_sync_mode)`.
#[no_mangle]
pub extern "C" fn rknn_mem_sync(ctx: RknnContext, mem: *mut TensorMem, mode: c_int) -> c_int {
    const CALL: &str = "rknn_mem_sync";
    if let Some(c) = injected(CALL) {
        return c;
    }
    code(state().mem_sync(CALL, ctx, mem as usize, mode))
}

/// `int rknn_query(rknn_context, rknn_query_cmd, void* info, uint32_t size)`: the SDK version
/// only.
#[no_mangle]
pub unsafe extern "C" fn rknn_query(
    ctx: RknnContext,
    cmd: c_int,
    info: *mut c_void,
    size: u32,
) -> c_int {
    const CALL: &str = "rknn_query";
    if let Some(c) = injected(CALL) {
        return c;
    }
    if let Err(c) = state().query_ok(CALL, ctx) {
        return c;
    }
    if cmd != QUERY_SDK_VERSION {
        return fail(
            CALL,
            err::PARAM_INVALID,
            format!("query {cmd}: the stand-in answers RKNN_QUERY_SDK_VERSION only"),
        );
    }
    if info.is_null() || size as usize != std::mem::size_of::<SdkVersion>() {
        return fail(
            CALL,
            err::PARAM_INVALID,
            format!("info NULL or size {size} (rknn_sdk_version is 512 bytes)"),
        );
    }
    let api = std::env::var("ORK_RKNN_STANDIN_VERSION")
        .unwrap_or_else(|_| "2.3.2 (ork stand-in)".to_string());
    let mut v = SdkVersion {
        api_version: [0; 256],
        drv_version: [0; 256],
    };
    ork_device::rknn::sys::set_c_str(&mut v.api_version, &api);
    ork_device::rknn::sys::set_c_str(&mut v.drv_version, "0.9.8 (ork stand-in, no driver)");
    // SAFETY: checked non-NULL and of the struct's size.
    unsafe { info.cast::<SdkVersion>().write_unaligned(v) };
    0
}
