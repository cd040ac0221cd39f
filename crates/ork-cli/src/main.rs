//! `ork`: the command-line front end. Thin over the library crates; all errors become one line
//! on stderr naming the file, tensor and problem, with the exit codes documented in `--help`.

#![forbid(unsafe_code)]

mod auto;
mod cli;
mod cmd_bench_cpu;
mod cmd_bench_pack;
mod cmd_bench_stream;
mod cmd_bench_tokenizer;
mod cmd_device;
mod cmd_engines;
mod cmd_model;
mod cmd_moe_project;
mod cmd_pack;
mod cmd_project;
mod cmd_serve;
mod cmd_spec;
mod cmd_spec_project;
mod cmd_split;
mod cpu_check;
mod input;
mod open_model;
mod plot;
mod progress;
mod rss;

use std::process::ExitCode;

use clap::Parser;

use cli::{BenchCommand, Cli, Command};

fn main() -> ExitCode {
    // A child started to render one chat template (ork_exec::chat_worker) does only that.
    if let Some(code) = ork_exec::chat_worker::worker_main() {
        return ExitCode::from(code);
    }
    // Every chat template renders in such a child, its memory and time bounded by the kernel;
    // /proc/self/exe is this program even after its file is replaced by an upgrade.
    ork_exec::chat_worker::isolate_renders("/proc/self/exe".into());
    // Before anything else: code built for CPU features this CPU lacks must not run.
    if let Err(code) = cpu_check::refuse_missing() {
        return code;
    }
    let cli = Cli::parse();
    // An `ORK_KERNEL` this CPU cannot run is refused before any work (docs/kernels.md).
    if let Err(e) = ork_device::kernel::Isa::from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // A closed stdout (`ork … | head -c1`) ends the run quietly, killed by SIGPIPE like other
    // Unix tools (docs/cli.md); the server keeps the default of Rust programs (EPIPE as an
    // error), so a client that goes away never kills it.
    if !matches!(cli.command, Command::Serve(_)) {
        ork_io::sigpipe::die_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Convert(a) => cmd_pack::convert(&a),
        Command::Inspect(a) => cmd_pack::inspect(&a),
        Command::Verify(a) => cmd_pack::verify(&a),
        Command::Probe(a) => cmd_device::probe(&a),
        Command::Bench(a) => bench(a.which),
        Command::Run(a) => cmd_model::run(&a),
        Command::Perplexity(a) => cmd_model::perplexity(&a),
        Command::Plan(a) => cmd_model::plan(&a),
        Command::Doctor(a) => cmd_device::doctor(&a),
        Command::Serve(a) => cmd_serve::serve(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => report(&e),
    }
}

/// `ork bench …`.
fn bench(which: BenchCommand) -> anyhow::Result<ExitCode> {
    match which {
        BenchCommand::Pack {
            model,
            threads,
            json,
        } => cmd_bench_pack::bench_pack(&model, threads, json),
        BenchCommand::Gemm { json } => cmd_device::bench_gemm(json),
        BenchCommand::Cpu {
            model,
            threads,
            cpus,
            prompt_tokens,
            gen_tokens,
            rounds,
            json,
        } => cmd_bench_cpu::bench_cpu(
            &ork_runtime::bench::CpuBenchOptions {
                model,
                threads,
                cpus: cpus.map(|c| c.0),
                prompt_tokens,
                gen_tokens,
                rounds,
            },
            json,
        ),
        BenchCommand::Tokenizer {
            model,
            file,
            rounds,
            json,
        } => cmd_bench_tokenizer::bench_tokenizer(&model, &file, rounds, json),
        BenchCommand::Stream {
            model,
            tokens,
            rounds,
            plot,
            decode,
            json,
        } => match decode {
            Some(decode) => cmd_bench_stream::bench_decode(&model, tokens, decode, rounds, json),
            None => cmd_bench_stream::bench_stream(&model, tokens, rounds, plot.as_deref(), json),
        },
        BenchCommand::Spec(a) => cmd_spec::bench_spec(&a),
    }
}

/// Print `e` on one line: the outermost context first, then the causes. Many library errors
/// already print their source inside their own message; a cause whose text the line already
/// holds is not repeated. Exit code 2.
fn report(e: &anyhow::Error) -> ExitCode {
    let mut msg = format!("error: {e}");
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(&format!(": {text}"));
        }
    }
    eprintln!("{msg}");
    ExitCode::from(2)
}
