//! `ork`'s first act (crates/ork-cli/src/cpu_check.rs, the same file), as a program of its own
//! so that scripts/test-aarch64.sh can build it with `-C target-feature=+dotprod` in a second
//! instead of rebuilding `ork`: on a CPU without dotprod it must name it and exit 2 (no SIGILL).
#[path = "../../crates/ork-cli/src/cpu_check.rs"]
mod cpu_check;

fn main() -> std::process::ExitCode {
    if let Err(code) = cpu_check::refuse_missing() {
        return code;
    }
    println!("this CPU has every feature the build assumes");
    std::process::ExitCode::SUCCESS
}
