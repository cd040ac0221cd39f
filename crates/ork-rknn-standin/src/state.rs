//! The stand-in's bookkeeping and checks (safe code): contexts, memory objects, domains, and the
//! matmul itself on the emulator's kernels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use half::f16;
use ork_device::rknn::kernels;
use ork_device::rknn::sys::{
    err, mem_flags, mm_type, set_c_str, tensor_type, IoAttr, MatmulInfo, MatmulShape as CShape,
    TensorAttr, TensorMem, LAYOUT_NATIVE, LAYOUT_NORM, QUANT_PER_CHANNEL_SYM, QUANT_PER_GROUP_SYM,
    QUANT_PER_LAYER_SYM,
};
use ork_device::soc::{ElemType, MatmulShape};
use ork_device::{Soc, MAX_DOMAINS};
use ork_pack::{PackDtype, ScaleGroup, TiledLayout};

use crate::block::Block;

/// Bytes of one domain's IOVA space.
const DOMAIN_BYTES: u64 = 1 << 32;
/// Most shapes a dynamic-shape context takes (the stand-in's own limit, generous).
const MAX_SHAPES: usize = 64;
/// The name the stand-in gives B's tensor attribute. Rockchip documents no name: its matmul demo
/// passes `io_attr.B.name` back to `rknn_matmul_set_quant_params`. The stand-in names it other
/// than a caller would guess, so that a caller passing a literal "B" fails here.
pub const B_NAME: &str = "B_native";
/// The page a memory object's reported size is rounded up to, as a runtime that reports what it
/// mapped does (`rknn_tensor_mem.size`); the bytes past the request exist and are zero.
const PAGE: u64 = 4096;

/// A failed call: its code, after printing why.
pub(crate) type Res<T> = Result<T, i32>;

/// Print why `call` fails and return `code`.
pub(crate) fn fail(call: &str, code: i32, why: impl std::fmt::Display) -> i32 {
    eprintln!("ork-rknn-standin: {call}: {why}");
    code
}

/// The code `ORK_RKNN_STANDIN_FAIL` asks `call` to fail with, if any (read once per process).
pub(crate) fn injected(call: &str) -> Option<i32> {
    static SPEC: OnceLock<Vec<(String, i32)>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| {
        std::env::var("ORK_RKNN_STANDIN_FAIL")
            .unwrap_or_default()
            .split(',')
            .filter(|item| !item.trim().is_empty())
            .map(|item| match item.split_once('=') {
                Some((n, c)) => (n.trim().to_string(), c.trim().parse().unwrap_or(err::FAIL)),
                None => (item.trim().to_string(), err::FAIL),
            })
            .collect()
    });
    spec.iter()
        .find(|(name, _)| name == call)
        .map(|&(_, code)| {
            eprintln!("ork-rknn-standin: {call}: failing as ORK_RKNN_STANDIN_FAIL asks ({code})");
            code
        })
}

/// The chip the stand-in keeps to.
fn soc() -> Soc {
    static SOC: OnceLock<Soc> = OnceLock::new();
    *SOC.get_or_init(|| {
        std::env::var("ORK_RKNN_STANDIN_SOC")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(Soc::Rk3588)
    })
}

/// A memory object.
struct MemRec {
    block: Arc<Block>,
    /// Offset of its bytes inside `block`.
    offset: usize,
    len: usize,
    domain: i32,
    fd: i32,
    /// The memory object it was made inside (`rknn_create_mem_from_fd`), if any.
    parent: Option<usize>,
    /// Live memory objects made inside it.
    children: usize,
    /// The context it was created through (its live-memory count is decremented on destroy).
    ctx: u64,
    cacheable: bool,
}

/// The element types of a matmul type: A, B, C.
fn types_of(t: i32) -> Option<(ElemType, ElemType, ElemType)> {
    use ElemType::{Fp16, Fp32, Int16, Int32, Int4, Int8};
    Some(match t {
        1 => (Fp16, Fp16, Fp32),
        2 => (Int8, Int8, Int32),
        3 => (Int8, Int8, Int8),
        4 => (Fp16, Fp16, Fp16),
        5 => (Fp16, Int8, Fp32),
        6 => (Fp16, Int8, Fp16),
        7 => (Fp16, Int4, Fp32),
        8 => (Fp16, Int4, Fp16),
        9 => (Int8, Int8, Fp32),
        10 => (Int4, Int4, Int16),
        11 => (Int8, Int4, Int32),
        15 => (Int8, Int4, Fp16),
        _ => return None,
    })
}

