//! ork-cpu's tests, one binary (one link step): the core choice on fake sysfs trees, bad input,
//! and the CPU engine's matmuls and models against the f32 reference (`ork_exec::CpuF32Linear`).

mod cpu {
    pub mod bad_input;
    pub mod experts;
    pub mod fixtures;
    pub mod llama_cpp;
    pub mod matmul;
    pub mod models;
    pub mod topology;
}