/// Types the stand-in computes.
const COMPUTED: [i32; 6] = [
    mm_type::FLOAT16_MM_FLOAT16_TO_FLOAT32,
    mm_type::INT8_MM_INT8_TO_INT32,
    mm_type::FLOAT16_MM_INT8_TO_FLOAT32,
    mm_type::FLOAT16_MM_INT4_TO_FLOAT32,
    mm_type::INT8_MM_INT8_TO_FLOAT32,
    mm_type::INT8_MM_INT4_TO_INT32,
];

fn elem_bytes_x2(e: ElemType) -> usize {
    match e {
        ElemType::Int4 => 1,
        ElemType::Int8 => 2,
        ElemType::Fp16 | ElemType::Int16 => 4,
        _ => 8,
    }
}

fn ty_code(e: ElemType) -> i32 {
    match e {
        ElemType::Fp16 => tensor_type::FLOAT16,
        ElemType::Int8 => tensor_type::INT8,
        ElemType::Int4 => tensor_type::INT4,
        ElemType::Int16 => tensor_type::INT16,
        ElemType::Int32 => tensor_type::INT32,
        _ => tensor_type::FLOAT32,
    }
}

fn pack_dtype(e: ElemType) -> PackDtype {
    match e {
        ElemType::Int4 => PackDtype::I4,
        ElemType::Fp16 => PackDtype::F16,
        _ => PackDtype::I8,
    }
}

/// The attributes of A, B and C for one shape.
fn io_attr(s: &CShape, (a, b, c): (ElemType, ElemType, ElemType)) -> IoAttr {
    let (m, k, n) = (s.m as u32, s.k as u32, s.n as u32);
    let mut io = IoAttr::zeroed();
    let fill = |t: &mut TensorAttr, name: &str, dims: &[u32], size: u32, ty: i32| {
        set_c_str(&mut t.name, name);
        t.n_dims = dims.len() as u32;
        t.dims[..dims.len()].copy_from_slice(dims);
        t.size = size;
        t.ty = ty;
    };
    let half = |elems: u32, e: ElemType| (elems as usize * elem_bytes_x2(e) / 2) as u32;
    fill(&mut io.a, "A", &[m, k], half(m * k, a), ty_code(a));
    let tn = pack_dtype(b).n_tile() as u32;
    fill(
        &mut io.b,
        B_NAME,
        &[n / tn, k / 32, tn, 32],
        half(n * k, b),
        ty_code(b),
    );
    fill(&mut io.c, "C", &[m, n], half(m * n, c), ty_code(c));
    io
}

/// A matmul context.
struct CtxRec {
    domain: i32,
    info: MatmulInfo,
    types: (ElemType, ElemType, ElemType),
    shapes: Vec<CShape>,
    attrs: Vec<IoAttr>,
    /// Index of the shape set now.
    cur: Option<usize>,
    /// Bound memory objects of A, B, C.
    bound: [Option<usize>; 3],
    /// Per-group B scales (`[N][K/g]`).
    quant: Option<Vec<f32>>,
    /// Live memory objects created through this context.
    mems: usize,
}

#[derive(Default)]
pub(crate) struct State {
    ctxs: HashMap<u64, CtxRec>,
    mems: HashMap<usize, MemRec>,
    fds: HashMap<i32, usize>,
    domain_bytes: [u64; MAX_DOMAINS as usize],
    next_ctx: u64,
    next_fd: i32,
}

/// `rknn_matmul_info` checked: reserved bytes zero, a known type the chip has and the
/// stand-in computes, a domain, the layouts and quantization the stand-in implements; the
/// (A, B, C) types and B's scale group, or why not.
fn check_info(info: &MatmulInfo) -> Result<((ElemType, ElemType, ElemType), ScaleGroup), String> {
    if info.reserved.iter().any(|&b| b != 0) {
        return Err("rknn_matmul_info.reserved is not zero".into());
    }
    let Some(types) = types_of(info.mm_type) else {
        return Err(format!("unknown rknn_matmul_type {}", info.mm_type));
    };
    if !(0..MAX_DOMAINS as i32).contains(&info.iommu_domain_id) {
        return Err(format!(
            "iommu_domain_id {} outside 0..{MAX_DOMAINS}",
            info.iommu_domain_id
        ));
    }
    let soc = soc();
    if !soc.outputs(types.0, types.1).contains(&types.2) {
        return Err(format!(
            "{soc} has no {} × {} → {} matmul",
            types.0, types.1, types.2
        ));
    }
    if !COMPUTED.contains(&info.mm_type) {
        return Err(format!(
            "the stand-in does not implement matmul type {} (the real runtime may)",
            info.mm_type
        ));
    }
    if info.b_layout != LAYOUT_NATIVE {
        return Err(format!(
            "B_layout {}: the stand-in implements the native B layout (1) only",
            info.b_layout
        ));
    }
    if info.ac_layout != LAYOUT_NORM || info.ac_quant_type != QUANT_PER_LAYER_SYM {
        return Err(format!(
            "AC_layout {} / AC_quant_type {}: the stand-in implements row-major, per-layer A and C only",
            info.ac_layout, info.ac_quant_type
        ));
    }
    Ok((types, b_group(info, soc, types)?))
}

/// B's scale group as `info` asks for it (per-group: a size the chip has, with an fp32 output).
fn b_group(
    info: &MatmulInfo,
    soc: Soc,
    types: (ElemType, ElemType, ElemType),
) -> Result<ScaleGroup, String> {
    match info.b_quant_type {
        QUANT_PER_LAYER_SYM | QUANT_PER_CHANNEL_SYM => {
            if info.group_size != 0 {
                return Err("group_size set without per-group B".into());
            }
            Ok(ScaleGroup::PerChannel)
        }
        QUANT_PER_GROUP_SYM => {
            let g = info.group_size;
            if g <= 0 || !soc.group_sizes(types.0, types.1).contains(&(g as usize)) {
                return Err(format!(
                    "{soc} has no per-group {} × {} with group_size {g}",
                    types.0, types.1
                ));
            }
            if types.2 != ElemType::Fp32 {
                return Err("per-group B needs an fp32 output".into());
            }
            Ok(ScaleGroup::Group(g as usize))
        }
        q => Err(format!("B_quant_type {q} not supported")),
    }
}

/// Each of a context's shapes checked: positive, the info's K and N, within the chip's limits,
/// K a multiple of B's group.
fn check_shapes(
    info: &MatmulInfo,
    shapes: &[CShape],
    types: (ElemType, ElemType, ElemType),
    group: ScaleGroup,
) -> Result<(), String> {
    for s in shapes {
        if s.m <= 0 || s.k <= 0 || s.n <= 0 {
            return Err(format!(
                "shape {}×{}×{} has a non-positive dim",
                s.m, s.k, s.n
            ));
        }
        if s.k != info.k || s.n != info.n {
            return Err(format!(
                "shape K {} N {} differs from the info's K {} N {} (ork's contexts vary M only)",
                s.k, s.n, info.k, info.n
            ));
        }
        let shape = MatmulShape {
            a: types.0,
            b: types.1,
            k: s.k as usize,
            n: s.n as usize,
            group,
        };
        soc().check_limits(&shape).map_err(|e| e.to_string())?;
        if let ScaleGroup::Group(g) = group {
            if !(s.k as usize).is_multiple_of(g) {
                return Err(format!("group_size {g} does not divide K {}", s.k));
            }
        }
    }
    Ok(())
}

pub(crate) fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| {
        Mutex::new(State {
            next_ctx: 1,
            next_fd: 1000,
            ..State::default()
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

/// What `rknn_matmul_run` computes, gathered under the lock and run without it.
pub(crate) struct Job {
    mm_type: i32,
    types: (ElemType, ElemType, ElemType),
    m: usize,
    k: usize,
    n: usize,
    group: usize,
    quant: Option<Vec<f32>>,
    a: (Arc<Block>, usize, usize),
    b: (Arc<Block>, usize, usize),
    c: (Arc<Block>, usize, usize),
}

impl State {
    fn ctx(&self, call: &str, ctx: u64) -> Res<&CtxRec> {
        self.ctxs.get(&ctx).ok_or_else(|| {
            fail(
                call,
                err::CTX_INVALID,
                format!("context {ctx} is not a live context (destroyed or never created)"),
            )
        })
    }

    fn ctx_mut(&mut self, call: &str, ctx: u64) -> Res<&mut CtxRec> {
        self.ctxs.get_mut(&ctx).ok_or_else(|| {
            fail(
                call,
                err::CTX_INVALID,
                format!("context {ctx} is not a live context (destroyed or never created)"),
            )
        })
    }

    fn mem(&self, call: &str, key: usize) -> Res<&MemRec> {
        self.mems.get(&key).ok_or_else(|| {
            fail(
                call,
                err::PARAM_INVALID,
                format!("{key:#x} is not a live rknn_tensor_mem (destroyed or never created)"),
            )
        })
    }

    /// `rknn_matmul_create` / `_create_dynamic_shape`: check `info` and the shapes; returns the
    /// new context id and the attributes of each shape.
    pub(crate) fn create(
        &mut self,
        call: &str,
        info: &MatmulInfo,
        shapes: &[CShape],
    ) -> Res<(u64, Vec<IoAttr>)> {
        let bad = |why: String| fail(call, err::PARAM_INVALID, why);
        if shapes.is_empty() || shapes.len() > MAX_SHAPES {
            return Err(bad(format!("{} shapes (1..={MAX_SHAPES})", shapes.len())));
        }
        let (types, group) = check_info(info).map_err(bad)?;
        check_shapes(info, shapes, types, group).map_err(bad)?;
        let attrs: Vec<IoAttr> = shapes.iter().map(|s| io_attr(s, types)).collect();
        let id = self.next_ctx;
        self.next_ctx += 1;
        self.ctxs.insert(
            id,
            CtxRec {
                domain: info.iommu_domain_id,
                info: *info,
                types,
                shapes: shapes.to_vec(),
                attrs: attrs.clone(),
                cur: (shapes.len() == 1).then_some(0),
                bound: [None; 3],
                quant: None,
                mems: 0,
            },
        );
        Ok((id, attrs))
    }

    pub(crate) fn set_dynamic_shape(&mut self, call: &str, ctx: u64, s: &CShape) -> Res<()> {
        let c = self.ctx_mut(call, ctx)?;
        let Some(i) = c.shapes.iter().position(|x| x == s) else {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                format!(
                    "shape {}×{}×{} is not one the context was created with",
                    s.m, s.k, s.n
                ),
            ));
        };
        c.cur = Some(i);
        // A new shape needs its operands bound again (the stand-in's reading of the API: the
        // attributes, and so the bindings, belong to one shape).
        c.bound = [None; 3];
        Ok(())
    }

    pub(crate) fn set_io_mem(
        &mut self,
        call: &str,
        ctx: u64,
        mem: usize,
        attr: &TensorAttr,
    ) -> Res<()> {
        let bad = |why: String| fail(call, err::PARAM_INVALID, why);
        let c = self.ctx(call, ctx)?;
        let Some(cur) = c.cur else {
            return Err(bad(
                "no shape set (rknn_matmul_set_dynamic_shape first)".into()
            ));
        };
        let want = &c.attrs[cur];
        let (slot, expected) = match attr.name_str() {
            "A" => (0, &want.a),
            B_NAME => (1, &want.b),
            "C" => (2, &want.c),
            other => return Err(bad(format!("tensor attribute named {other:?} (A, B or C)"))),
        };
        if attr.n_dims != expected.n_dims
            || attr.dims != expected.dims
            || attr.size != expected.size
            || attr.ty != expected.ty
        {
            return Err(bad(format!(
                "attribute of {} does not match the context's current shape",
                attr.name_str()
            )));
        }
        let domain = c.domain;
        let m = self.mem(call, mem)?;
        if m.len < attr.size as usize {
            return Err(bad(format!(
                "memory of {} bytes bound as {} of {} bytes",
                m.len,
                attr.name_str(),
                attr.size
            )));
        }
        if m.domain != domain {
            return Err(bad(format!(
                "memory of IOMMU domain {} bound to a context of domain {domain}",
                m.domain
            )));
        }
        self.ctx_mut(call, ctx)?.bound[slot] = Some(mem);
        Ok(())
    }

    pub(crate) fn set_core_mask(&mut self, call: &str, ctx: u64, mask: i32) -> Res<()> {
        self.ctx(call, ctx)?;
        let cores = soc().cores();
        if mask != 0xffff && (mask < 0 || mask >> cores != 0) {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                format!("core mask {mask:#x} on a chip with {cores} cores"),
            ));
        }
        Ok(())
    }

    pub(crate) fn set_quant_params(
        &mut self,
        call: &str,
        ctx: u64,
        name: &str,
        scales: Vec<f32>,
        zp: bool,
    ) -> Res<()> {
        let bad = |why: String| fail(call, err::PARAM_INVALID, why);
        let c = self.ctx_mut(call, ctx)?;
        if name != B_NAME {
            return Err(bad(format!(
                "quant params for tensor {name:?} (only B, named {B_NAME:?} in its attribute, \
                 takes them)"
            )));
        }
        if zp {
            return Err(bad("zero points given for a symmetric quantization".into()));
        }
        let (k, n) = (c.info.k as usize, c.info.n as usize);
        let want = match c.info.b_quant_type {
            QUANT_PER_GROUP_SYM => n * k / c.info.group_size as usize,
            QUANT_PER_CHANNEL_SYM => n,
            _ => 1,
        };
        if scales.len() != want {
            return Err(bad(format!("{} scales, B needs {want}", scales.len())));
        }
        if scales.iter().any(|s| !s.is_finite()) {
            return Err(bad("a non-finite scale".into()));
        }
        c.quant = Some(scales);
        Ok(())
    }

    /// Check that everything is bound and alive and gather the job.
    pub(crate) fn job(&self, call: &str, ctx: u64) -> Res<Job> {
        let bad = |why: String| fail(call, err::PARAM_INVALID, why);
        let c = self.ctx(call, ctx)?;
        let Some(cur) = c.cur else {
            return Err(bad("no shape set".into()));
        };
        let s = c.shapes[cur];
        let attr = &c.attrs[cur];
        let mut ops = Vec::with_capacity(3);
        for (i, (name, a)) in [("A", &attr.a), ("B", &attr.b), ("C", &attr.c)]
            .into_iter()
            .enumerate()
        {
            let Some(key) = c.bound[i] else {
                return Err(bad(format!("{name} is not bound for the current shape")));
            };
            let m = self.mem(call, key).map_err(|_| {
                fail(
                    call,
                    err::PARAM_INVALID,
                    format!("{name} is bound to a destroyed memory object (use after destroy)"),
                )
            })?;
            ops.push((Arc::clone(&m.block), m.offset, a.size as usize));
        }
        let group = if c.info.b_quant_type == QUANT_PER_GROUP_SYM {
            if c.quant.is_none() {
                return Err(bad(
                    "per-group B without rknn_matmul_set_quant_params".into()
                ));
            }
            c.info.group_size as usize
        } else {
            0
        };
        // C is written while A and B are read: it must not overlap them.
        for i in 0..2 {
            let (x, c) = (&ops[i], &ops[2]);
            if Arc::ptr_eq(&x.0, &c.0) && x.1 < c.1 + c.2 && c.1 < x.1 + x.2 {
                return Err(bad(format!(
                    "C overlaps {} in the same memory",
                    ["A", "B"][i]
                )));
            }
        }
        let mut it = ops.into_iter();
        let (Some(a), Some(b), Some(cc)) = (it.next(), it.next(), it.next()) else {
            return Err(bad("operands missing".into()));
        };
        Ok(Job {
            mm_type: c.info.mm_type,
            types: c.types,
            m: s.m as usize,
            k: s.k as usize,
            n: s.n as usize,
            group,
            quant: c.quant.clone(),
            a,
            b,
            c: cc,
        })
    }

    pub(crate) fn destroy(&mut self, call: &str, ctx: u64) -> Res<()> {
        let c = self.ctx(call, ctx)?;
        if c.mems > 0 {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                format!(
                    "{} memory objects created through this context are still alive",
                    c.mems
                ),
            ));
        }
        self.ctxs.remove(&ctx);
        Ok(())
    }

    /// A memory object for `rec`, reporting `size` bytes (`rec.len`, or more: see [`PAGE`]).
    fn new_mem(&mut self, ctx: u64, rec: MemRec, virt: *mut u8, phys: u64, size: usize) -> usize {
        let tm = Box::new(TensorMem {
            virt_addr: virt.cast(),
            phys_addr: phys,
            fd: rec.fd,
            offset: rec.offset as i32,
            size: size as u32,
            flags: if rec.cacheable {
                mem_flags::CACHEABLE as u32
            } else {
                0
            },
            priv_data: std::ptr::null_mut(),
        });
        // Never freed: a destroyed object's address is never reused, so a use after destroy is
        // always recognised (40 bytes per object).
        let key = Box::into_raw(tm) as usize;
        if let Some(c) = self.ctxs.get_mut(&ctx) {
            c.mems += 1;
        }
        self.mems.insert(key, rec);
        key
    }

    pub(crate) fn create_mem2(
        &mut self,
        call: &str,
        ctx: u64,
        size: u64,
        flags: u64,
    ) -> Res<usize> {
        let domain = self.ctx(call, ctx)?.domain;
        let known = mem_flags::CACHEABLE | mem_flags::NON_CACHEABLE | 4;
        if flags & !known != 0 || flags & 3 == 3 {
            return Err(fail(call, err::PARAM_INVALID, format!("flags {flags:#x}")));
        }
        if size == 0 || size > DOMAIN_BYTES {
            return Err(fail(call, err::PARAM_INVALID, format!("size {size}")));
        }
        // No byte limit per domain here: every device instance of a test process shares this
        // library, while each keeps its own window model (the backend refuses a full window
        // before calling). Addresses are handed out top-down, wrapping, for `phys_addr` only.
        let pages = size.div_ceil(PAGE) * PAGE;
        let Some(block) = Block::new(pages as usize) else {
            return Err(fail(call, err::MALLOC_FAIL, "host memory"));
        };
        let used = &mut self.domain_bytes[domain as usize];
        let phys = DOMAIN_BYTES - (*used + pages) % DOMAIN_BYTES;
        *used = (*used + pages) % DOMAIN_BYTES;
        let fd = self.next_fd;
        self.next_fd += 1;
        let virt = block.addr();
        let key = self.new_mem(
            ctx,
            MemRec {
                block: Arc::new(block),
                offset: 0,
                len: size as usize,
                domain,
                fd,
                parent: None,
                children: 0,
                ctx,
                cacheable: flags & mem_flags::NON_CACHEABLE == 0,
            },
            virt,
            phys,
            pages as usize,
        );
        self.fds.insert(fd, key);
        Ok(key)
    }

    pub(crate) fn create_mem_from_fd(
        &mut self,
        call: &str,
        ctx: u64,
        fd: i32,
        virt: usize,
        size: u32,
        offset: i32,
    ) -> Res<usize> {
        let bad = |why: String| fail(call, err::PARAM_INVALID, why);
        let domain = self.ctx(call, ctx)?.domain;
        let Some(&pkey) = self.fds.get(&fd) else {
            return Err(bad(format!("fd {fd} is not a live memory object's")));
        };
        let p = self.mem(call, pkey)?;
        if offset < 0 || size == 0 || offset as usize + size as usize > p.len {
            return Err(bad(format!(
                "offset {offset} + size {size} outside a memory object of {} bytes",
                p.len
            )));
        }
        if virt != p.block.addr() as usize + offset as usize {
            return Err(bad(
                "virt is not the memory's host address plus offset".into()
            ));
        }
        if p.domain != domain {
            return Err(bad(format!(
                "memory of domain {} used through a context of domain {domain}",
                p.domain
            )));
        }
        let rec = MemRec {
            block: Arc::clone(&p.block),
            offset: offset as usize,
            len: size as usize,
            domain,
            fd,
            parent: Some(pkey),
            children: 0,
            ctx,
            cacheable: p.cacheable,
        };
        if let Some(p) = self.mems.get_mut(&pkey) {
            p.children += 1;
        }
        Ok(self.new_mem(ctx, rec, virt as *mut u8, 0, size as usize))
    }

    pub(crate) fn destroy_mem(&mut self, call: &str, ctx: u64, key: usize) -> Res<()> {
        let domain = self.ctx(call, ctx)?.domain;
        let m = self.mem(call, key)?;
        if m.children > 0 {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                format!(
                    "{} memory objects made inside this one are still alive",
                    m.children
                ),
            ));
        }
        if m.domain != domain {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                format!(
                    "memory of domain {} destroyed through a context of domain {domain}",
                    m.domain
                ),
            ));
        }
        let Some(m) = self.mems.remove(&key) else {
            return Err(err::PARAM_INVALID);
        };
        if let Some(c) = self.ctxs.get_mut(&m.ctx) {
            c.mems -= 1;
        }
        match m.parent {
            Some(p) => {
                if let Some(p) = self.mems.get_mut(&p) {
                    p.children -= 1;
                }
            }
            None => {
                self.fds.remove(&m.fd);
            }
        }
        Ok(())
    }

    pub(crate) fn mem_sync(&self, call: &str, ctx: u64, key: usize, mode: i32) -> Res<()> {
        self.ctx(call, ctx)?;
        let m = self.mem(call, key)?;
        if !(1..=3).contains(&mode) {
            return Err(fail(call, err::PARAM_INVALID, format!("mode {mode}")));
        }
        if !m.cacheable {
            return Err(fail(
                call,
                err::PARAM_INVALID,
                "sync of a non-cacheable memory object",
            ));
        }
        Ok(())
    }

    pub(crate) fn query_ok(&self, call: &str, ctx: u64) -> Res<()> {
        self.ctx(call, ctx).map(|_| ())
    }
}

impl Job {
    /// Compute C from A and B with the emulator's kernels.
    pub(crate) fn run(self, call: &str) -> Res<()> {
        let bad = |why: &str| fail(call, err::FAIL, why);
        let (m, k, n) = (self.m, self.k, self.n);
        let layout = TiledLayout::new(pack_dtype(self.types.1), k, n);
        let a = self
            .a
            .0
            .bytes(self.a.1, self.a.2)
            .ok_or_else(|| bad("A out of its memory"))?;
        let b = self
            .b
            .0
            .bytes(self.b.1, self.b.2)
            .ok_or_else(|| bad("B out of its memory"))?;
        let c = self
            .c
            .0
            .bytes_mut(self.c.1, self.c.2)
            .ok_or_else(|| bad("C out of its memory"))?;
        let kerr = |e: ork_device::DeviceError| fail(call, err::FAIL, e);
        match self.types.0 {
            ElemType::Int8 => {
                let a: Vec<i8> = a.iter().map(|&x| x as i8).collect();
                if self.mm_type == mm_type::INT8_MM_INT8_TO_FLOAT32 {
                    let mut out = vec![0f32; m * n];
                    match &self.quant {
                        Some(s) if self.group > 0 => {
                            kernels::grouped_acc(&layout, b, &a, m, self.group, s, &mut out)
                                .map_err(kerr)?
                        }
                        _ => {
                            let mut acc = vec![0i32; m * n];
                            kernels::int_acc(&layout, b, &a, m, &mut acc).map_err(kerr)?;
                            for (o, v) in out.iter_mut().zip(acc) {
                                *o = v as f32;
                            }
                        }
                    }
                    write(c, &out, f32::to_le_bytes);
                } else {
                    let mut acc = vec![0i32; m * n];
                    kernels::int_acc(&layout, b, &a, m, &mut acc).map_err(kerr)?;
                    write(c, &acc, i32::to_le_bytes);
                }
            }
            ElemType::Fp16 => {
                let a: Vec<f16> = a
                    .chunks_exact(2)
                    .map(|p| f16::from_le_bytes([p[0], p[1]]))
                    .collect();
                let mut out = vec![0f32; m * n];
                kernels::float_acc(&layout, b, &a, m, &mut out).map_err(kerr)?;
                write(c, &out, f32::to_le_bytes);
            }
            _ => return Err(bad("activation type not implemented")),
        }
        Ok(())
    }
}

fn write<T: Copy>(dst: &mut [u8], src: &[T], f: impl Fn(T) -> [u8; 4]) {
    for (d, &v) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&f(v));
    }
}
